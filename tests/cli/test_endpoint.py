"""`hpkv endpoint deploy|status|list|delete` against the real kube-apiserver with the upstream
InferenceEndpointConfig CRD applied, so the apiserver's own schema validation judges every object."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.harness.inference import install_inference_crds, play_endpoint
from tests.harness.play import ensure_namespace
from tests.harness.scenario import Scenario

pytestmark = [pytest.mark.kube, pytest.mark.aws]

API = "inference.sagemaker.aws.amazon.com/v1"
KIND = "InferenceEndpointConfig"


@pytest.fixture
def cluster(scenario: Scenario, shared_dir: Path) -> Scenario:
    scenario.hyperpod()
    install_inference_crds(scenario.kube, shared_dir)
    return scenario


def _live(scenario: Scenario, name: str, namespace: str = "default") -> dict | None:
    return scenario.kube.get_object(API, KIND, name, namespace)


def _env(obj: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in obj["spec"]["worker"]["environmentVariables"]}


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def _no_api_calls(scenario: Scenario, mark: tuple[int, int]) -> None:
    aws_mark, kube_mark = mark
    assert scenario.aws.calls_since(aws_mark) == []
    assert scenario.kube.audit_since(kube_mark) == []


def test_deploy_creates_an_object_the_apiserver_accepts(cluster: Scenario) -> None:
    mark = cluster.mark()
    result = cluster.hpkv("endpoint", "deploy", "qwen", "--cluster", "demo", "--yes")
    assert result.exit_code == 0, result
    assert "applied 1 change(s)" in result.stdout
    writes = cluster.writes_since(mark)
    assert writes == ["patch inferenceendpointconfigs default/qwen -> 201"], writes

    live = _live(cluster, "qwen")
    assert live is not None
    spec = live["spec"]
    assert spec["modelName"] == "Qwen2-7B-Instruct"
    assert spec["modelSourceConfig"] == {
        "modelSourceType": "huggingface",
        "huggingFaceModel": {"modelId": "Qwen/Qwen2-7B-Instruct"},
        "prefetchEnabled": False,
    }
    assert spec["instanceType"] == "ml.g6e.4xlarge"
    assert spec["replicas"] == 2
    assert spec["kvCacheSpec"] == {
        "enableL1Cache": True,
        "enableL2Cache": True,
        "l2CacheSpec": {"l2CacheBackend": "tieredstorage"},
    }
    assert spec["intelligentRoutingSpec"]["enabled"] is True
    assert spec["intelligentRoutingSpec"]["routingStrategy"] == "prefixaware"
    assert _env(live) == {"PYTHONHASHSEED": "0", "LMCACHE_REMOTE_SERDE": "naive"}
    assert (
        spec["metrics"]["modelMetrics"]["port"]
        == spec["worker"]["modelInvocationPort"]["containerPort"]
    )
    # Defaults filled in by the apiserver from the CRD's schema: the real schema judged it.
    assert spec["metrics"]["metricsScrapeIntervalSeconds"] == 15
    assert spec["maxDeployTimeInSeconds"] == 3600

    mark = cluster.mark()
    again = cluster.hpkv("endpoint", "deploy", "qwen", "--cluster", "demo", "--yes")
    assert again.exit_code == 0, again
    assert "endpoint: nothing to do" in again.stdout
    assert cluster.writes_since(mark) == []


@pytest.mark.parametrize(
    ("args", "check"),
    [
        (
            ["--model-source", "s3://models-bucket/llama/8b", "--model-name", "llama-8b"],
            lambda s: (
                s["modelSourceConfig"]
                == {
                    "modelSourceType": "s3",
                    "s3Storage": {"bucketName": "models-bucket", "region": "us-west-2"},
                    "modelLocation": "llama/8b",
                    "prefetchEnabled": False,
                }
                and s["modelName"] == "llama-8b"
            ),
        ),
        (
            ["--model-source", "fsx://fs-0123456789abcdef0/models/qwen2.5-7b"],
            lambda s: (
                s["modelSourceConfig"]["fsxStorage"] == {"fileSystemId": "fs-0123456789abcdef0"}
                and s["modelSourceConfig"]["modelLocation"] == "models/qwen2.5-7b"
                and s["modelName"] == "qwen2-5-7b"
            ),
        ),
        (
            ["--routing-strategy", "kvaware", "--invocation-endpoint", "/completions"],
            lambda s: (
                s["intelligentRoutingSpec"]["routingStrategy"] == "kvaware"
                and s["invocationEndpoint"] == "/completions"
            ),
        ),
        (
            ["--routing-strategy", "kvaware"],
            lambda s: s["invocationEndpoint"] == "v1/completions",
        ),
        (
            ["--no-routing", "--no-l2", "--replicas", "3", "--instance-type", "ml.g5.12xlarge"],
            lambda s: (
                "intelligentRoutingSpec" not in s
                and s["kvCacheSpec"] == {"enableL1Cache": True, "enableL2Cache": False}
                and s["replicas"] == 3
                and s["instanceType"] == "ml.g5.12xlarge"
            ),
        ),
        (
            ["--max-model-len", "4096", "--routing-strategy", "session"],
            lambda s: (
                s["worker"]["args"][s["worker"]["args"].index("--max-model-len") + 1] == "4096"
                and s["intelligentRoutingSpec"]["routingStrategy"] == "session"
            ),
        ),
        (
            ["--model-source", "hf://meta-llama/Llama-3.1-8B-Instruct", "--hf-token-secret", "hf"],
            lambda s: (
                s["modelSourceConfig"]["huggingFaceModel"]
                == {
                    "modelId": "meta-llama/Llama-3.1-8B-Instruct",
                    "tokenSecretRef": {"name": "hf", "key": "token"},
                }
                and s["modelName"] == "Llama-3-1-8B-Instruct"
                and "--served-model-name" in s["worker"]["args"]
            ),
        ),
    ],
)
def test_deploy_options_are_accepted_by_the_crd(cluster: Scenario, args: list[str], check) -> None:
    result = cluster.hpkv("endpoint", "deploy", "ep", "--cluster", "demo", "--yes", *args)
    assert result.exit_code == 0, result
    live = _live(cluster, "ep")
    assert check(live["spec"]), live["spec"]
    assert _env(live) == {"PYTHONHASHSEED": "0", "LMCACHE_REMOTE_SERDE": "naive"}


def test_custom_template_keeps_required_env(cluster: Scenario) -> None:
    template = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "manifests" / "inference-endpoint.yaml").read_text()
    )
    template["spec"]["worker"]["environmentVariables"] = [
        {"name": "PYTHONHASHSEED", "value": "123"},
        {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
    ]
    path = cluster.workdir / "mine.yaml"
    path.write_text(yaml.safe_dump(template))
    result = cluster.hpkv(
        "endpoint", "deploy", "mine", "--template", str(path), "--cluster", "demo", "--yes"
    )
    assert result.exit_code == 0, result
    assert _env(_live(cluster, "mine")) == {
        "VLLM_LOGGING_LEVEL": "DEBUG",
        "PYTHONHASHSEED": "0",
        "LMCACHE_REMOTE_SERDE": "naive",
    }


def test_apiserver_rejection_is_one_line(cluster: Scenario) -> None:
    template = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "manifests" / "inference-endpoint.yaml").read_text()
    )
    template["spec"]["worker"]["modelInvocationPort"]["name"] = "tcp"  # CRD: ^http$|^grpc$
    path = cluster.workdir / "bad.yaml"
    path.write_text(yaml.safe_dump(template))
    result = cluster.hpkv(
        "endpoint", "deploy", "bad", "--template", str(path), "--cluster", "demo", "--yes"
    )
    assert result.exit_code == 1, result
    line = _one_line(result.stderr.splitlines()[-1])
    assert "the API server rejected" in line and "spec.worker.modelInvocationPort.name" in line
    assert _live(cluster, "bad") is None


def test_dry_run_with_a_cluster_is_validated_server_side(cluster: Scenario) -> None:
    result = cluster.hpkv(
        "endpoint", "deploy", "qwen", "--cluster", "demo", "--dry-run", "-o", "yaml"
    )
    assert result.exit_code == 0, result
    assert "server-side dry run" in result.stderr
    obj = yaml.safe_load(result.stdout)
    assert obj["kind"] == KIND
    assert obj["spec"]["metrics"]["metricsScrapeIntervalSeconds"] == 15  # defaulted by the server
    assert "managedFields" not in obj["metadata"]
    assert _live(cluster, "qwen") is None

    bad_template = cluster.workdir / "bad.yaml"
    template = yaml.safe_load(result.stdout)
    template["metadata"] = {"name": "x"}
    template["spec"]["worker"]["modelInvocationPort"]["containerPort"] = 70000
    bad_template.write_text(yaml.safe_dump(template))
    rejected = cluster.hpkv(
        "endpoint", "deploy", "x", "--template", str(bad_template), "--cluster", "demo", "--dry-run"
    )
    assert rejected.exit_code == 1, rejected
    assert "containerPort" in rejected.stderr


def test_dry_run_without_cluster_or_credentials_renders_locally(isolated_env: Path) -> None:
    from tests.harness.cli import run_hpkv

    result = run_hpkv(["endpoint", "deploy", "qwen", "--dry-run", "-o", "yaml"])
    assert result.exit_code == 0, result
    assert "rendered locally" in result.stderr
    obj = yaml.safe_load(result.stdout)
    assert obj["metadata"] == {
        "name": "qwen",
        "namespace": "default",
        "labels": {"app.kubernetes.io/managed-by": "hpkv"},
    }
    assert _env(obj) == {"PYTHONHASHSEED": "0", "LMCACHE_REMOTE_SERDE": "naive"}

    as_json = run_hpkv(["endpoint", "deploy", "qwen", "-n", "team-a", "--dry-run", "-o", "json"])
    assert as_json.exit_code == 0, as_json
    assert json.loads(as_json.stdout)["metadata"]["namespace"] == "team-a"


def test_dry_run_with_s3_source_needs_a_region_without_credentials(isolated_env: Path) -> None:
    from tests.harness.cli import run_hpkv

    missing = run_hpkv(["endpoint", "deploy", "q", "--model-source", "s3://b/m", "--dry-run"])
    assert missing.exit_code == 2, missing
    assert "region is unknown" in _one_line(missing.stderr)
    given = run_hpkv(
        ["endpoint", "deploy", "q", "--model-source", "s3://b/m?region=eu-west-1", "--dry-run"]
    )
    assert given.exit_code == 0, given
    assert yaml.safe_load(given.stdout)["spec"]["modelSourceConfig"]["s3Storage"] == {
        "bucketName": "b",
        "region": "eu-west-1",
    }


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (
            ["--routing-strategy", "kvaware", "--invocation-endpoint", "v1/chat/completions"],
            "--routing-strategy kvaware needs the completions invocation endpoint",
            2,
        ),
        (["--name-too-long"], "the operator allows at most 63", 2),
        (["--model-source", "gs://bucket/model"], "unknown kind of source", 2),
        (["--model-source", "hf://just-a-name"], "is not ORG/MODEL", 2),
        (["--model-source", "fsx://not-an-id/path"], "give a file system ID", 2),
        (["--instance-type", "g6e.4xlarge"], "is not a SageMaker instance type", 2),
        (["--routing-strategy", "session", "--no-routing"], "contradict each other", 2),
        (["--replicas", "0"], "--replicas", 2),
        (["--routing-strategy", "fastest"], "--routing-strategy", 2),
    ],
)
def test_invalid_combinations_are_refused_before_any_api_call(
    cluster: Scenario, args: list[str], message: str, code: int
) -> None:
    name = "ep"
    if args == ["--name-too-long"]:
        name, args = "a" * 64, []
    mark = cluster.mark()
    result = cluster.hpkv("endpoint", "deploy", name, "--cluster", "demo", "--yes", *args)
    assert result.exit_code == code, result
    line = _one_line(result.stderr)
    assert message in line and "Fix:" in line
    assert result.stdout == ""
    _no_api_calls(cluster, mark)


def test_routing_cannot_be_added_to_an_existing_endpoint(cluster: Scenario) -> None:
    first = cluster.hpkv(
        "endpoint", "deploy", "plain", "--no-routing", "--cluster", "demo", "--yes"
    )
    assert first.exit_code == 0, first
    mark = cluster.mark()
    result = cluster.hpkv("endpoint", "deploy", "plain", "--cluster", "demo", "--yes")
    assert result.exit_code == 1, result
    line = _one_line(result.stderr)
    assert "exists without intelligent routing" in line and "new name" in line
    assert cluster.writes_since(mark) == []
    dry = cluster.hpkv("endpoint", "deploy", "plain", "--cluster", "demo", "--dry-run")
    assert dry.exit_code == 1 and "exists without intelligent routing" in dry.stderr

    routed = cluster.hpkv("endpoint", "deploy", "routed", "--cluster", "demo", "--yes")
    assert routed.exit_code == 0, routed
    off = cluster.hpkv("endpoint", "deploy", "routed", "--no-routing", "--cluster", "demo", "--yes")
    assert off.exit_code == 1, off
    assert "does not allow turning it off" in _one_line(off.stderr)


def test_update_of_an_existing_endpoint_shows_the_diff(cluster: Scenario) -> None:
    assert cluster.hpkv("endpoint", "deploy", "qwen", "--cluster", "demo", "--yes").exit_code == 0
    result = cluster.hpkv(
        "endpoint", "deploy", "qwen", "--replicas", "4", "--cluster", "demo", "--yes"
    )
    assert result.exit_code == 0, result
    assert "-  replicas: 2" in result.stdout and "+  replicas: 4" in result.stdout
    assert _live(cluster, "qwen")["spec"]["replicas"] == 4


def test_deploy_into_a_missing_namespace_or_without_the_operator(
    scenario: Scenario, shared_dir: Path
) -> None:
    scenario.hyperpod()
    no_crd = scenario.hpkv("endpoint", "deploy", "qwen", "--cluster", "demo", "--yes")
    assert no_crd.exit_code == 1, no_crd
    assert "run 'hpkv operator apply'" in _one_line(no_crd.stderr)

    install_inference_crds(scenario.kube, shared_dir)
    no_ns = scenario.hpkv("endpoint", "deploy", "qwen", "-n", "nope", "--cluster", "demo", "--yes")
    assert no_ns.exit_code == 1, no_ns
    assert "namespace nope does not exist" in _one_line(no_ns.stderr)


def test_status_shows_state_pods_routing_and_load_balancer(cluster: Scenario) -> None:
    ensure_namespace(cluster.kube, "team-a")
    deployed = cluster.hpkv(
        "endpoint", "deploy", "qwen", "-n", "team-a", "--cluster", "demo", "--yes"
    )
    assert deployed.exit_code == 0, deployed
    pending = cluster.hpkv("endpoint", "status", "qwen", "-n", "team-a", "--cluster", "demo")
    assert pending.exit_code == 1, pending  # WARNING: no status yet
    assert "no status yet" in pending.stdout

    play_endpoint(cluster.kube, "qwen", "team-a")
    result = cluster.hpkv(
        "endpoint", "status", "qwen", "-n", "team-a", "--cluster", "demo", "-o", "json"
    )
    assert result.exit_code == 0, result
    payload = json.loads(result.stdout)
    assert payload["state"] == "DeploymentComplete"
    assert payload["deploymentStatus"]["status"]["readyReplicas"] == 2
    assert [p["name"] for p in payload["pods"]] == [
        "qwen-7c9d8f6b5d-00000",
        "qwen-7c9d8f6b5d-00001",
    ]
    assert all(p["ready"] and p["containers"] == "3/3" for p in payload["pods"])
    assert payload["routingService"]["name"] == "qwen-routing-service"
    assert payload["routingService"]["url"] == "http://qwen-routing-service.team-a.svc:443"
    assert (
        payload["loadBalancerHostName"] == "k8s-default-demo-0123456789.us-west-2.elb.amazonaws.com"
    )
    assert payload["conditions"][0]["type"] == "DeploymentReady"
    assert {c["name"]: c["state"] for c in payload["checks"]} == {
        "state": "ok",
        "replicas": "ok",
        "routing-service": "ok",
        "load-balancer": "ok",
    }

    table = cluster.hpkv("endpoint", "status", "qwen", "-n", "team-a", "--cluster", "demo")
    assert table.exit_code == 0, table
    assert "qwen-7c9d8f6b5d-00001" in table.stdout and "DeploymentReady" in table.stdout

    listed = cluster.hpkv("endpoint", "list", "--cluster", "demo", "-o", "json")
    assert listed.exit_code == 0, listed
    assert json.loads(listed.stdout)["endpoints"] == [
        {
            "namespace": "team-a",
            "name": "qwen",
            "model": "Qwen2-7B-Instruct",
            "state": "DeploymentComplete",
            "ready": "2/2",
            "routing": "prefixaware",
        }
    ]


def test_status_of_a_failed_endpoint_is_critical(cluster: Scenario) -> None:
    assert cluster.hpkv("endpoint", "deploy", "qwen", "--cluster", "demo", "--yes").exit_code == 0
    play_endpoint(
        cluster.kube,
        "qwen",
        state="DeploymentFailed",
        ready=0,
        load_balancer=None,
        message="Back-off pulling image lmcache/vllm-openai:v0.3.7",
    )
    result = cluster.hpkv("endpoint", "status", "qwen", "--cluster", "demo", "-o", "json")
    assert result.exit_code == 2, result
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["state"]["state"] == "fail"
    assert "ImagePullBackOff; Back-off pulling image" in checks["state"]["evidence"]
    assert checks["load-balancer"]["state"] == "warn"

    waited = cluster.hpkv("endpoint", "deploy", "qwen", "--cluster", "demo", "--yes", "--wait")
    assert waited.exit_code == 1, waited
    assert "failed to deploy: ImagePullBackOff" in waited.stderr.splitlines()[-1]

    missing = cluster.hpkv("endpoint", "status", "nope", "--cluster", "demo")
    assert missing.exit_code == 2, missing


def test_deploy_wait_returns_when_deployment_completes(cluster: Scenario) -> None:
    assert cluster.hpkv("endpoint", "deploy", "qwen", "--cluster", "demo", "--yes").exit_code == 0
    play_endpoint(cluster.kube, "qwen")
    result = cluster.hpkv("endpoint", "deploy", "qwen", "--cluster", "demo", "--yes", "--wait")
    assert result.exit_code == 0, result
    assert "DeploymentComplete" in result.stdout


def test_delete_needs_confirmation_then_deletes(cluster: Scenario) -> None:
    assert cluster.hpkv("endpoint", "deploy", "qwen", "--cluster", "demo", "--yes").exit_code == 0
    mark = cluster.mark()
    refused = cluster.hpkv("endpoint", "delete", "qwen", "--cluster", "demo")
    assert refused.exit_code == 2, refused
    assert "without confirmation" in _one_line(refused.stderr)
    assert cluster.writes_since(mark) == []

    deleted = cluster.hpkv("endpoint", "delete", "qwen", "--cluster", "demo", "--yes", "--wait")
    assert deleted.exit_code == 0, deleted
    assert cluster.writes_since(mark) == ["delete inferenceendpointconfigs default/qwen -> 200"]
    assert _live(cluster, "qwen") is None

    gone = cluster.hpkv("endpoint", "delete", "qwen", "--cluster", "demo", "--yes")
    assert gone.exit_code == 1, gone
    assert "endpoint default/qwen does not exist" in _one_line(gone.stderr)
