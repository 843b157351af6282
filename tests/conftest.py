"""Session-wide test harness: the AWS emulator, an EKS token authenticator and a real
kube-apiserver + etcd. Per-test fixtures reset their state and isolate HOME, cwd and env."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.aws import AwsEmulator
from tests.harness.eks_authenticator import EksAuthenticator
from tests.harness.kube import KubeHarness
from tests.harness.kube_proxy import KubeProxy
from tests.harness.scenario import EKS_CLUSTER, Scenario

_KEEP_ENV = {
    "PATH",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "HPKV_HARNESS_DIR",
    "SYSTEMROOT",
}


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared beside the checkout (HPKV_SHARED_DIR overrides): upstream CRDs and chart values."""
    root = Path(
        os.environ.get("HPKV_SHARED_DIR") or Path(__file__).resolve().parents[1].parent / "shared"
    )
    if not (root / "upstream").is_dir():
        pytest.fail(f"{root}/upstream not found: set HPKV_SHARED_DIR to the shared/ folder")
    return root


@pytest.fixture(scope="session")
def aws_emulator() -> Iterator[AwsEmulator]:
    emulator = AwsEmulator().start()
    yield emulator
    emulator.stop()


@pytest.fixture(scope="session")
def eks_authenticator(aws_emulator: AwsEmulator) -> Iterator[EksAuthenticator]:
    authenticator = EksAuthenticator(aws_emulator.endpoint_url, cluster_name=EKS_CLUSTER).start()
    yield authenticator
    authenticator.stop()


@pytest.fixture(scope="session")
def kube_cluster(eks_authenticator: EksAuthenticator) -> Iterator[KubeHarness]:
    harness = KubeHarness.start(webhook_url=eks_authenticator.url)
    yield harness
    harness.stop()


@pytest.fixture
def aws(aws_emulator: AwsEmulator) -> Iterator[AwsEmulator]:
    aws_emulator.reset()
    yield aws_emulator
    aws_emulator.reset()


@pytest.fixture
def kube(kube_cluster: KubeHarness) -> Iterator[KubeHarness]:
    yield kube_cluster
    kube_cluster.reset()


@pytest.fixture
def isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A clean environment: no real AWS or kube config, cwd and HOME inside tmp_path."""
    home = tmp_path / "home"
    home.mkdir()
    for name in list(os.environ):
        if name not in _KEEP_ENV:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(home / ".aws" / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / ".aws" / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("HPKV_POLL_INTERVAL", "0.05")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def aws_env(aws: AwsEmulator, isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> AwsEmulator:
    for key, value in aws.env().items():
        monkeypatch.setenv(key, value)
    return aws


@pytest.fixture
def scenario(
    aws_env: AwsEmulator, kube: KubeHarness, isolated_env: Path, monkeypatch: pytest.MonkeyPatch
) -> Scenario:
    """A HyperPod cluster 'demo' on EKS 'hpkv-eks' (the test apiserver), and a kubeconfig for hpkv."""
    kubeconfig = kube.write_kubeconfig(isolated_env / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    return Scenario(aws=aws_env, kube=kube, workdir=isolated_env, kubeconfig=kubeconfig)


@pytest.fixture(scope="session")
def kube_proxy_server(kube_cluster: KubeHarness) -> Iterator[KubeProxy]:
    proxy = KubeProxy(kube_cluster).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def kube_proxy(kube_proxy_server: KubeProxy, scenario: Scenario) -> Iterator[KubeProxy]:
    """Route hpkv's Kubernetes traffic through the fault/latency proxy (EKS endpoint and kubeconfig)."""
    kube_proxy_server.clear()
    scenario.proxy = kube_proxy_server
    yield kube_proxy_server
    kube_proxy_server.clear()


@pytest.fixture(scope="session")
def curvine_chart_repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A Helm repository on 127.0.0.1 serving the stand-in Curvine charts (tests/fixtures/charts)."""
    from tests.harness.curvine import ChartRepo

    repo = ChartRepo.build(tmp_path_factory.mktemp("curvine-charts")).start()
    yield repo
    repo.stop()


@pytest.fixture
def curvine(
    scenario: Scenario,
    curvine_chart_repo: object,
    shared_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[object]:
    """Stage 3's world: GPU nodes, an endpoint, the chart repo, a stub master, played controllers."""
    from tests.harness.curvine import CurvineEnv

    env = CurvineEnv(scenario, curvine_chart_repo, shared_dir, monkeypatch)
    yield env
    env.stop()


@pytest.fixture
def runbook_world(
    scenario: Scenario,
    curvine_chart_repo: object,
    shared_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[object]:
    """Every stage's world for `hpkv up`/`hpkv down` (tests/harness/runbook.py); call
    fresh_cluster(world) for the HyperPod cluster 'demo' with nothing installed."""
    from tests.harness.runbook import RunbookWorld

    storage = tmp_path / "l2-storage"
    storage.mkdir()
    world = RunbookWorld(scenario, shared_dir, curvine_chart_repo, storage).start(monkeypatch)
    yield world
    world.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Counts from the runbook suites: faults injected, inputs tried, writes on second runs."""
    from tests.harness.runbook import COUNTS, summary_lines

    lines = summary_lines(COUNTS)
    if lines:
        terminalreporter.section("hpkv resilience")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture
def stack(
    scenario: Scenario,
    shared_dir: Path,
    curvine_chart_repo: object,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[object]:
    """Every stage installable by hpkv with its controllers played (tests/harness/stack.py):
    ``stack.install()`` runs the applies; ``install(["operator"])`` only some."""
    from tests.harness.stack import Stack

    built = Stack(scenario, shared_dir, curvine_chart_repo, tmp_path, monkeypatch)
    yield built
    built.stop()
