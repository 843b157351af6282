"""`hpkv init`: discovery through the AWS emulator and the real apiserver, the commented
hpkv.yaml it writes, what it asks (only on a terminal) and when it refuses."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from hpkv.config import load_settings
from tests.harness.cli import run_on_tty
from tests.harness.inference import create_alb_policy
from tests.harness.scenario import Scenario

pytestmark = [pytest.mark.kube, pytest.mark.aws]

REPO = Path(__file__).resolve().parents[2]


def _gpu_cluster(scenario: Scenario, **kwargs: object) -> None:
    scenario.hyperpod(node_recovery="Automatic", **kwargs)  # 2 x ml.g6e.4xlarge
    scenario.nodes(2)


def _key_lines_have_comments(text: str) -> None:
    """Every key line is directly preceded by a comment saying what it is."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        assert i > 0 and lines[i - 1].strip().startswith("#"), f"no comment above {line!r}"


def test_init_discovers_everything_and_writes_a_commented_file(scenario: Scenario) -> None:
    _gpu_cluster(scenario)
    mark = scenario.mark()
    result = scenario.hpkv("init", "--yes")
    assert result.exit_code == 0, result
    assert scenario.writes_since(mark) == []  # discovery only reads
    path = scenario.workdir / "hpkv.yaml"
    text = path.read_text()
    data = yaml.safe_load(text)
    assert data == {
        "cluster": "demo",
        "region": "us-west-2",
        "context": "hpkv-test",
        "tieredStorage": {"memoryPercent": 20},
        "sizing": {"instanceType": "ml.g6e.4xlarge", "replicas": 2},
    }
    _key_lines_have_comments(text)
    assert "Caller: arn:aws:sts::123456789012:user/moto." in text  # what STS reported
    assert "Found: InService, EKS cluster hpkv-eks (Kubernetes 1.33), 2 x ml.g6e.4xlarge" in text
    assert "# profile: default" in text and "# timeout: 30m" in text  # documented, not set
    assert "HPKV_TIERED_STORAGE__MEMORY_PERCENT" in text
    settings = load_settings(config_path=str(path), environ={})
    assert settings.cluster == "demo" and settings.context == "hpkv-test"
    assert "wrote hpkv.yaml: cluster demo in us-west-2, 2 x ml.g6e.4xlarge" in result.stdout
    # the file it wrote drives the next command
    create_alb_policy(scenario.aws)  # the one prerequisite 'hpkv up' cannot create
    plan = scenario.hpkv("up", "--dry-run")
    assert plan.exit_code == 0, plan
    assert "sagemaker cluster/demo" in plan.stdout


def test_init_without_a_terminal_takes_defaults_when_nothing_is_missing(
    scenario: Scenario,
) -> None:
    _gpu_cluster(scenario)
    result = scenario.hpkv("init")
    assert result.exit_code == 0, result
    assert yaml.safe_load((scenario.workdir / "hpkv.yaml").read_text())["cluster"] == "demo"


def test_init_keeps_what_the_cluster_already_has(scenario: Scenario) -> None:
    _gpu_cluster(
        scenario, tiered_storage={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 30}
    )
    assert scenario.hpkv("init", "--yes").exit_code == 0
    text = (scenario.workdir / "hpkv.yaml").read_text()
    assert yaml.safe_load(text)["tieredStorage"] == {"memoryPercent": 30}
    assert "(found on the cluster)" in text


def test_init_uses_eks_token_auth_when_no_context_matches(scenario: Scenario) -> None:
    _gpu_cluster(scenario)
    other = scenario.workdir / "other-kubeconfig"
    other.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "x", "cluster": {"server": "https://10.9.9.9:443"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "elsewhere", "context": {"cluster": "x", "user": "u"}}],
                "current-context": "elsewhere",
            }
        )
    )
    result = scenario.hpkv("init", "--yes", env={"KUBECONFIG": str(other)})
    assert result.exit_code == 0, result
    text = (scenario.workdir / "hpkv.yaml").read_text()
    assert "context" not in yaml.safe_load(text)
    assert "Found: EKS token from your AWS credentials" in text
    assert "no kubeconfig context points at EKS cluster hpkv-eks" in result.stderr


