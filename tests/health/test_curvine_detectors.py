"""Stage 3's detectors (hpkv.stages.curvine.detectors) and the Curvine knowledge in the generic
pvc.pending: each broken state seeded on a cluster where 'hpkv curvine apply' ran (real helm, the
stand-in charts, played controllers, the stub master)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.harness.play import add_csi_node_pod_pulling
from tests.harness.stack import CURVINE_NS, ENDPOINT_NS, Stack
from tests.health.conftest import findings, pvc, run_json

pytestmark = [pytest.mark.kube, pytest.mark.aws, pytest.mark.helm]


@pytest.fixture
def curvine(stack: Stack) -> Stack:
    return stack.install(["curvine"])


def test_master_not_active_or_unreachable(curvine: Stack) -> None:
    curvine.master.set_cluster(live=2, state="Standby")
    code, doc = run_json(curvine.scenario, "diagnose")
    [finding] = findings(doc, "curvine.master-not-active")
    assert (
        "no Active master: service curvine/curvine-master:9000 reports master_state=Standby"
        in (finding["evidence"])
    )
    assert "kubectl -n curvine logs curvine-master-0" in finding["remediation"]
    assert finding["objects"] == ["StatefulSet/curvine/curvine-master"]
    assert code == 2

    curvine.route("curvine/services/curvine-master:9000", "http://127.0.0.1:9")
    _code, doc = run_json(curvine.scenario, "diagnose")
    [finding] = findings(doc, "curvine.master-not-active")
    assert finding["evidence"].startswith("the master API does not answer: ")
    assert not findings(doc, "curvine.workers-lost")  # nothing to say without the master


def test_lost_workers_by_name(curvine: Stack) -> None:
    curvine.master.set_cluster(live=1, lost=1)
    code, doc = run_json(curvine.scenario, "diagnose")
    [finding] = findings(doc, "curvine.workers-lost")
    assert finding["severity"] == "warning"
    assert (
        "1 Curvine worker(s) lost: curvine-worker-1.curvine-worker.curvine.svc.cluster.local "
        "(1 live)" in finding["evidence"]
    )
    assert "worker_lost_interval" in finding["remediation"]
    assert code == 1


def test_capacity_near_full(curvine: Stack) -> None:
    curvine.master.set_cluster(live=2, used_ratio=0.9)
    code, doc = run_json(curvine.scenario, "diagnose")
    [finding] = findings(doc, "curvine.capacity-near-full")
    assert finding["severity"] == "warning" and code == 1
    assert "90% full" in finding["evidence"] and "high watermark 80%" in finding["evidence"]
    curvine.master.set_cluster(live=2, used_ratio=0.97)
    code, doc = run_json(curvine.scenario, "diagnose")
    assert findings(doc, "curvine.capacity-near-full")[0]["severity"] == "critical"
    assert code == 2


def test_no_eviction_configured(curvine: Stack) -> None:
    """hpkv.yaml turns TTL eviction off; the next apply deploys it and diagnose reads the
    release's values."""
    config = {"curvine": {"eviction": {"ttlAction": "none", "quotaEviction": True}}}
    (curvine.scenario.workdir / "hpkv.yaml").write_text(yaml.safe_dump(config))
    curvine.apply("curvine")
    code, doc = run_json(curvine.scenario, "diagnose")
    [finding] = findings(doc, "curvine.eviction-off")
    assert "ttl_action=none" in finding["evidence"]
    assert "the quota LRU does not evict either" in finding["evidence"]
    assert "curvine.eviction" in finding["remediation"]
    assert finding["objects"] == ["helm release curvine/curvine"]
    assert code == 1


def test_fuse_on_linux_6_kernels(curvine: Stack) -> None:
    [node] = curvine.scenario.nodes(1, kernel="6.1.112-124.190.amzn2023.x86_64")
    _code, doc = run_json(curvine.scenario, "diagnose")
    [finding] = findings(doc, "curvine.fuse-kernel-6x")
    assert f"{node} (6.1.112-124.190.amzn2023.x86_64)" in finding["evidence"]
    assert finding["objects"] == [f"Node/{node}"]
    assert finding["severity"] == "warning"


