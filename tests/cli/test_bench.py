"""`hpkv bench run|compare|report` end to end.

In the cluster: the real kube-apiserver holds the InferenceEndpointConfig (real CRD), its pods and
routing Service; the test plays the Job controller and kubelet (the runner really runs, with the
system python, on the ConfigMap's files). From here: the same engine in-process. The worker pods
are fake vLLM + LMCache servers with injected costs, so the bench must recover known numbers.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpkv.bench import results, runner
from tests.harness.bench import (
    MEASURED_COSTS,
    SERVING_IMAGE,
    JobPlayer,
    PlayedEndpoint,
    assert_cross_pod_recovered,
    install_endpoint_crd,
    play_endpoint,
)
from tests.harness.fake_vllm import Costs, FakeCluster
from tests.harness.scenario import Scenario

pytestmark = [pytest.mark.kube]

SHARED = [
    "--prefixes",
    "2",
    "--prefix-tokens",
    "400",
    "--users",
    "6",
    "--suffix-tokens",
    "40",
    "--requests",
    "12",
]
TURNS = [
    "--sessions",
    "2",
    "--turns",
    "3",
    "--system-tokens",
    "200",
    "--first-turn-tokens",
    "100",
    "--turn-tokens",
    "30",
    "--answer-tokens",
    "6",
]


@pytest.fixture
def played(
    scenario: Scenario,
    shared_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> Iterator[PlayedEndpoint]:
    options = getattr(request, "param", {})
    install_endpoint_crd(scenario.kube, shared_dir)
    logs = scenario.workdir / "pod-logs"
    endpoint = play_endpoint(scenario.kube, shared_dir, logs, costs=MEASURED_COSTS, **options)
    monkeypatch.setenv("HPKV_INCLUSTER_ROUTES", json.dumps(endpoint.routes))
    monkeypatch.setenv("HPKV_POD_LOGS_DIR", str(logs))
    # hpkv polls the Job while the runner measures: keep that (and the API server) quiet.
    monkeypatch.setenv("HPKV_POLL_INTERVAL", "0.5")
    yield endpoint
    endpoint.cluster.stop()


def player(scenario: Scenario, endpoint: PlayedEndpoint, **kwargs: Any) -> JobPlayer:
    router = (
        f"{endpoint.name}-routing-service.{endpoint.namespace}.svc.cluster.local:443",
        f"127.0.0.1:{endpoint.cluster.router_port}",
    )
    return JobPlayer(scenario.kube, endpoint.log_dir, router=router, **kwargs)


def run_in_cluster(
    scenario: Scenario, endpoint: PlayedEndpoint, *args: str, **player_options: Any
) -> tuple[dict[str, Any], JobPlayer, dict[str, str]]:
    """`hpkv bench run --endpoint demo ARGS --yes -o json` with the Job controller and kubelet
    played; the result document and the player (what it saw)."""
    with player(scenario, endpoint, **player_options) as kubelet:
        result = scenario.hpkv(
            "bench",
            "run",
            "--endpoint",
            "demo",
            *args,
            "--yes",
            "-o",
            "json",
            "--results-dir",
            str(scenario.workdir / "out"),
        )
    assert not kubelet.errors, kubelet.errors
    assert result.exit_code == 0, result
    return load_result(result.stdout), kubelet, json.loads(result.stdout)["files"]


def from_here_with_endpoint(scenario: Scenario, *args: str) -> dict[str, Any]:
    """`hpkv bench run --endpoint demo --from-here ARGS -o json` (pods reached through the
    HPKV_INCLUSTER_ROUTES port-forward map); the result document."""
    out = str(scenario.workdir / "out")
    result = scenario.hpkv(
        "bench",
        "run",
        "--endpoint",
        "demo",
        "--from-here",
        *args,
        "-o",
        "json",
        "--results-dir",
        out,
    )
    assert result.exit_code == 0, result
    return load_result(result.stdout)


def load_result(stdout: str) -> dict[str, Any]:
    payload = json.loads(stdout)
    return results.load(payload["files"]["result"])


def gone(scenario: Scenario, kind: str, name: str, api_version: str = "v1") -> bool:
    return scenario.kube.get_object(api_version, kind, name, "default") is None


def truth_tiers(cluster: FakeCluster, doc: dict[str, Any]) -> tuple[float, float]:
    truth = cluster.truth_by_id()
    served = [truth[r["id"]] for r in doc["requests"]]
    prompt = sum(t.prompt_tokens for t in served)
    return sum(t.l0_hit for t in served) / prompt, sum(t.external_hit for t in served) / prompt


def test_in_cluster_cross_pod_recovers_the_injected_numbers_and_cleans_up(
    scenario: Scenario, played: PlayedEndpoint
) -> None:
    mark = scenario.mark()
    doc, kubelet, files = run_in_cluster(
        scenario, played, "-s", "cross-pod", "--lengths", "500,1000", "--repetitions", "3"
    )
    cross = results.scenario(doc, "cross-pod")
    assert cross is not None and cross["clients"] == 1
    assert_cross_pod_recovered(cross, played.cluster)
    ordered = sorted(played.pods)  # pod A first by name; pod B on another node
    assert [cross["parameters"]["podA"], cross["parameters"]["podB"]] == ordered

    env = doc["environment"]
    assert env["model"] == played.cluster.model and env["modelName"] == "Qwen2-7B-Instruct"
    assert (env["replicas"], env["readyReplicas"]) == (2, 2)
    assert env["instanceType"] == "ml.g6e.4xlarge"
    assert env["image"] == env["runnerImage"] == SERVING_IMAGE
    assert env["kvCache"]["remoteUrl"] == "fs://localhost:0/mnt/curvine/l2cache/"
    assert env["routingStrategy"] == "roundrobin"
    assert env["runnerPython"].startswith("3.")
    assert doc["inputs"]["location"] == "in-cluster"
    assert cross["metrics"]["source"] == "pod-proxy"
    pod_b = cross["metrics"]["pods"][ordered[1]]["delta"]
    truth = played.cluster.truth_by_id()
    assert pod_b["externalHits"] == sum(
        truth[r["id"]].external_hit for r in cross["requests"] if r["role"] != "seed"
    )

    # the Job and ConfigMap hpkv made: the endpoint's own image, the stdlib runner, pod IPs
    (job,) = kubelet.jobs
    spec = job.manifest["spec"]
    container = spec["template"]["spec"]["containers"][0]
    assert container["image"] == SERVING_IMAGE
    assert container["command"] == ["python3", "/opt/hpkv-bench/runner.py"]
    assert container["args"][-4:] == ["--scenario", "cross-pod", "--clients", "1"]
    assert (spec["completionMode"], spec["completions"], spec["backoffLimit"]) == ("Indexed", 1, 0)
    assert "resources" in container and "nvidia.com/gpu" not in container["resources"]["requests"]
    assert job.configmap["data"]["runner.py"] == Path(runner.__file__).read_text()
    run_spec = json.loads(job.configmap["data"]["spec.json"])
    urls = {pod: f"http://127.0.0.{i + 2}:{played.port}" for i, pod in enumerate(played.pods)}
    assert [p["url"] for p in run_spec["pods"]] == [urls[pod] for pod in ordered]
    assert run_spec["router"]["url"] == "http://demo-routing-service.default.svc.cluster.local:443"
    assert job.exit_codes == [0]

    name = job.manifest["metadata"]["name"]
    assert gone(scenario, "Job", name, "batch/v1")
    assert gone(scenario, "ConfigMap", job.configmap["metadata"]["name"])
    writes = [w.split(" -> ")[0] for w in scenario.writes_since(mark)]
    assert writes == [
        f"patch configmaps default/{job.configmap['metadata']['name']}",
        f"patch jobs default/{name}",
        f"patch configmaps default/{job.configmap['metadata']['name']}",
        f"delete jobs default/{name}",
        f"delete configmaps default/{job.configmap['metadata']['name']}",
    ], writes
    assert Path(files["report"]).read_text().count("| 500 |") == 1
    assert Path(files["chart:ttft-by-length"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_in_cluster_load_scenarios_with_two_client_pods(
    scenario: Scenario, played: PlayedEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.harness.bench import free_shared_port

    monkeypatch.setenv("HPKV_BENCH__BARRIER_PORT", str(free_shared_port(["127.0.0.1"])))
    args = ["-s", "shared-prefix,multi-turn", "--clients", "2", "--concurrency", "2"]
    doc, kubelet, _files = run_in_cluster(scenario, played, *args, *SHARED, *TURNS)
    assert [s["name"] for s in doc["scenarios"]] == ["shared-prefix", "multi-turn"]
    shared = results.scenario(doc, "shared-prefix")
    assert shared is not None and shared["clients"] == 2
    assert sorted(r["request"] for r in shared["requests"]) == list(range(12))
    assert {r["client"] for r in shared["requests"]} == {0, 1}
    assert {r["target"] for r in shared["requests"]} == {"demo-routing-service"}
    assert all(r["ok"] for r in shared["requests"])
    # per-tier hit rates from the pods' /metrics deltas are exactly what the servers did
    for name in ("shared-prefix", "multi-turn"):
        doc_s = results.scenario(doc, name)
        assert doc_s is not None
        l0, external = truth_tiers(played.cluster, doc_s)
        tiers = doc_s["summary"]["tiers"]
        assert tiers["l0"]["hitRate"] == l0
        assert tiers["external"]["hitRate"] == external
    turns = results.scenario(doc, "multi-turn")
    assert [t["turn"] for t in turns["summary"]["byTurn"]] == [1, 2, 3]
    assert {r["session"] for r in turns["requests"]} == {0, 1}

    assert len(kubelet.jobs) == 2
    for job in kubelet.jobs:
        spec = job.manifest["spec"]
        name = job.manifest["metadata"]["name"]
        assert (spec["completions"], spec["parallelism"]) == (2, 2)
        assert spec["template"]["spec"]["subdomain"] == name
        assert job.exit_codes == [0, 0]
        assert any(key.startswith(f"{name}-0.{name}.default.svc") for key in job.resolve)
        assert gone(scenario, "Service", name)
        assert gone(scenario, "Job", name, "batch/v1")


def test_runner_failure_is_one_line_and_everything_is_deleted(
    scenario: Scenario, played: PlayedEndpoint
) -> None:
    played.cluster.stop()  # the pods stop answering
    with player(scenario, played) as kubelet:
        result = scenario.hpkv(
            "bench", "run", "--endpoint", "demo", "--scenario", "cross-pod", "--yes"
        )
    assert result.exit_code == 1, result
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(
        f"hpkv: error: bench runner in pod {kubelet.jobs[0].pods[0]} failed: cannot read the served model from http://127.0.0.{2 + played.pods.index(min(played.pods))}:{played.port}/v1/models"
    ), lines
    assert "Fix:" in lines[-1]
    assert gone(scenario, "Job", kubelet.jobs[0].manifest["metadata"]["name"], "batch/v1")
    assert gone(scenario, "ConfigMap", kubelet.jobs[0].configmap["metadata"]["name"])


def test_an_image_that_cannot_be_pulled_fails_fast(
    scenario: Scenario, played: PlayedEndpoint
) -> None:
    with player(scenario, played, waiting_reason="ErrImagePull") as kubelet:
        result = scenario.hpkv(
            "bench",
            "run",
            "--endpoint",
            "demo",
            "-s",
            "cross-pod",
            "--yes",
            "--image",
            "registry.invalid/x:1",
        )
    assert result.exit_code == 1, result
    assert "cannot start: ErrImagePull" in result.stderr and "bench.image" in result.stderr
    (job,) = kubelet.jobs
    assert (
        job.manifest["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.invalid/x:1"
    )
    assert gone(scenario, "Job", job.manifest["metadata"]["name"], "batch/v1")


def test_a_late_failure_keeps_the_scenarios_already_measured(
    scenario: Scenario, played: PlayedEndpoint
) -> None:
    out = scenario.workdir / "out"
    with player(scenario, played, waiting_reason="ImagePullBackOff", waiting_for="shared-prefix"):
        result = scenario.hpkv(
            "bench",
            "run",
            "--endpoint",
            "demo",
            "-s",
            "cross-pod,shared-prefix",
            "--lengths",
            "300",
            "--repetitions",
            "1",
            "--yes",
            "--results-dir",
            str(out),
        )
    assert result.exit_code == 1, result
    (saved,) = out.glob("*/result.json")
    assert "cannot start: ImagePullBackOff" in result.stderr
    assert f"(the scenarios before it are in {saved})" in result.stderr
    doc = results.load(saved)
    assert [s["name"] for s in doc["scenarios"]] == ["cross-pod"]
    assert any(n.startswith("shared-prefix failed: runner pod") for n in doc["notes"])
    assert "cross-pod: pod A" in result.stdout  # the finished scenario was still shown


def test_in_cluster_run_needs_confirmation_and_dry_run_writes_nothing(
    scenario: Scenario, played: PlayedEndpoint
) -> None:
    mark = scenario.mark()
    refused = scenario.hpkv("bench", "run", "--endpoint", "demo")
    assert refused.exit_code == 2, refused
    assert "without confirmation" in refused.stderr and "--yes" in refused.stderr

    dry = scenario.hpkv("bench", "run", "--endpoint", "demo", "--clients", "3", "--dry-run")
    assert dry.exit_code == 0, dry
    assert "ConfigMap/default/hpkv-bench-" in dry.stdout
    assert len(set(re.findall(r"Job/default/(hpkv-bench-[\w-]+)", dry.stdout))) == 3
    assert "Service/default/hpkv-bench-" in dry.stdout  # the barrier for 3 client pods
    assert "nothing was created" in dry.stdout

    as_json = scenario.hpkv("bench", "run", "--endpoint", "demo", "--dry-run", "-o", "json")
    payload = json.loads(as_json.stdout)
    assert payload["dryRun"] is True and len(payload["spec"]["pods"]) == 2
    assert scenario.writes_since(mark) == []
    assert played.cluster.truth() == []  # and no request was sent


def test_from_here_through_port_forwards_writes_nothing_in_the_cluster(
    scenario: Scenario, played: PlayedEndpoint
) -> None:
    mark = scenario.mark()
    doc = from_here_with_endpoint(scenario, "--lengths", "500,1000", *SHARED, *TURNS)
    assert scenario.writes_since(mark) == []
    assert doc["inputs"]["location"] == "from-here"
    assert doc["inputs"]["urls"]["router"] == played.cluster.router_url
    cross = results.scenario(doc, "cross-pod")
    assert cross is not None
    assert_cross_pod_recovered(cross, played.cluster)
    for doc_s in doc["scenarios"]:
        assert doc_s["metrics"]["source"] == "pod-proxy"
        l0, external = truth_tiers(played.cluster, doc_s)
        if doc_s["name"] != "cross-pod":  # cross-pod's tiers also count pod A's seed requests
            assert doc_s["summary"]["tiers"]["l0"]["hitRate"] == l0
            assert doc_s["summary"]["tiers"]["external"]["hitRate"] == external
    assert doc["environment"]["readyReplicas"] == 2


@pytest.mark.parametrize("played", [{"retrieve_histogram": False}], indirect=True)
def test_l2_read_time_falls_back_to_lmcache_log_lines(
    scenario: Scenario, played: PlayedEndpoint
) -> None:
    doc = from_here_with_endpoint(
        scenario, "-s", "cross-pod", "--lengths", "600", "--repetitions", "2"
    )
    cross = results.scenario(doc, "cross-pod")
    assert cross is not None
    truth = played.cluster.truth_by_id()
    warm = [r for r in cross["requests"] if r["role"] == "warm"]
    assert {r["l2ReadSource"] for r in warm} == {"log"}
    for record in warm:
        assert abs(record["l2ReadMs"] - truth[record["id"]].retrieve_ms) < 1e-3
        assert record["hitTokens"] == truth[record["id"]].external_hit
    assert any("LMCache log" in note for note in cross["notes"])


def test_cross_pod_needs_two_ready_pods(
    scenario: Scenario, shared_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_endpoint_crd(scenario.kube, shared_dir)
    endpoint = play_endpoint(scenario.kube, shared_dir, scenario.workdir / "logs", ready=1)
    try:
        result = scenario.hpkv("bench", "run", "--endpoint", "demo", "--yes")
    finally:
        endpoint.cluster.stop()
    assert result.exit_code == 1
    assert (
        f"cross-pod needs 2 ready worker pods; endpoint default/demo has 1 ({endpoint.pods[1]} not ready)"
        in result.stderr
    )
    missing = scenario.hpkv("bench", "run", "--endpoint", "nope", "--yes")
    assert missing.exit_code == 1
    assert "no InferenceEndpointConfig named 'nope' (endpoints: default/demo)" in missing.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "no endpoint given"),
        (["--from-here"], "--from-here needs a target"),
        (
            ["--from-here", "--url", "http://x:1", "--clients", "2"],
            "does not apply with --from-here",
        ),
        (["--endpoint", "x", "--scenario", "warm-cache"], "unknown scenario 'warm-cache'"),
        (["--endpoint", "x", "--lengths", "5OO"], "--lengths takes integers"),
        (["--endpoint", "x", "--via", "lb"], "--via must be router or pods"),
        (
            ["--endpoint", "x", "--url", "http://x:1"],
            "--url and --pod-url are for --from-here runs",
        ),
        (["--from-here", "--pod-url", "localhost:8000"], "'localhost:8000' is not an http(s) URL"),
        (
            ["--endpoint", "x", "--requests", "2", "--prefixes", "4"],
            "--requests 2 is less than --prefixes 4",
        ),
        (["--endpoint", "x", "--repetitions", "0"], "--repetitions must be at least 1"),
        (
            # The routing service speaks plain HTTP on 443: refused before anything runs.
            ["--from-here", "--url", "https://llama-routing-service.team-a:443/v1"],
            "calls the routing service with https://, but it speaks plain HTTP on port 443 "
            "(requests fail with 'SSL: WRONG_VERSION_NUMBER'). Fix: use "
            "http://llama-routing-service.team-a:443/v1",
        ),
    ],
)
def test_usage_errors_are_one_line_exit_2(
    isolated_env: Path, args: list[str], message: str
) -> None:
    from tests.harness.cli import run_hpkv

    result = run_hpkv(["bench", "run", *args])
    assert result.exit_code == 2, result
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Fix:" in lines[0], lines


def _from_here(cluster: FakeCluster, out: Path, *extra: str) -> dict[str, Any]:
    from tests.harness.cli import run_hpkv

    result = run_hpkv(
        [
            "bench",
            "run",
            "--from-here",
            "--url",
            cluster.router_url,
            "--pod-url",
            f"a={cluster.pod(0).url}",
            "--pod-url",
            f"b={cluster.pod(1).url}",
            "--results-dir",
            str(out),
            "-o",
            "json",
            "--seed",
            "3",
            "--settle-timeout",
            "1s",
            *extra,
        ]
    )
    assert result.exit_code == 0, result
    return json.loads(result.stdout)


def test_compare_shows_what_the_l2_changed_with_confidence_intervals(isolated_env: Path) -> None:
    from tests.harness.cli import run_hpkv

    args = ["-s", "cross-pod,shared-prefix", "--lengths", "400,800", "--repetitions", "4", *SHARED]
    args += ["--concurrency", "1"]  # each prefix meets the other pod cold: an L2 hit there
    with FakeCluster(pods=2, costs=MEASURED_COSTS, l2_enabled=False) as baseline:
        before = _from_here(baseline, isolated_env / "out", *args)
    with FakeCluster(pods=2, costs=MEASURED_COSTS) as tiered:
        after = _from_here(tiered, isolated_env / "out", *args)
    a, b = before["files"]["result"], after["files"]["result"]
    base_doc = results.load(a)
    assert any("no L2 writes" in n for n in results.scenario(base_doc, "cross-pod")["notes"])

    table = run_hpkv(["bench", "compare", a, b])
    assert table.exit_code == 0, table
    assert "warm TTFT p50" in table.stdout and "95% CI" in table.stdout and "better" in table.stdout

    data = run_hpkv(["bench", "compare", a, b, "-o", "json"])
    comparison = json.loads(data.stdout)
    rows = {(r["scenario"], r["metric"]): r for r in comparison["rows"]}
    warm = rows[("cross-pod 800", "warm TTFT p50")]
    assert warm["delta"] < 0 and warm["ci"][1] < 0 and warm["verdict"] == "better"
    cold = rows[("cross-pod 800", "cold TTFT p50")]
    assert abs(cold["delta"]) < 0.2 * cold["a"]  # the cold path did not change
    hit = rows[("cross-pod 800", "hit rate")]
    assert hit["a"] == 0 and hit["b"] > 0.99
    speedup = rows[("cross-pod 800", "speedup (cold/warm p50)")]
    assert speedup["b"] > speedup["a"] and speedup["ci"][0] > 0
    assert (
        rows[("shared-prefix", "L1+L2 hit rate")]["b"]
        > rows[("shared-prefix", "L1+L2 hit rate")]["a"]
    )
    again = json.loads(run_hpkv(["bench", "compare", a, b, "-o", "json"]).stdout)
    assert again["rows"] == comparison["rows"]  # seeded bootstrap: the same intervals

    bad = isolated_env / "bad.json"
    bad.write_text('{"kind": "Something"}')
    rejected = run_hpkv(["bench", "compare", a, str(bad)])
    assert rejected.exit_code == 2
    assert "is not an hpkv bench result" in rejected.stderr


def test_report_rerenders_a_saved_result(isolated_env: Path) -> None:
    from tests.harness.cli import run_hpkv

    with FakeCluster(pods=2, costs=Costs()) as cluster:
        run = _from_here(
            cluster, isolated_env / "out", "--lengths", "300", "--repetitions", "1", *SHARED, *TURNS
        )
    result_file = run["files"]["result"]
    out = isolated_env / "again"
    rendered = run_hpkv(["bench", "report", result_file, "--results-dir", str(out), "-o", "json"])
    assert rendered.exit_code == 0, rendered
    files = json.loads(rendered.stdout)["files"]
    assert sorted(files) == [
        "chart:tier-hit-rates",
        "chart:ttft-by-length",
        "chart:ttft-cdf",
        "report",
    ]
    text = (out / "report.md").read_text()
    for heading in (
        "## Cross-pod L2 reuse",
        "## Shared-prefix load",
        "## Multi-turn",
        "## Per-tier hit rates",
    ):
        assert heading in text
    assert "(ttft-by-length.png)" in text


def test_help_stays_light() -> None:
    code = (
        "import sys; from typer.testing import CliRunner; from hpkv.cli.main import app; "
        "r = CliRunner().invoke(app, ['bench', 'run', '--help']); assert r.exit_code == 0, r.output; "
        "heavy = [m for m in ('matplotlib', 'numpy', 'kubernetes', 'boto3', 'jsonschema') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