def test_init_follows_pagination_and_lists_every_cluster(scenario: Scenario) -> None:
    _gpu_cluster(scenario)
    for name in ("alpha", "beta", "gamma", "delta"):
        scenario.sagemaker.seed_cluster(name)
    scenario.sagemaker.page_size = 2
    refused = scenario.hpkv("init", "--yes")
    assert refused.exit_code == 2
    assert "5 HyperPod clusters in us-west-2 (demo, alpha, beta, gamma, delta)" in refused.stderr
    chosen = scenario.hpkv("init", "--yes", "--cluster", "demo", "-o", "json")
    assert chosen.exit_code == 0, chosen
    payload = json.loads(chosen.stdout)
    assert payload["clusters"] == ["demo", "alpha", "beta", "gamma", "delta"]
    assert payload["discovered"]["nodeTypes"] == {"ml.g6e.4xlarge": 2}
    assert payload["discovered"]["kubernetesGpuNodes"] == 2
    text = (scenario.workdir / "hpkv.yaml").read_text()
    assert "# Other HyperPod clusters in us-west-2: alpha, beta, gamma, delta." in text
    node_calls = [c for c in scenario.aws.calls if c.action == "ListClusterNodes"]
    assert len(node_calls) == 1  # 2 nodes fit one page of 2


def test_init_refuses_to_overwrite_without_force(scenario: Scenario) -> None:
    _gpu_cluster(scenario)
    (scenario.workdir / "hpkv.yaml").write_text("cluster: old\n")
    refused = scenario.hpkv("init", "--yes")
    assert refused.exit_code == 2
    assert "hpkv.yaml already exists. Fix: pass --force" in refused.stderr
    assert (scenario.workdir / "hpkv.yaml").read_text() == "cluster: old\n"
    forced = scenario.hpkv("init", "--yes", "--force")
    assert forced.exit_code == 0, forced
    assert yaml.safe_load((scenario.workdir / "hpkv.yaml").read_text())["cluster"] == "demo"


def test_init_ignores_a_broken_existing_file_when_forced(scenario: Scenario) -> None:
    _gpu_cluster(scenario)
    (scenario.workdir / "hpkv.yaml").write_text("cluster: [unclosed\n")
    result = scenario.hpkv("init", "--yes", "--force")
    assert result.exit_code == 0, result


def test_init_dry_run_prints_the_file(scenario: Scenario) -> None:
    _gpu_cluster(scenario)
    result = scenario.hpkv("init", "--dry-run", "--config", "custom.yaml")
    assert result.exit_code == 0, result
    assert yaml.safe_load(result.stdout)["cluster"] == "demo"
    assert "dry run: custom.yaml was not written" in result.stderr
    assert not (scenario.workdir / "custom.yaml").exists()


def test_init_writes_where_config_points(scenario: Scenario) -> None:
    _gpu_cluster(scenario)
    result = scenario.hpkv("init", "--yes", "--config", "conf/hpkv.yaml")
    assert result.exit_code == 0, result
    assert (scenario.workdir / "conf" / "hpkv.yaml").is_file()


def _run_init_on_tty(
    args: list[str], answers: list[tuple[bytes, bytes]], env: dict[str, str]
) -> tuple[int, str]:
    return run_on_tty(["init", *args], answers, env)


def test_init_on_a_terminal_asks_only_what_it_cannot_discover(scenario: Scenario) -> None:
    _gpu_cluster(scenario)
    scenario.sagemaker.seed_cluster("other")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("AWS_REGION")
    env.pop("AWS_DEFAULT_REGION")
    code, output = _run_init_on_tty(
        [],
        [
            (b"AWS region of the HyperPod cluster", b"us-west-2"),
            (b"HyperPod cluster", b"demo"),
            (b"Share of instance memory for the L1 CPU tier", b"10"),  # invalid: asked again
            (b"valid range 20..100", b"35"),
        ],
        env,
    )
    assert code == 0, output
    data = yaml.safe_load((scenario.workdir / "hpkv.yaml").read_text())
    assert data["region"] == "us-west-2" and data["cluster"] == "demo"
    assert data["tieredStorage"] == {"memoryPercent": 35}
    assert "NodeRecovery" not in output  # nothing asked that the cluster answered


def test_init_on_a_terminal_confirms_overwriting(scenario: Scenario) -> None:
    _gpu_cluster(scenario)
    (scenario.workdir / "hpkv.yaml").write_text("cluster: old\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code, output = _run_init_on_tty(
        [], [(b"Share of instance memory", b""), (b"overwrite it?", b"n")], env
    )
    assert code == 1, output
    assert "kept hpkv.yaml; nothing was written" in output
    assert (scenario.workdir / "hpkv.yaml").read_text() == "cluster: old\n"