def test_fuse_kernel_detector_needs_curvine_installed(stack: Stack) -> None:
    stack.scenario.nodes(1, kernel="6.1.112-124.190.amzn2023.x86_64")
    _code, doc = run_json(stack.scenario, "diagnose", "--stage", "curvine")
    assert {d["id"]: d["result"] for d in doc["detectors"]}["curvine.fuse-kernel-6x"] == "skipped"
    assert doc["findings"] == []


def test_csi_sidecar_image_pull_backoff_is_reported_once(curvine: Stack) -> None:
    image = "quay.io/k8scsi/csi-node-driver-registrar:v2.1.0"
    add_csi_node_pod_pulling(
        curvine.kube, CURVINE_NS, "curvine-csi-node-zz9k2", curvine.nodes[0], image
    )
    code, doc = run_json(curvine.scenario, "diagnose")
    [finding] = findings(doc, "curvine.csi-image-pull")
    assert f"ImagePullBackOff for {image} (container node-driver-registrar)" in finding["evidence"]
    assert "no longer published" in finding["evidence"]
    assert "set curvine.csi.registrarImage" in finding["remediation"]
    # The generic image-pull detector saw it too; the Curvine finding supersedes it.
    assert findings(doc, "pods.image-pull-backoff") == []
    generic = {d["id"]: d for d in doc["detectors"]}["pods.image-pull-backoff"]
    assert (generic["findings"], generic["superseded"]) == (0, 1)
    assert code == 2


def test_pvc_pending_with_a_bad_master_addrs(curvine: Stack) -> None:
    curvine.kube.apply_object(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": "curvine-web"},
            "provisioner": "curvine",
            "parameters": {
                "master-addrs": "curvine-master-1.curvine-master.curvine.svc.cluster.local:9000",
                "fs-path": "/l2cache",
                "path-type": "DirectoryOrCreate",
            },
        }
    )
    pvc(curvine.scenario, "cache", "curvine-web", namespace=ENDPOINT_NS)
    code, doc = run_json(curvine.scenario, "diagnose")
    [finding] = findings(doc, "pvc.pending")
    assert f"{ENDPOINT_NS}/cache is Pending" in finding["evidence"]
    assert (
        "port 9000 is not the master's RPC port 8995 (that is its web port)"
        in (finding["evidence"])
    )
    assert "master pod curvine/curvine-master-1 does not exist" in finding["evidence"]
    assert "'hpkv curvine apply' re-creates the class" in finding["remediation"]
    assert code == 2


def test_ebs_csi_role_without_the_hyperpod_permissions_and_with_trust_drift(
    curvine: Stack,
) -> None:
    iam = curvine.aws.client("iam")
    role = "hpkv-hpkv-eks-ebs-csi"
    iam.delete_role_policy(RoleName=role, PolicyName="hpkv-hyperpod-volume-attach")
    trust = iam.get_role(RoleName=role)["Role"]["AssumeRolePolicyDocument"]
    trust["Statement"][0]["Condition"]["StringEquals"] = {
        k: ("system:serviceaccount:kube-system:default" if k.endswith(":sub") else v)
        for k, v in trust["Statement"][0]["Condition"]["StringEquals"].items()
    }
    iam.update_assume_role_policy(RoleName=role, PolicyDocument=json.dumps(trust))
    code, doc = run_json(curvine.scenario, "diagnose")
    by_title = {f["title"]: f for f in findings(doc, "curvine.ebs-csi-driver")}
    permissions = by_title[f"role {role} lacks the HyperPod volume permissions"]
    assert permissions["severity"] == "critical"
    assert "ValidationException" in permissions["evidence"]
    drift = by_title[f"trust policy drift on role {role}"]
    assert "system:serviceaccount:kube-system:ebs-csi-controller-sa" in drift["evidence"]
    assert "hpkv curvine apply --yes" in drift["remediation"]
    assert code == 2
