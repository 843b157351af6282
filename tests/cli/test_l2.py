"""`hpkv l2 status|apply|remove` against the real kube-apiserver (1.36 serves
MutatingAdmissionPolicy): pods are created through the API, so the admission policy really runs."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.scenario import Scenario
from tests.harness.workloads import (
    DeploymentPlayer,
    FakePods,
    create_endpoint,
    create_pod,
    curvine_pvc,
    install_endpoint_crd,
    list_pods,
    operator_controller,
    operator_deployment,
    vllm_env,
)

pytestmark = [pytest.mark.kube]

NS = "team-a"
EP = "demo"
CURVINE_URL = "fs://localhost:0/mnt/curvine/l2cache/"
OPERATOR_NS = "hyperpod-inference-system"
OPERATOR = "hyperpod-inference-controller-manager"


@pytest.fixture
def cluster(
    scenario: Scenario, shared_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    """An endpoint 'team-a/demo' rendered by the operator (2 replicas, 1 GPU each, on 2 one-GPU
    nodes), the Curvine PVC Bound, and a fake kubelet answering exec/logs."""
    kube = scenario.kube
    install_endpoint_crd(kube, shared_dir)
    create_endpoint(kube, shared_dir, NS, EP)
    curvine_pvc(kube, NS)
    nodes = scenario.nodes(2, gpus=1)
    kube.apply_object(operator_deployment(NS, EP, replicas=2))
    storage = tmp_path / "curvine"
    storage.mkdir()
    with FakePods(storage, logs_dir=tmp_path / "pod-logs") as pods:
        monkeypatch.setenv("HPKV_POD_ROUTES", pods.routes(NS))
        monkeypatch.setenv("HPKV_POD_LOGS_DIR", str(pods.logs_dir))
        yield {"scenario": scenario, "kube": kube, "nodes": nodes, "pods": pods, "storage": storage}


def _deployment(kube: Any, name: str = EP) -> dict[str, Any]:
    return kube.get_object("apps/v1", "Deployment", name, NS)


def _remote_urls(pod: dict[str, Any], container: str = EP) -> list[str]:
    return [e.get("value") for e in vllm_env(pod, container) if e["name"] == "LMCACHE_REMOTE_URL"]


def _assert_wired(pod: dict[str, Any]) -> None:
    assert _remote_urls(pod) == [CURVINE_URL]
    env = {e["name"]: e for e in vllm_env(pod, EP)}
    assert env["LMCACHE_REMOTE_SERDE"]["value"] == "naive"
    assert env["PYTHONHASHSEED"]["value"] == "0"
    extra = json.loads(env["LMCACHE_EXTRA_CONFIG"]["value"])
    assert extra == {
        "sagemaker_hyperpod_shared_memory_name": "ai_toolkit_cache",
        "fs_connector_relative_tmp_dir": ".tmp-$(HPKV_POD_NAME)",
    }
    assert env["HPKV_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    names = [e["name"] for e in vllm_env(pod, EP)]
    assert names.index("HPKV_POD_NAME") < names.index("LMCACHE_EXTRA_CONFIG")  # $(...) expands
    vllm = next(c for c in pod["spec"]["containers"] if c["name"] == EP)
    assert {"name": "curvine-cache", "mountPath": "/mnt/curvine/l2cache"} in vllm["volumeMounts"]
    assert {"name": "curvine-cache", "persistentVolumeClaim": {"claimName": "curvine-pvc"}} in pod[
        "spec"
    ]["volumes"]
    for other in pod["spec"]["containers"]:
        if other["name"] != EP:  # reverse-proxy and otel-collector are left alone
            assert "volumeMounts" not in other or all(
                m["name"] != "curvine-cache" for m in other["volumeMounts"]
            )


def test_apply_wires_pods_at_admission_and_survives_a_rerender(cluster: dict[str, Any]) -> None:
    scenario, kube = cluster["scenario"], cluster["kube"]
    deployment = _deployment(kube)
    old = [create_pod(kube, deployment, node=n) for n in cluster["nodes"]]
    kube.apply_object(operator_deployment(NS, "other", replicas=1))
    other_before = create_pod(kube, _deployment(kube, "other"), node=cluster["nodes"][0])

    with DeploymentPlayer(kube, [(NS, EP)], cluster["nodes"]) as player:
        mark = scenario.mark()
        dry = scenario.hpkv("l2", "apply", "--dry-run")
        assert dry.exit_code == 0, dry
        assert "re-create 2 stale pod(s)" in dry.stdout
        assert scenario.writes_since(mark) == []  # planning only reads
        result = scenario.hpkv("l2", "apply", "--yes")
        assert result.exit_code == 0, result
        assert player.error is None
    assert "pod-by-pod" in result.stdout  # 2 replicas on 2 one-GPU nodes: no room to surge
    writes = scenario.writes_since(mark)
    assert "patch mutatingadmissionpolicies hpkv-l2-team-a-demo -> 201" in writes, writes
    assert "patch mutatingadmissionpolicybindings hpkv-l2-team-a-demo -> 201" in writes
    assert sum(w.startswith("create pods/eviction") for w in writes) == 2, writes
    assert not any("deployments" in w for w in writes), "policy mode never touches the Deployment"

    pods = list_pods(kube, NS, EP)
    assert {p["metadata"]["name"] for p in pods}.isdisjoint(p["metadata"]["name"] for p in old)
    assert len(pods) == 2
    for pod in pods:
        _assert_wired(pod)

    # The operator re-renders: the Deployment is replaced; new pods are still wired.
    kube.delete_object(deployment)
    kube.apply_object(operator_deployment(NS, EP, replicas=2, extra_args=["--dtype", "bfloat16"]))
    rerendered = _deployment(kube)
    assert "curvine" not in json.dumps(rerendered["spec"]["template"])
    fresh = create_pod(kube, rerendered, node=cluster["nodes"][0])
    _assert_wired(fresh)
    assert _remote_urls(fresh) == [CURVINE_URL]

    # Pods of other apps are untouched, before and after the policy.
    other_after = create_pod(kube, _deployment(kube, "other"), node=cluster["nodes"][1])
    for pod in (other_before, other_after):
        assert _remote_urls(pod, "other") == ["sagemaker-hyperpod://$(NODE_IP):9200"]
        assert "hpkv.io/l2-wiring" not in (pod["metadata"].get("annotations") or {})


def test_second_apply_makes_zero_writes_and_status_is_ok(cluster: dict[str, Any]) -> None:
    scenario, kube = cluster["scenario"], cluster["kube"]
    with DeploymentPlayer(kube, [(NS, EP)], cluster["nodes"]):
        first = scenario.hpkv("l2", "apply", "--yes")
        assert first.exit_code == 0, first
        mark = scenario.mark()
        again = scenario.hpkv("l2", "apply", "--yes")
        assert again.exit_code == 0, again
        assert "nothing to do" in again.stdout
        assert scenario.writes_since(mark) == []

        execs = len(cluster["pods"].execs)
        status = scenario.hpkv("l2", "status", "-o", "json")
    assert status.exit_code == 0, status
    checks = {c["name"]: c for c in json.loads(status.stdout)["checks"]}
    assert checks["l2 team-a/demo"]["state"] == "ok"
    assert "MutatingAdmissionPolicy hpkv-l2-team-a-demo" in checks["l2 team-a/demo"]["evidence"]
    assert checks["pvc team-a/curvine-pvc"]["state"] == "ok"
    assert checks["replicas team-a/demo"]["state"] == "ok"
    assert checks["stale team-a/demo"]["state"] == "ok"
    pod_checks = [c for n, c in checks.items() if n.startswith("pod team-a/demo-")]
    assert len(pod_checks) == 2
    for check in pod_checks:
        assert check["state"] == "ok", check
        assert "wrote and read back a file in /mnt/curvine/l2cache" in check["evidence"]
    assert len(cluster["pods"].execs) == execs + 2  # one probe per pod


# --- mis-wirings drive status ------------------------------------------------------------------
def _hand_wired(
    *,
    url_entries: int = 1,
    mount: bool = True,
    seed: str = "0",
    model: str | None = None,
) -> Any:
    """A pod body edited as a hand-applied runbook patch would leave it."""

    def mutate(pod: dict[str, Any]) -> None:
        vllm = next(c for c in pod["spec"]["containers"] if c["name"] == EP)
        env = [e for e in vllm["env"] if e["name"] != "LMCACHE_REMOTE_URL"]
        env += [{"name": "LMCACHE_REMOTE_URL", "value": CURVINE_URL}]
        if url_entries > 1:  # the operator's entry left in place next to the new one
            env += [{"name": "LMCACHE_REMOTE_URL", "value": "sagemaker-hyperpod://$(NODE_IP):9200"}]
        env += [
            {"name": "LMCACHE_REMOTE_SERDE", "value": "naive"},
            {"name": "PYTHONHASHSEED", "value": seed},
        ]
        vllm["env"] = env
        if model:
            vllm["args"][0] = model
        if mount:
            vllm["volumeMounts"].append(
                {"name": "curvine-cache", "mountPath": "/mnt/curvine/l2cache"}
            )
            pod["spec"]["volumes"].append(
                {"name": "curvine-cache", "persistentVolumeClaim": {"claimName": "curvine-pvc"}}
            )

    return mutate


def _status(scenario: Scenario, *args: str) -> tuple[int, dict[str, dict[str, str]]]:
    result = scenario.hpkv("l2", "status", "-o", "json", *args)
    assert result.stderr == "", result
    payload = json.loads(result.stdout)
    return result.exit_code, {c["name"]: c for c in payload["checks"]}


def _pod_checks(checks: dict[str, dict[str, str]]) -> list[dict[str, str]]:
    return [c for name, c in checks.items() if name.startswith(f"pod {NS}/")]


def test_status_duplicate_env_is_critical(cluster: dict[str, Any]) -> None:
    kube = cluster["kube"]
    create_pod(kube, _deployment(kube), node=cluster["nodes"][0], mutate=_hand_wired(url_entries=2))
    code, checks = _status(cluster["scenario"])
    assert code == 2
    [pod] = _pod_checks(checks)
    assert pod["state"] == "fail"
    assert "LMCACHE_REMOTE_URL appears 2 times" in pod["evidence"]
    assert "worker.environmentVariables" in pod["remediation"]


def test_status_missing_mount_is_critical(cluster: dict[str, Any]) -> None:
    kube = cluster["kube"]
    create_pod(kube, _deployment(kube), node=cluster["nodes"][0], mutate=_hand_wired(mount=False))
    code, checks = _status(cluster["scenario"])
    assert code == 2
    [pod] = _pod_checks(checks)
    assert pod["state"] == "fail"
    assert "no volume mounted at /mnt/curvine/l2cache" in pod["evidence"]
    assert "hpkv l2 apply --endpoint team-a/demo" in pod["remediation"]
    assert cluster["pods"].execs == []  # no probe into a path that is not the L2


def test_status_unbound_pvc_is_critical_and_apply_refuses(cluster: dict[str, Any]) -> None:
    scenario, kube = cluster["scenario"], cluster["kube"]
    curvine_pvc(kube, NS, phase="Pending")
    create_pod(kube, _deployment(kube), node=cluster["nodes"][0], mutate=_hand_wired())
    code, checks = _status(scenario)
    assert code == 2
    pvc = checks["pvc team-a/curvine-pvc"]
    assert pvc["state"] == "fail"
    assert "Pending, not Bound" in pvc["evidence"]
    assert "hpkv curvine status" in pvc["remediation"]

    mark = scenario.mark()
    result = scenario.hpkv("l2", "apply", "--yes")
    assert result.exit_code == 1
    assert result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert "curvine-pvc is Pending, not Bound" in line and "Fix:" in line
    assert scenario.writes_since(mark) == []


def test_status_differing_hash_seeds_and_models_are_critical(cluster: dict[str, Any]) -> None:
    kube = cluster["kube"]
    deployment = _deployment(kube)
    a, b = cluster["nodes"]
    create_pod(kube, deployment, node=a, mutate=_hand_wired(seed="0"))
    create_pod(kube, deployment, node=b, mutate=_hand_wired(seed="42"))
    code, checks = _status(cluster["scenario"])
    assert code == 2
    replicas = checks["replicas team-a/demo"]
    assert replicas["state"] == "fail"
    assert "PYTHONHASHSEED: 0 on" in replicas["evidence"] and "42 on" in replicas["evidence"]
    assert "--model" not in replicas["evidence"]

    for pod in list_pods(kube, NS, EP):
        kube.raw(
            "DELETE", f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}?gracePeriodSeconds=0"
        )
    create_pod(kube, deployment, node=a, mutate=_hand_wired(model="/opt/ml/model"))
    create_pod(kube, deployment, node=b, mutate=_hand_wired(model="meta-llama/Llama-3.1-8B"))
    code, checks = _status(cluster["scenario"])
    assert code == 2
    replicas = checks["replicas team-a/demo"]
    assert "--model: " in replicas["evidence"] and "/opt/ml/model on" in replicas["evidence"]
    assert "meta-llama/Llama-3.1-8B on" in replicas["evidence"]
    assert "PYTHONHASHSEED" not in replicas["evidence"]
    assert "re-create old pods" in replicas["remediation"]


def test_status_lists_stale_pods_with_the_fix(cluster: dict[str, Any]) -> None:
    scenario, kube = cluster["scenario"], cluster["kube"]
    old = [create_pod(kube, _deployment(kube), node=n) for n in cluster["nodes"]]
    result = scenario.hpkv("l2", "apply", "--restart", "none", "--yes")
    assert result.exit_code == 0, result
    assert "left running (--restart none)" in result.stdout
    code, checks = _status(scenario)
    assert code == 1  # WARNING
    stale = checks["stale team-a/demo"]
    assert stale["state"] == "warn"
    for pod in old:
        assert pod["metadata"]["name"] in stale["evidence"]
        assert pod["metadata"]["name"] in stale["remediation"]  # kubectl delete pod ...
    assert "hpkv l2 apply --endpoint team-a/demo" in stale["remediation"]
    for pod in _pod_checks(checks):
        assert pod["state"] == "warn"
        assert "stale: created before the L2 wiring" in pod["evidence"]


def test_status_probe_failure_and_degraded_mode(cluster: dict[str, Any]) -> None:
    scenario, kube = cluster["scenario"], cluster["kube"]
    with DeploymentPlayer(kube, [(NS, EP)], cluster["nodes"]):
        assert scenario.hpkv("l2", "apply", "--yes").exit_code == 0
    first, second = sorted(p["metadata"]["name"] for p in list_pods(kube, NS, EP))
    fake = cluster["pods"]
    fake.broken.add(first)
    fake.log(
        NS,
        second,
        EP,
        "INFO vLLM starting\nERROR LMCache: failed to initialise the remote backend, "
        "running in degraded mode (recompute)\n",
    )
    code, checks = _status(scenario)
    assert code == 2
    broken = checks[f"pod {NS}/{first}"]
    assert broken["state"] == "fail"
    assert "Read-only file system" in broken["evidence"]
    assert "hpkv curvine status" in broken["remediation"]
    degraded = checks[f"pod {NS}/{second}"]
    assert degraded["state"] == "fail"
    assert "LMCache started in degraded mode" in degraded["evidence"]

    code, checks = _status(scenario, "--no-probe")
    assert code == 0
    assert all(c["state"] == "ok" for c in _pod_checks(checks))


# --- restarts ----------------------------------------------------------------------------------
def test_rollout_restart_when_a_gpu_is_free_for_the_surge_pod(cluster: dict[str, Any]) -> None:
    scenario, kube = cluster["scenario"], cluster["kube"]
    nodes = cluster["nodes"] + cluster["scenario"].nodes(1, gpus=1)  # a third, idle GPU
    with DeploymentPlayer(kube, [(NS, EP)], nodes):
        kube.wait_until(lambda: len(list_pods(kube, NS, EP)) == 2, what="the initial pods")
        mark = scenario.mark()
        result = scenario.hpkv("l2", "apply", "--yes")
        assert result.exit_code == 0, result
    assert "rollout (1 free slot(s) of 1 GPU(s) for surge pods)" in result.stdout
    writes = scenario.writes_since(mark)
    assert f"patch deployments {NS}/{EP} -> 200" in writes, writes
    assert not any("eviction" in w for w in writes)
    template = _deployment(kube)["spec"]["template"]
    assert "kubectl.kubernetes.io/restartedAt" in template["metadata"]["annotations"]
    assert "curvine" not in json.dumps(template["spec"])  # the operator's spec is untouched
    for pod in list_pods(kube, NS, EP):
        _assert_wired(pod)


def test_remove_deletes_the_policy_and_unwires_the_pods(cluster: dict[str, Any]) -> None:
    scenario, kube = cluster["scenario"], cluster["kube"]
    with DeploymentPlayer(kube, [(NS, EP)], cluster["nodes"]):
        assert scenario.hpkv("l2", "apply", "--yes").exit_code == 0
        result = scenario.hpkv("l2", "remove", "--yes", "-o", "json")
    assert result.exit_code == 0, result
    payload = json.loads(result.stdout)
    assert payload["results"][0]["checks"] == [
        {
            "stage": "l2",
            "name": "l2 team-a/demo",
            "state": "ok",
            "evidence": "no pod is wired to the L2: the operator's rendering is back",
            "remediation": "",
        }
    ]
    for kind in ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"):
        assert (
            kube.get_object("admissionregistration.k8s.io/v1", kind, "hpkv-l2-team-a-demo") is None
        )
    for pod in list_pods(kube, NS, EP):
        assert _remote_urls(pod) == ["sagemaker-hyperpod://$(NODE_IP):9200"]


# --- mode patch --------------------------------------------------------------------------------
def _replicas(kube: Any, namespace: str, name: str) -> int:
    return kube.get_object("apps/v1", "Deployment", name, namespace)["spec"]["replicas"]


def _state_configmap(kube: Any) -> dict[str, Any] | None:
    return kube.get_object("v1", "ConfigMap", "hpkv-l2-patch-state-demo", NS)


def test_patch_mode_patches_once_restores_the_operator_and_reverts(cluster: dict[str, Any]) -> None:
    scenario, kube = cluster["scenario"], cluster["kube"]
    operator_controller(kube, replicas=2)
    with DeploymentPlayer(kube, [(NS, EP)], cluster["nodes"]):
        mark = scenario.mark()
        result = scenario.hpkv("l2", "apply", "--mode", "patch", "--yes")
        assert result.exit_code == 0, result
        writes = scenario.writes_since(mark)
        operator_scale = f"patch deployments/scale {OPERATOR_NS}/{OPERATOR} -> 200"
        model_scale = f"patch deployments/scale {NS}/{EP} -> 200"
        patch = f"patch deployments {NS}/{EP} -> 200"
        ordered = [w for w in writes if w in (operator_scale, model_scale, patch)]
        # a server-side dry run of the patch first, then the published procedure
        assert ordered == [
            patch,
            operator_scale,
            model_scale,
            patch,
            model_scale,
            operator_scale,
        ], "\n".join(writes)
        assert _replicas(kube, OPERATOR_NS, OPERATOR) == 2
        assert _replicas(kube, NS, EP) == 2
        assert _state_configmap(kube) is None
        template = _deployment(kube)["spec"]["template"]
        as_pod = {"metadata": template["metadata"], "spec": template["spec"]}
        _assert_wired(as_pod)
        for pod in list_pods(kube, NS, EP):
            _assert_wired(pod)

        code, checks = _status(scenario)
        assert code == 1
        assert checks["l2 team-a/demo"]["state"] == "warn"
        assert "next re-render" in checks["l2 team-a/demo"]["evidence"]
        assert "--mode policy" in checks["l2 team-a/demo"]["remediation"]

        mark = scenario.mark()
        again = scenario.hpkv("l2", "apply", "--mode", "patch", "--yes")
        assert again.exit_code == 0, again
        assert scenario.writes_since(mark) == []

        removed = scenario.hpkv("l2", "remove", "--yes")
        assert removed.exit_code == 0, removed
    template = _deployment(kube)["spec"]["template"]
    vllm = next(c for c in template["spec"]["containers"] if c["name"] == EP)
    assert vllm["env"] == operator_deployment(NS, EP)["spec"]["template"]["spec"]["containers"][0][
        "env"
    ] or [e["name"] for e in vllm["env"]] == [
        "NODE_IP",
        "LMCACHE_LOCAL_CPU",
        "LMCACHE_REMOTE_URL",
        "LMCACHE_EXTRA_CONFIG",
    ]
    assert [e["value"] for e in vllm["env"] if e["name"] == "LMCACHE_REMOTE_URL"] == [
        "sagemaker-hyperpod://$(NODE_IP):9200"
    ]
    assert "curvine" not in json.dumps(template)
    assert _replicas(kube, OPERATOR_NS, OPERATOR) == 2


def test_patch_mode_restores_the_operator_when_a_step_is_denied(cluster: dict[str, Any]) -> None:
    """A cluster policy forbids scaling team-a endpoints to zero: the procedure fails after the
    operator was paused, and the operator must be back at its original replica count."""
    scenario, kube = cluster["scenario"], cluster["kube"]
    operator_controller(kube, replicas=2)
    _deny_scale_to_zero(kube)
    mark = scenario.mark()
    result = scenario.hpkv("l2", "apply", "--mode", "patch", "--yes")
    assert result.exit_code == 1, result
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("hpkv: error:")]
    assert len(errors) == 1 and "team-a endpoints keep at least one replica" in errors[0], result
    assert "restoring hyperpod-inference-system/hyperpod-inference-controller-manager to 2" in (
        result.stderr
    )
    writes = scenario.writes_since(mark)
    operator_scale = f"patch deployments/scale {OPERATOR_NS}/{OPERATOR} -> 200"
    assert writes.count(operator_scale) == 2, writes  # paused, then restored
    assert f"patch deployments/scale {NS}/{EP} -> 422" in writes
    assert _replicas(kube, OPERATOR_NS, OPERATOR) == 2
    assert _replicas(kube, NS, EP) == 2
    assert "curvine" not in json.dumps(_deployment(kube)["spec"]["template"])
    assert _state_configmap(kube) is None


def test_patch_mode_restores_the_operator_when_interrupted(cluster: dict[str, Any]) -> None:
    scenario, kube = cluster["scenario"], cluster["kube"]
    operator_controller(kube, replicas=2)
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))

    def interrupt_while_waiting() -> None:
        def patched() -> bool:
            template = _deployment(kube)["spec"]["template"]
            return "curvine" in json.dumps(template) and _replicas(kube, NS, EP) == 2

        kube.wait_until(patched, timeout=90, what="the patch")
        time.sleep(0.3)  # hpkv now waits for Ready pods that never come
        os.kill(os.getpid(), signal.SIGTERM)

    try:
        with DeploymentPlayer(kube, [(NS, EP)], cluster["nodes"]) as player:
            player.ready = False
            killer = threading.Thread(target=interrupt_while_waiting, daemon=True)
            killer.start()
            result = scenario.hpkv("l2", "apply", "--mode", "patch", "--yes", "--timeout", "180")
            killer.join(timeout=100)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert received == [], "the signal reached the test, not hpkv"
    assert result.exit_code == 130, result
    assert "restoring hyperpod-inference-system/hyperpod-inference-controller-manager" in (
        result.stderr
    )
    assert _replicas(kube, OPERATOR_NS, OPERATOR) == 2
    assert _replicas(kube, NS, EP) == 2
    assert _state_configmap(kube) is None


def test_a_crashed_patch_run_is_finished_by_the_next_apply(cluster: dict[str, Any]) -> None:
    """hpkv was killed (no finally) after pausing the operator and scaling the model down."""
    scenario, kube = cluster["scenario"], cluster["kube"]
    operator_controller(kube, replicas=0)
    kube.apply_object(operator_deployment(NS, EP, replicas=0))
    kube.apply_object(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "hpkv-l2-patch-state-demo", "namespace": NS},
            "data": {"operatorReplicas": "3", "modelReplicas": "2"},
        }
    )
    code, checks = _status(scenario)
    assert code == 2
    paused = checks["operator team-a/demo"]
    assert "restored to 3 replica(s)" in paused["evidence"]
    assert "--replicas=3" in paused["remediation"]

    with DeploymentPlayer(kube, [(NS, EP)], cluster["nodes"]):
        result = scenario.hpkv("l2", "apply", "--yes")
        assert result.exit_code == 0, result
    assert "an interrupted --mode patch run left state" in result.stdout
    assert _replicas(kube, OPERATOR_NS, OPERATOR) == 3
    assert _replicas(kube, NS, EP) == 2
    assert _state_configmap(kube) is None
    for pod in list_pods(kube, NS, EP):
        _assert_wired(pod)


def _deny_scale_to_zero(kube: Any) -> None:
    kube.apply_object(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "keep-serving"},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["apps"],
                            "apiVersions": ["v1"],
                            "operations": ["UPDATE"],
                            "resources": ["deployments/scale"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "request.namespace != 'team-a' || "
                        "(has(object.spec.replicas) && object.spec.replicas >= 1)",
                        "message": "team-a endpoints keep at least one replica",
                    }
                ],
            },
        }
    )
    kube.apply_object(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "keep-serving"},
            "spec": {"policyName": "keep-serving", "validationActions": ["Deny"]},
        }
    )

    def denied() -> bool:
        status, _ = kube.raw(
            "PATCH",
            f"/apis/apps/v1/namespaces/{NS}/deployments/{EP}/scale?dryRun=All",
            {"spec": {"replicas": 0}},
            content_type="application/merge-patch+json",
        )
        return status == 422  # a ValidatingAdmissionPolicy denies with reason Invalid

    kube.wait_until(denied, timeout=20, what="the ValidatingAdmissionPolicy to take effect")


# --- mechanisms: Kyverno, refusal ---------------------------------------------------------------
KYVERNO_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "clusterpolicies.kyverno.io"},
    "spec": {
        "group": "kyverno.io",
        "names": {
            "kind": "ClusterPolicy",
            "plural": "clusterpolicies",
            "singular": "clusterpolicy",
        },
        "scope": "Cluster",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


@pytest.fixture(scope="module")
def helm_path() -> str:
    from tests.harness.binaries import harness_binary

    return str(harness_binary("helm"))


def _config(workdir: Path, text: str) -> None:
    (workdir / "hpkv.yaml").write_text(text)


def test_apply_refuses_when_no_admission_mechanism_is_available(cluster: dict[str, Any]) -> None:
    scenario = cluster["scenario"]
    _config(scenario.workdir, "l2:\n  mechanism: kyverno\n")  # Kyverno only, and it is absent
    code, checks = _status(scenario)
    assert code == 1
    assert checks["admission"]["state"] == "warn"
    assert "--install-kyverno" in checks["admission"]["remediation"]
    mark = scenario.mark()
    result = scenario.hpkv("l2", "apply", "--yes")
    assert result.exit_code == 1
    [line] = result.stderr.strip().splitlines()
    assert "Kyverno is not installed" in line
    assert "--install-kyverno" in line and "--mode patch" in line
    assert scenario.writes_since(mark) == []


def test_kyverno_cluster_policy_where_kyverno_is_installed(cluster: dict[str, Any]) -> None:
    scenario, kube = cluster["scenario"], cluster["kube"]
    _config(scenario.workdir, "l2:\n  mechanism: kyverno\n")
    kube.apply_object(KYVERNO_CRD)
    kube.wait_until(lambda: _served(kube, "kyverno.io/v1", "ClusterPolicy"), what="the CRD")
    result = scenario.hpkv("l2", "apply", "--yes", "-o", "json")
    assert result.exit_code == 0, result
    policy = kube.get_object("kyverno.io/v1", "ClusterPolicy", "hpkv-l2-team-a-demo")
    rule = policy["spec"]["rules"][0]
    assert rule["match"]["any"][0]["resources"]["selector"] == {"matchLabels": {"app": EP}}
    assert rule["match"]["any"][0]["resources"]["namespaces"] == [NS]
    container = rule["mutate"]["patchStrategicMerge"]["spec"]["containers"][0]
    assert container["name"] == EP
    assert {"name": "LMCACHE_REMOTE_URL", "value": CURVINE_URL} in container["env"]
    # no Kyverno runs here: hpkv's dry-run pod shows the policy is not effective yet
    checks = {c["name"]: c for c in json.loads(result.stdout)["results"][0]["checks"]}
    assert checks["admission team-a/demo"]["state"] == "fail"
    assert "is not wired" in checks["admission team-a/demo"]["evidence"]

    mark = scenario.mark()
    assert scenario.hpkv("l2", "apply", "--yes").exit_code == 0
    assert scenario.writes_since(mark) == []


@pytest.mark.helm
def test_install_kyverno_with_helm_after_confirmation(
    cluster: dict[str, Any], helm_path: str, tmp_path: Path
) -> None:
    """No chart download in tests: a local chart stands in for kyverno/kyverno (its CRD)."""
    scenario, kube = cluster["scenario"], cluster["kube"]
    chart = tmp_path / "kyverno-chart"
    (chart / "crds").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        "apiVersion: v2\nname: kyverno\nversion: 3.7.2\nappVersion: v1.17.2\n"
    )
    (chart / "crds" / "clusterpolicies.yaml").write_text(json.dumps(KYVERNO_CRD))
    (chart / "templates").mkdir()
    (chart / "templates" / "config.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kyverno\ndata:\n  stand-in: 'true'\n"
    )
    _config(
        scenario.workdir,
        f"helm: {helm_path}\nl2:\n  mechanism: kyverno\n  kyverno:\n    repo: ''\n"
        f"    chart: {chart}\n",
    )
    dry = scenario.hpkv("l2", "apply", "--install-kyverno", "--dry-run")
    assert dry.exit_code == 0, dry
    assert "helm release kyverno/kyverno" in dry.stdout
    refused = scenario.hpkv("l2", "apply", "--install-kyverno")  # no TTY, no --yes
    assert refused.exit_code == 2
    assert not _served(kube, "kyverno.io/v1", "ClusterPolicy")

    result = scenario.hpkv("l2", "apply", "--install-kyverno", "--yes")
    assert result.exit_code == 0, result
    assert kube.get_object("kyverno.io/v1", "ClusterPolicy", "hpkv-l2-team-a-demo") is not None


def _served(kube: Any, api_version: str, kind: str) -> bool:
    kube._resources = None
    return any(r["groupVersion"] == api_version and r["kind"] == kind for r in kube.resources())


def test_unknown_endpoint_is_one_line_naming_the_known_ones(cluster: dict[str, Any]) -> None:
    result = cluster["scenario"].hpkv("l2", "status", "--endpoint", "nope")
    assert result.exit_code == 3  # status: errors are UNKNOWN
    [line] = result.stderr.strip().splitlines()
    assert "InferenceEndpointConfig 'nope' not found" in line
    assert "team-a/demo" in line
    bad = cluster["scenario"].hpkv("l2", "apply", "--mode", "sideways")
    assert bad.exit_code == 2
    assert "policy or patch" in bad.stderr


def test_remove_patch_only_while_the_policy_keeps_the_pods_wired(cluster: dict[str, Any]) -> None:
    scenario, kube = cluster["scenario"], cluster["kube"]
    operator_controller(kube, replicas=1)
    with DeploymentPlayer(kube, [(NS, EP)], cluster["nodes"]):
        assert scenario.hpkv("l2", "apply", "--mode", "patch", "--yes").exit_code == 0
        both = scenario.hpkv("l2", "apply", "--yes")
        assert both.exit_code == 0, both
        assert "also carries a --mode patch" in both.stdout
        removed = scenario.hpkv("l2", "remove", "--mode", "patch", "--yes", "-o", "json")
        assert removed.exit_code == 0, removed
        [confirm] = json.loads(removed.stdout)["results"][0]["checks"]
        assert confirm["state"] == "ok"
        assert "the admission policy keeps wiring the pods" in confirm["evidence"]
        code, checks = _status(scenario)
    assert "curvine" not in json.dumps(_deployment(kube)["spec"]["template"])
    assert code == 0, checks
    assert "also carries" not in checks["l2 team-a/demo"]["evidence"]
    for pod in list_pods(kube, NS, EP):
        _assert_wired(pod)  # by the policy now
    assert _replicas(kube, OPERATOR_NS, OPERATOR) == 1


def test_probe_through_the_api_server_without_a_kubelet_is_unknown(
    cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real exec/log path (no seams): the test cluster has no kubelet to upgrade to."""
    monkeypatch.delenv("HPKV_POD_ROUTES")
    monkeypatch.delenv("HPKV_POD_LOGS_DIR")
    kube = cluster["kube"]
    create_pod(kube, _deployment(kube), node=cluster["nodes"][0], mutate=_hand_wired())
    code, checks = _status(cluster["scenario"])
    assert code == 3
    [pod] = _pod_checks(checks)
    assert pod["state"] == "unknown"
    assert "probe not run: exec into pod team-a/" in pod["evidence"]
    assert "unable to upgrade connection" in pod["evidence"]
    # The log read goes through the one pod-log seam; this API server answers 404 without a
    # kubelet, which reads as "no log yet" (as for a container that never started): not a problem.
    assert "logs not read" not in pod["evidence"]
    assert "--no-probe" in pod["remediation"]
