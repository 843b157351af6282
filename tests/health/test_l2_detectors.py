"""Stage 4's detectors (hpkv.stages.l2.detectors): each broken state seeded on a cluster where
'hpkv l2 apply' wired the endpoint (the real MutatingAdmissionPolicy of kube-apiserver 1.36 wires
the pods the played Deployment controller creates)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from hpkv.stages.l2.wiring import PATCH_ORIGINAL_ANNOTATION, WIRING_ANNOTATION
from tests.harness.stack import ENDPOINT, ENDPOINT_NS, HEALTHY_COUNTERS, Stack
from tests.harness.workloads import create_endpoint, create_pod
from tests.health.conftest import findings, run_json

pytestmark = [pytest.mark.kube, pytest.mark.aws, pytest.mark.helm]

ADMISSION = "admissionregistration.k8s.io/v1"
POLICY = f"hpkv-l2-{ENDPOINT_NS}-{ENDPOINT}"
CURVINE_URL = "fs://localhost:0/mnt/curvine/l2cache/"


@pytest.fixture
def wired(stack: Stack) -> Stack:
    return stack.install(["l2"])


def _deployment(stack: Stack) -> dict[str, Any]:
    deployment = stack.kube.get_object("apps/v1", "Deployment", ENDPOINT, ENDPOINT_NS)
    assert deployment is not None
    return deployment


@contextlib.contextmanager
def _policy_paused(stack: Stack) -> Iterator[str]:
    """Pods created inside skip the admission policy (its binding is away); yields the current
    wiring fingerprint."""
    kube = stack.kube
    policy = kube.get_object(ADMISSION, "MutatingAdmissionPolicy", POLICY)
    binding = kube.get_object(ADMISSION, "MutatingAdmissionPolicyBinding", POLICY)
    assert policy is not None and binding is not None
    kube.delete_object(binding)
    kube.wait_until(lambda: not stack.admission_wires(), timeout=30, what="the policy to pause")
    yield policy["metadata"]["annotations"][WIRING_ANNOTATION]
    meta = binding["metadata"]
    kube.apply_object(
        {
            "apiVersion": ADMISSION,
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {k: meta[k] for k in ("name", "labels", "annotations") if k in meta},
            "spec": binding["spec"],
        }
    )
    kube.wait_until(stack.admission_wires, timeout=30, what="the policy to act again")


def test_stale_pods_and_pods_admitted_without_the_url(wired: Stack) -> None:
    wired.stop_workers()
    kube, deployment = wired.kube, _deployment(wired)
    with _policy_paused(wired) as fingerprint:
        stale = create_pod(kube, deployment, node=wired.nodes[0])["metadata"]["name"]

        def current(pod: dict[str, Any]) -> None:
            pod["metadata"]["annotations"][WIRING_ANNOTATION] = fingerprint

        broken = create_pod(kube, deployment, node=wired.nodes[1], mutate=current)
    broken_name = broken["metadata"]["name"]
    code, doc = run_json(wired.scenario, "diagnose")
    [stale_finding] = findings(doc, "l2.stale-pods")
    assert "1 pod(s) were created before the current L2 wiring" in stale_finding["evidence"]
    assert stale in stale_finding["evidence"] and broken_name not in stale_finding["evidence"]
    assert f"kubectl -n {ENDPOINT_NS} delete pod" in stale_finding["remediation"]
    [url] = findings(doc, "l2.remote-url")
    assert url["severity"] == "critical"
    assert f"1 pod(s) ({broken_name}) carry the current wiring's fingerprint" in url["evidence"]
    assert f"Pod/{ENDPOINT_NS}/{broken_name}" in url["objects"]
    assert code == 2


def test_url_twice_and_an_endpoint_left_unwired(wired: Stack) -> None:
    kube = wired.kube
    create_endpoint(kube, wired.shared_dir, ENDPOINT_NS, "other")
    sagemaker_url = "sagemaker-hyperpod://$(NODE_IP):9200"
    for i, urls in enumerate(([sagemaker_url, CURVINE_URL], [sagemaker_url])):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"other-5d8f9c7b4-p{i}", "labels": {"app": "other"}},
            "spec": {
                "nodeName": wired.nodes[i],
                "containers": [
                    {
                        "name": "other",
                        "image": "lmcache/vllm-openai:v0.3.7",
                        "env": [{"name": "LMCACHE_REMOTE_URL", "value": u} for u in urls],
                    }
                ],
            },
        }
        # Created, not applied: server-side apply refuses duplicate env names; the API accepts
        # them on create (as from an operator that renders the variable twice).
        status, body = kube.raw("POST", f"/api/v1/namespaces/{ENDPOINT_NS}/pods", pod)
        assert status == 201, body
    code, doc = run_json(wired.scenario, "diagnose")
    by_title = {f["title"]: f for f in findings(doc, "l2.remote-url")}
    twice = by_title[f"{ENDPOINT_NS}/other: LMCACHE_REMOTE_URL set twice"]
    assert twice["severity"] == "critical"
    assert f"e.g. {sagemaker_url}, {CURVINE_URL}" in twice["evidence"]
    assert "worker.environmentVariables" in twice["remediation"]
    unwired = by_title[f"{ENDPOINT_NS}/other: pods without the Curvine URL"]
    assert unwired["severity"] == "warning"
    assert f"{ENDPOINT_NS}/other is not wired to the Curvine L2" in unwired["evidence"]
    assert f"hpkv l2 apply --endpoint {ENDPOINT_NS}/other" in unwired["remediation"]
    assert code == 2


def test_patch_mode_wiring_re_rendered_away(wired: Stack) -> None:
    """What a '--mode patch' wiring leaves after the operator re-renders the Deployment: hpkv's
    annotation on it, a template without the wiring, and no policy."""
    kube = wired.kube
    for kind in ("MutatingAdmissionPolicyBinding", "MutatingAdmissionPolicy"):
        kube.delete_object({"apiVersion": ADMISSION, "kind": kind, "metadata": {"name": POLICY}})
    status, body = kube.raw(
        "PATCH",
        f"/apis/apps/v1/namespaces/{ENDPOINT_NS}/deployments/{ENDPOINT}",
        {"metadata": {"annotations": {PATCH_ORIGINAL_ANNOTATION: "[]"}}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, body
    code, doc = run_json(wired.scenario, "diagnose")
    [finding] = findings(doc, "l2.patch-reverted")
    assert finding["severity"] == "critical"
    assert "the operator re-rendered it" in finding["evidence"]
    assert (
        f"hpkv l2 apply --mode policy --endpoint {ENDPOINT_NS}/{ENDPOINT}"
        in (finding["remediation"])
    )
    assert code == 2


def test_replicas_that_differ_are_reported_once(wired: Stack) -> None:
    wired.stop_workers()

    def tensor_parallel(pod: dict[str, Any]) -> None:
        pod["spec"]["containers"][0]["args"] += ["--tensor-parallel-size", "2"]

    odd = create_pod(wired.kube, _deployment(wired), node=wired.nodes[0], mutate=tensor_parallel)
    code, doc = run_json(wired.scenario, "diagnose")
    [finding] = findings(doc, "l2.replica-mismatch")
    assert "--tensor-parallel-size: 1 on " in finding["evidence"]
    assert f"2 on {odd['metadata']['name']}" in finding["evidence"]
    # The generic LMCache detector saw the same pods: the stage's finding supersedes it.
    assert findings(doc, "lmcache.replica-mismatch") == []
    generic = {d["id"]: d for d in doc["detectors"]}["lmcache.replica-mismatch"]
    assert generic["superseded"] == 1
    assert code == 2


def test_gpu_bound_rollout_stuck_on_max_surge(wired: Stack) -> None:
    """Two replicas fill both GPUs, maxUnavailable=0: the surge pod of a rollout never
    schedules."""
    wired.stop_workers()
    kube = wired.kube
    kube.apply_object(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": ENDPOINT, "namespace": ENDPOINT_NS},
            "status": {"replicas": 3, "updatedReplicas": 1, "readyReplicas": 2},
        },
        subresource="status",
    )
    surge = create_pod(kube, _deployment(wired), ready=False)["metadata"]["name"]
    message = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    kube.apply_object(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": surge, "namespace": ENDPOINT_NS},
            "status": {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": message,
                    }
                ],
            },
        },
        subresource="status",
    )
    code, doc = run_json(wired.scenario, "diagnose")
    [finding] = findings(doc, "l2.rollout-stuck")
    assert f"surge pod {surge} is Pending ({message})" in finding["evidence"]
    assert "1 of 2 replicas updated" in finding["evidence"]
    assert "maxUnavailable=0" in finding["evidence"]
    assert f"scale deployment {ENDPOINT} --replicas=0" in finding["remediation"]
    assert code == 2


@pytest.mark.parametrize("writes", [300.0, 0.0])
def test_l2_never_hit_while_l0_and_l1_hit(wired: Stack, writes: float) -> None:
    for pod in wired.worker_pods():
        wired.metrics.counters[pod] = {
            **HEALTHY_COUNTERS,
            "lmcache:num_remote_read_requests_total": 0.0,
            "lmcache:num_remote_read_bytes_total": 0.0,
            "lmcache:num_remote_write_requests_total": writes,
        }
    code, doc = run_json(wired.scenario, "diagnose")
    [finding] = findings(doc, "l2.hit-rate-zero")
    assert "2 replica(s) report GPU prefix-cache (L0) hits 120000 tokens" in finding["evidence"]
    assert "but 0 L2 reads" in finding["evidence"]
    if writes:
        assert "600 chunk(s) were written and none read back" in finding["evidence"]
    else:
        assert "nothing was written to the L2 either" in finding["evidence"]
    assert code == 1
