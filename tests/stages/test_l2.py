"""Stage 4 core: the wiring as data (pure functions), and the generated CEL policy and JSON patch
run by the real kube-apiserver."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hpkv.stages.base import CheckState
from hpkv.stages.l2.pods import (
    cache_key_parts,
    choose_mechanism,
    choose_restart,
    inspect_pod,
    pod_findings,
    vllm_model,
)
from hpkv.stages.l2.wiring import (
    TMP_DIR_VALUE,
    Wiring,
    binding_manifest,
    kyverno_manifest,
    merge_extra_config,
    object_name,
    patch_operations,
    policy_manifest,
    wired_env,
)
from hpkv.topology import EndpointRef
from tests.harness.kube import KubeHarness
from tests.harness.play import ensure_namespace
from tests.harness.workloads import operator_deployment

REF = EndpointRef("team-a", "demo")
WIRING = Wiring(
    mount_path="/mnt/curvine/l2cache",
    volume_name="curvine-cache",
    pvc_name="curvine-pvc",
    storage_class="curvine-sc",
    hash_seed="0",
)
URL = "fs://localhost:0/mnt/curvine/l2cache/"
TMP = {"fs_connector_relative_tmp_dir": TMP_DIR_VALUE}


# --- pure functions ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("current", "expected"),
    [
        (None, TMP),
        ("{}", TMP),
        (
            '{"sagemaker_hyperpod_shared_memory_name": "ai_toolkit_cache"}',
            {"sagemaker_hyperpod_shared_memory_name": "ai_toolkit_cache", **TMP},
        ),
        ('{"fs_connector_relative_tmp_dir": "mine"}', {"fs_connector_relative_tmp_dir": "mine"}),
        ("not json", TMP),
    ],
)
def test_merge_extra_config_keeps_existing_keys(
    current: str | None, expected: dict[str, Any]
) -> None:
    assert json.loads(merge_extra_config(current)) == expected


def test_wired_env_replaces_never_duplicates() -> None:
    env = [
        {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        {"name": "LMCACHE_REMOTE_URL", "value": "sagemaker-hyperpod://$(NODE_IP):9200"},
        {"name": "LMCACHE_REMOTE_URL", "value": "duplicate"},
        {"name": "PYTHONHASHSEED", "value": "7"},
        {"name": "LMCACHE_EXTRA_CONFIG", "value": '{"a": 1}'},
    ]
    wired = wired_env(env, WIRING)
    names = [e["name"] for e in wired]
    assert names == [
        "NODE_IP",
        "LMCACHE_REMOTE_URL",
        "LMCACHE_REMOTE_SERDE",
        "PYTHONHASHSEED",
        "HPKV_POD_NAME",
        "LMCACHE_EXTRA_CONFIG",
    ]
    values = {e["name"]: e.get("value") for e in wired}
    assert values["LMCACHE_REMOTE_URL"] == URL
    assert values["PYTHONHASHSEED"] == "0"
    assert json.loads(values["LMCACHE_EXTRA_CONFIG"]) == {"a": 1, **TMP}
    assert wired_env(wired, WIRING) == wired  # idempotent


def test_remote_url_always_has_host_and_port() -> None:
    # LMCache's parse_remote_url asserts both; only the path is used by the fs connector
    for mount in ("/mnt/curvine/l2cache", "/mnt/curvine/l2cache/", "/l2"):
        wiring = Wiring(mount, "v", "p", "s", "0")
        assert wiring.remote_url.startswith("fs://localhost:0/")
        assert wiring.remote_url.endswith("/") and "//" not in wiring.remote_url[5:]


@pytest.mark.parametrize(
    ("command", "args", "model"),
    [
        ([], ["/opt/ml/model", "--max-model-len", "4096"], "/opt/ml/model"),
        (["vllm", "serve"], ["Qwen/Qwen2-7B-Instruct", "--port", "8000"], "Qwen/Qwen2-7B-Instruct"),
        (["python3", "-m", "vllm.entrypoints.openai.api_server"], ["--model", "m1"], "m1"),
        ([], ["--port=8000", "--model=m2"], "m2"),
        ([], ["--port", "8000"], "(vLLM default)"),
    ],
)
def test_vllm_model(command: list[str], args: list[str], model: str) -> None:
    assert vllm_model(command, args) == model


def test_cache_key_parts() -> None:
    container = {
        "args": ["m", "-tp", "2", "--kv-cache-dtype=fp8", "--dtype", "bfloat16"],
        "env": [
            {"name": "LMCACHE_CHUNK_SIZE", "value": "512"},
            {"name": "PYTHONHASHSEED", "value": "0"},
        ],
    }
    assert cache_key_parts(container) == {
        "PYTHONHASHSEED": "0",
        "--model": "m",
        "--tensor-parallel-size": "2",
        "--pipeline-parallel-size": "1",
        "--kv-cache-dtype": "fp8",
        "--dtype": "bfloat16",
        "chunk size": "512",
    }
    parts = cache_key_parts(
        {"args": ["m"], "env": [{"name": "LMCACHE_CONFIG_FILE", "value": "/c.yaml"}]}
    )
    assert parts["chunk size"] == "(from /c.yaml)"
    assert parts["PYTHONHASHSEED"].startswith("(unset")


def _node(
    name: str, gpus: int, *, ready: bool = True, unschedulable: bool = False
) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"unschedulable": unschedulable},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def _pod(node: str, gpus: int) -> dict[str, Any]:
    return {
        "spec": {
            "nodeName": node,
            "containers": [{"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": "Running"},
    }


def test_choose_restart_avoids_the_max_surge_gpu_deadlock() -> None:
    deployment = operator_deployment("team-a", "demo", replicas=2, gpus=1)
    busy = [_pod("n1", 1), _pod("n2", 1)]
    strategy, why = choose_restart(deployment, [_node("n1", 1), _node("n2", 1)], busy)
    assert strategy == "pod-by-pod" and "deadlock" in why
    # a free GPU on a Ready node lets the surge pod schedule
    assert (
        choose_restart(deployment, [_node("n1", 1), _node("n2", 1), _node("n3", 1)], busy)[0]
        == "rollout"
    )
    # ... but not on a cordoned or NotReady node
    for node in (_node("n3", 1, unschedulable=True), _node("n3", 1, ready=False)):
        assert (
            choose_restart(deployment, [_node("n1", 1), _node("n2", 1), node], busy)[0]
            == "pod-by-pod"
        )
    # two GPUs per pod need two free on one node
    double = operator_deployment("team-a", "demo", replicas=1, gpus=2)
    assert (
        choose_restart(double, [_node("n1", 2), _node("n2", 1)], [_pod("n1", 2)])[0] == "pod-by-pod"
    )
    # maxUnavailable >= 1 never deadlocks
    deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] = 1
    assert choose_restart(deployment, [_node("n1", 1), _node("n2", 1)], busy)[0] == "rollout"


def test_choose_mechanism() -> None:
    assert choose_mechanism(admission_policy=True, kyverno=True) == "admission-policy"
    assert choose_mechanism(admission_policy=False, kyverno=True) == "kyverno"
    assert choose_mechanism(admission_policy=False, kyverno=False) == ""
    assert choose_mechanism(admission_policy=True, kyverno=False, preference="kyverno") == ""


def test_object_names_are_bounded() -> None:
    assert object_name(REF) == "hpkv-l2-team-a-demo"
    long = object_name(EndpointRef("n" * 63, "e" * 253))
    assert len(long) <= 253
    assert long != object_name(EndpointRef("n" * 63, "e" * 252))


def test_kyverno_policy_never_contains_a_kyverno_reference() -> None:
    # "$(" starts a Kyverno reference; the kubelet's $(HPKV_POD_NAME) must be assembled instead
    policy = kyverno_manifest(REF, WIRING, "Ignore")
    assert "$(" not in json.dumps(policy)
    env = policy["spec"]["rules"][0]["mutate"]["patchStrategicMerge"]["spec"]["containers"][0][
        "env"
    ]
    assert [e["name"] for e in env][-2:] == ["HPKV_POD_NAME", "LMCACHE_EXTRA_CONFIG"]


def test_findings_for_a_pod_wired_to_a_foreign_claim() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {
            "containers": [
                {
                    "name": "demo",
                    "env": wired_env([], WIRING),
                    "volumeMounts": [{"name": "x", "mountPath": "/mnt/curvine/l2cache"}],
                }
            ],
            "volumes": [{"name": "x", "persistentVolumeClaim": {"claimName": "other"}}],
        },
    }
    findings = pod_findings(inspect_pod(pod, "demo", WIRING), WIRING, REF, mechanism_present=False)
    assert findings[0].state is CheckState.FAIL
    assert "backed by PVC other, not the Curvine PVC curvine-pvc" in findings[0].evidence


# --- the real API server runs what hpkv generates -----------------------------------------------
def _dry_run_pod(kube: KubeHarness, pod: dict[str, Any]) -> dict[str, Any]:
    status, body = kube.raw("POST", "/api/v1/namespaces/team-a/pods?dryRun=All", pod)
    assert status == 201, body
    return json.loads(body)


def _install_policy(kube: KubeHarness) -> None:
    ensure_namespace(kube, "team-a")
    kube.apply_object(policy_manifest(REF, WIRING, "Fail"))
    kube.apply_object(binding_manifest(REF, WIRING))

    def effective() -> bool:
        pod = _dry_run_pod(kube, _template_pod([]))
        return "hpkv.io/l2-wiring" in (pod["metadata"].get("annotations") or {})

    kube.wait_until(effective, timeout=30, what="the policy to load")


def _template_pod(
    env: list[dict[str, Any]], *, container: str = "demo", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "demo-",
            "namespace": "team-a",
            "labels": labels or {"app": "demo"},
        },
        "spec": {
            "containers": [
                {"name": "proxy", "image": "p"},
                {"name": container, "image": "v", "env": env},
            ]
        },
    }


@pytest.mark.kube
def test_cel_policy_matches_the_python_wiring(kube: KubeHarness) -> None:
    """For every LMCACHE_EXTRA_CONFIG shape, the admission policy produces what wired_env does."""
    _install_policy(kube)
    operator_env = [
        {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        {"name": "LMCACHE_REMOTE_URL", "value": "sagemaker-hyperpod://$(NODE_IP):9200"},
    ]
    extras = [
        None,
        "{}",
        ' { "a": "x" } ',
        '{"sagemaker_hyperpod_shared_memory_name": "ai_toolkit_cache"}',
        '{"fs_connector_relative_tmp_dir": "mine", "b": 2}',
        "not json",
    ]
    for extra in extras:
        env = operator_env + (
            [{"name": "LMCACHE_EXTRA_CONFIG", "value": extra}] if extra is not None else []
        )
        pod = _dry_run_pod(kube, _template_pod(env))
        got = next(c for c in pod["spec"]["containers"] if c["name"] == "demo")["env"]
        want = wired_env(env, WIRING)
        assert [e["name"] for e in got] == [e["name"] for e in want], extra
        got_extra = json.loads(got[-1]["value"])
        assert got_extra == json.loads(want[-1]["value"]), extra
        assert [e.get("value") for e in got[:-1]] == [e.get("value") for e in want[:-1]], extra


@pytest.mark.kube
def test_cel_policy_shapes(kube: KubeHarness) -> None:
    _install_policy(kube)
    # duplicates collapse to one entry; a pod with no env, volumes or mounts gets them
    dup = [
        {"name": "LMCACHE_REMOTE_URL", "value": "a"},
        {"name": "LMCACHE_REMOTE_URL", "value": "b"},
    ]
    pod = _dry_run_pod(kube, _template_pod(dup))
    vllm = next(c for c in pod["spec"]["containers"] if c["name"] == "demo")
    assert [e["value"] for e in vllm["env"] if e["name"] == "LMCACHE_REMOTE_URL"] == [URL]
    assert vllm["volumeMounts"] == [{"name": "curvine-cache", "mountPath": "/mnt/curvine/l2cache"}]
    assert pod["spec"]["containers"][0].get("env") is None  # the proxy is left alone
    # an existing volume of that name, or another mount at the path, is replaced
    body = _template_pod([])
    body["spec"]["volumes"] = [
        {"name": "curvine-cache", "emptyDir": {}},
        {"name": "keep", "emptyDir": {}},
    ]
    body["spec"]["containers"][1]["volumeMounts"] = [
        {"name": "keep", "mountPath": "/mnt/curvine/l2cache"}
    ]
    pod = _dry_run_pod(kube, body)
    assert pod["spec"]["volumes"] == [
        {"name": "keep", "emptyDir": {}},
        {"name": "curvine-cache", "persistentVolumeClaim": {"claimName": "curvine-pvc"}},
    ]
    vllm = next(c for c in pod["spec"]["containers"] if c["name"] == "demo")
    assert vllm["volumeMounts"] == [{"name": "curvine-cache", "mountPath": "/mnt/curvine/l2cache"}]
    # no container named after the endpoint: the first one is the vLLM container (the blog's /0)
    pod = _dry_run_pod(kube, _template_pod([], container="vllm"))
    assert pod["spec"]["containers"][0]["env"][0] == {"name": "LMCACHE_REMOTE_URL", "value": URL}
    # other apps are not matched
    other = _dry_run_pod(kube, _template_pod([], labels={"app": "other"}))
    assert "hpkv.io/l2-wiring" not in (other["metadata"].get("annotations") or {})


@pytest.mark.kube
def test_json_patch_and_its_revert_round_trip(kube: KubeHarness) -> None:
    ensure_namespace(kube, "team-a")
    # the duplicate entry (as worker.environmentVariables can produce) cannot be server-side
    # applied; the operator creates it with a plain create
    body = operator_deployment(
        "team-a", "demo", extra_env=[{"name": "LMCACHE_REMOTE_URL", "value": "dup"}]
    )
    status, created = kube.raw("POST", "/apis/apps/v1/namespaces/team-a/deployments", body)
    assert status == 201, created
    original = json.loads(created)
    path = "/apis/apps/v1/namespaces/team-a/deployments/demo"
    status, body = kube.raw(
        "PATCH",
        path,
        patch_operations(original, WIRING, REF),
        content_type="application/json-patch+json",
    )
    assert status == 200, body
    patched = json.loads(body)
    vllm = patched["spec"]["template"]["spec"]["containers"][0]
    assert [e["value"] for e in vllm["env"] if e["name"] == "LMCACHE_REMOTE_URL"] == [URL]
    assert patched["spec"]["template"]["metadata"]["annotations"][
        "hpkv.io/l2-wiring"
    ] == WIRING.fingerprint(REF)
    # the test operation guards against concurrent writers: a stale patch is rejected
    status, body = kube.raw(
        "PATCH",
        path,
        patch_operations(original, WIRING, REF),
        content_type="application/json-patch+json",
    )
    assert status == 422, body
    status, body = kube.raw(
        "PATCH",
        path,
        patch_operations(patched, WIRING, REF, revert=True),
        content_type="application/json-patch+json",
    )
    assert status == 200, body
    reverted = json.loads(body)
    before, after = original["spec"]["template"], reverted["spec"]["template"]
    assert sorted(after["spec"]["containers"][0]["env"], key=json.dumps) == sorted(
        before["spec"]["containers"][0]["env"], key=json.dumps
    )
    assert after["spec"]["volumes"] == before["spec"]["volumes"]
    assert (
        after["spec"]["containers"][0]["volumeMounts"]
        == before["spec"]["containers"][0]["volumeMounts"]
    )
    assert "hpkv.io/l2-patch-original" not in (reverted["metadata"].get("annotations") or {})
