"""Every detector: its broken state seeded in the harness yields its finding; the healthy seeded
installation yields none. Run through `hpkv diagnose -o json` (schema-validated)."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import pytest
import yaml

from hpkv.health import detectors
from tests.harness.aws import Fault
from tests.harness.play import add_csi_node_pod_pulling, add_pod, container_status, ensure_namespace
from tests.harness.stack import Stack
from tests.health.conftest import (
    CURVINE_NS,
    ENDPOINT_NS,
    OPERATOR_NS,
    OPERATOR_RS,
    WORKER_RS,
    Installation,
    findings,
    pvc,
    run_json,
)

pytestmark = [pytest.mark.kube, pytest.mark.aws]


def test_healthy_stack_with_every_stage_installed_has_no_findings(stack: Stack) -> None:
    """Every stage installed by hpkv itself: every detector runs and finds nothing."""
    stack.install()
    code, doc = run_json(stack.scenario, "diagnose")
    assert doc["findings"] == [], doc["findings"]
    assert code == 0 and doc["state"] == "OK"
    results = {d["id"]: (d["result"], d["error"]) for d in doc["detectors"]}
    assert {r for r, _e in results.values()} == {"ran"}, results
    stages = {d["stage"] for d in doc["detectors"]}
    assert stages == {"cluster", "tiered-storage", "operator", "curvine", "l2"}


def test_healthy_installation_has_no_findings(installation: Installation) -> None:
    """Stage 1 only (the later stages' pods stand in): the generic detectors find nothing; stage
    detectors that need their stage installed are skipped, the others (add-ons, webhooks, trust)
    run and find nothing."""
    code, doc = installation.diagnose()
    assert doc["findings"] == [], doc["findings"]
    assert code == 0 and doc["state"] == "OK"
    results = {d["id"]: d for d in doc["detectors"]}
    assert {d["result"] for d in results.values()} == {"ran", "skipped"}
    for detector in results.values():
        if detector["result"] == "skipped":
            assert detector["error"] == f"{detector['stage']} is not installed"
    assert results["operator.webhook-without-endpoints"]["result"] == "ran"
    assert results["curvine.master-not-active"]["result"] == "skipped"
    assert "tiered-storage.node-recovery-missing" in results
    assert results["pods.crash-looping"]["result"] == "ran"


def test_cluster_not_in_service(installation: Installation) -> None:
    cluster = installation.scenario.sagemaker.clusters["demo"]
    cluster.status = cluster.next_status = "Failed"
    cluster.failure_message = "lifecycle script on_create.sh exited 1"
    code, doc = installation.diagnose()
    [finding] = findings(doc, "cluster.not-in-service")
    assert finding["severity"] == "critical"
    assert "is Failed: lifecycle script on_create.sh exited 1" in finding["evidence"]
    assert code == 2


def test_cluster_updating_is_a_warning(installation: Installation) -> None:
    cluster = installation.scenario.sagemaker.clusters["demo"]
    cluster.status, cluster.pending_describes = "Updating", 10**6
    code, doc = installation.diagnose()
    [finding] = findings(doc, "cluster.not-in-service")
    assert finding["severity"] == "warning" and "--wait" in finding["remediation"]
    assert code == 1


def test_node_recovery_missing(installation: Installation) -> None:
    installation.scenario.sagemaker.clusters["demo"].node_recovery = None
    code, doc = installation.diagnose()
    [finding] = findings(doc, "tiered-storage.node-recovery-missing")
    assert "no NodeRecovery" in finding["evidence"]
    assert "--node-recovery Automatic" in finding["remediation"]
    assert finding["stage"] == "tiered-storage"
    assert [f["id"] for f in doc["findings"]] == ["tiered-storage.node-recovery-missing"]
    assert code == 1


def test_ai_toolkit_not_ready_on_a_node(installation: Installation) -> None:
    nodes = installation.nodes
    installation.scenario.ai_toolkit(ready_nodes=nodes[:1])
    add_pod(
        installation.kube,
        "aws-hyperpod",
        f"ai-toolkit-{nodes[1]}",
        node=nodes[1],
        labels={"app": "ai-toolkit"},
        containers=[{"name": "ai-toolkit", "image": "example/ai-toolkit:1.0"}],
        statuses=[
            container_status("ai-toolkit", waiting="CrashLoopBackOff", restarts=4, last_exit=137)
        ],
    )
    code, doc = installation.diagnose()
    [finding] = findings(doc, "tiered-storage.ai-toolkit-not-on-every-node")
    assert finding["severity"] == "warning"
    assert f"{nodes[1]}: aws-hyperpod/ai-toolkit-{nodes[1]}" in finding["evidence"]
    assert "CrashLoopBackOff" in finding["evidence"]
    assert finding["objects"] == [f"Node/{nodes[1]}"]
    # the same pod is also reported as crash-looping
    assert findings(doc, "pods.crash-looping")
    assert code == 2


def test_ai_toolkit_daemonset_missing_is_critical(installation: Installation) -> None:
    installation.kube.delete_object(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "ai-toolkit", "namespace": "aws-hyperpod"},
        }
    )
    code, doc = installation.diagnose()
    [finding] = findings(doc, "tiered-storage.ai-toolkit-not-on-every-node")
    assert finding["severity"] == "critical" and "does not exist" in finding["evidence"]
    assert code == 2


def test_ai_toolkit_detector_is_skipped_when_tiered_storage_is_off(
    installation: Installation,
) -> None:
    installation.scenario.sagemaker.clusters["demo"].tiered_storage = {"Mode": "Disable"}
    code, doc = installation.diagnose()
    result = {d["id"]: d for d in doc["detectors"]}["tiered-storage.ai-toolkit-not-on-every-node"]
    assert result["result"] == "skipped" and "not installed" in result["error"]
    assert code == 0


def test_operator_crash_looping_with_last_log_lines(installation: Installation) -> None:
    pod = f"{OPERATOR_RS}-abcde"
    add_pod(
        installation.kube,
        OPERATOR_NS,
        pod,
        node=installation.nodes[0],
        owner=("ReplicaSet", OPERATOR_RS),
        containers=[{"name": "manager", "image": "example/operator:v3.2"}],
        statuses=[
            container_status(
                "manager",
                waiting="CrashLoopBackOff",
                restarts=7,
                last_exit=1,
                last_message="failed to start manager",
            )
        ],
    )
    installation.log(
        OPERATOR_NS,
        pod,
        "manager",
        "starting\nERROR check-csi-drivers: CSIDriver fsx.csi.aws.com not found\n",
        previous=True,
    )
    code, doc = installation.diagnose()
    [finding] = findings(doc, "pods.crash-looping")
    assert finding["severity"] == "critical"
    assert f"Deployment/{OPERATOR_NS}/hyperpod-inference-controller-manager" in finding["evidence"]
    assert "7 restarts, last exit 1" in finding["evidence"]
    assert "CSIDriver fsx.csi.aws.com not found" in finding["evidence"]
    assert f"logs {pod} -c manager --previous" in finding["remediation"]
    assert not findings(doc, "pods.wrong-architecture")
    assert code == 2


def test_crash_loop_on_an_arm64_node_is_a_wrong_architecture(installation: Installation) -> None:
    [arm] = installation.scenario.nodes(1, arch="arm64", instance_type="ml.c7g.4xlarge")
    add_pod(
        installation.kube,
        OPERATOR_NS,
        f"{OPERATOR_RS}-abcde",
        node=arm,
        owner=("ReplicaSet", OPERATOR_RS),
        containers=[{"name": "manager", "image": "example/operator:v3.1"}],
        statuses=[container_status("manager", waiting="CrashLoopBackOff", restarts=5, last_exit=1)],
    )
    code, doc = installation.diagnose()
    [finding] = findings(doc, "pods.wrong-architecture")
    assert f"on node {arm} (arm64)" in finding["evidence"]
    assert "kubernetes.io/arch In [amd64]" in finding["remediation"]
    assert not findings(doc, "pods.crash-looping")
    assert code == 2


def test_exec_format_error_is_a_wrong_architecture_on_any_node(installation: Installation) -> None:
    add_pod(
        installation.kube,
        CURVINE_NS,
        "curvine-master-0",
        node=installation.nodes[0],
        owner=("StatefulSet", "curvine-master"),
        statuses=[
            container_status(
                "main",
                waiting="CrashLoopBackOff",
                restarts=3,
                last_exit=255,
                last_message="exec /entrypoint.sh: exec format error",
            )
        ],
    )
    _code, doc = installation.diagnose()
    [finding] = findings(doc, "pods.wrong-architecture")
    assert "StatefulSet/curvine/curvine-master" in finding["evidence"]


def test_csi_sidecar_image_pull_backoff(installation: Installation) -> None:
    image = "quay.io/k8scsi/csi-node-driver-registrar:v2.1.0"
    for node in installation.nodes:
        add_csi_node_pod_pulling(
            installation.kube, CURVINE_NS, f"curvine-csi-node-{node[-4:]}", node, image
        )
    code, doc = installation.diagnose()
    [finding] = findings(doc, "pods.image-pull-backoff")
    assert f"ImagePullBackOff for image {image} in 2 pod(s)" in finding["evidence"]
    assert "registry.k8s.io/sig-storage/csi-node-driver-registrar" in finding["remediation"]
    assert code == 2


def test_pvc_pending_on_a_missing_storage_class(installation: Installation) -> None:
    pvc(installation.scenario, "l2", "curvine-scx")
    code, doc = installation.diagnose()
    [finding] = findings(doc, "pvc.pending")
    assert "curvine/l2 is Pending: StorageClass 'curvine-scx' does not exist" in finding["evidence"]
    assert code == 2


def test_pvc_pending_with_a_bad_master_addrs_and_its_events(installation: Installation) -> None:
    installation.kube.apply_object(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": "curvine-bad"},
            "provisioner": "curvine",
            "parameters": {"master-addrs": "curvine-master.curvin.svc.cluster.local:8995"},
        }
    )
    pvc(installation.scenario, "l2", "curvine-bad")
    installation.kube.apply_object(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "l2.1", "namespace": CURVINE_NS},
            "type": "Warning",
            "reason": "ProvisioningFailed",
            "message": "rpc error: dial tcp: lookup curvine-master.curvin.svc: no such host",
            "involvedObject": {
                "kind": "PersistentVolumeClaim",
                "name": "l2",
                "namespace": CURVINE_NS,
            },
        }
    )
    _code, doc = installation.diagnose()
    [finding] = findings(doc, "pvc.pending")
    assert (
        "master-addrs curvine-master.curvin.svc.cluster.local:8995 name(s) no existing Service"
        in finding["evidence"]
    )
    assert "ProvisioningFailed: rpc error: dial tcp: lookup" in finding["evidence"]


def test_pvc_pending_without_master_addrs(installation: Installation) -> None:
    installation.kube.apply_object(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": "curvine-none"},
            "provisioner": "curvine",
        }
    )
    pvc(installation.scenario, "l2", "curvine-none")
    _code, doc = installation.diagnose()
    [finding] = findings(doc, "pvc.pending")
    assert "has no master-addrs parameter" in finding["evidence"]


def test_young_or_consumer_waiting_pvcs_are_not_problems(installation: Installation) -> None:
    """A fresh Pending claim is normal; an old one is not, unless it waits for its first consumer."""
    from hpkv import reads
    from hpkv.config import Settings
    from hpkv.context import RunContext

    installation.kube.apply_object(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": "ebs-sc"},
            "provisioner": "ebs.csi.aws.com",
            "volumeBindingMode": "WaitForFirstConsumer",
        }
    )
    pvc(installation.scenario, "fresh", "curvine-sc")
    pvc(installation.scenario, "lazy", "ebs-sc")
    _code, doc = installation.diagnose()
    assert findings(doc, "pvc.pending") == []

    ctx = RunContext(
        Settings({"cluster": "demo", "kubeconfig": str(installation.scenario.kubeconfig)})
    )
    classes = {sc.metadata.name: sc for sc in reads.storage_classes(ctx)}
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=30)
    claims = {p.metadata.name: p for p in reads.pvcs(ctx)}
    reasons = detectors.pending_reasons(ctx, claims["fresh"], classes, later)
    assert len(reasons) == 1 and "Pending for 30 minutes without events" in reasons[0]
    assert "curvine provisioner" in reasons[0]
    assert detectors.pending_reasons(ctx, claims["lazy"], classes, later) == []


def test_lmcache_degraded_mode_in_logs(installation: Installation) -> None:
    pod = f"{WORKER_RS}-w1"
    installation.log(
        ENDPOINT_NS,
        pod,
        "vllm",
        "INFO starting\nERROR LMCache failed to connect to sagemaker-hyperpod://10.1.0.11:9200 "
        "token=abcdef123456\nWARNING LMCache is running in degraded mode (recompute)\n",
    )
    code, doc = installation.diagnose()
    [finding] = findings(doc, "lmcache.degraded-mode")
    assert (
        f"Deployment/{ENDPOINT_NS}/llama: 1 pod(s) log LMCache degraded mode" in finding["evidence"]
    )
    assert "running in degraded mode (recompute)" in finding["evidence"]
    assert finding["objects"] == [f"Deployment/{ENDPOINT_NS}/llama", f"Pod/{ENDPOINT_NS}/{pod}"]
    assert code == 1


def test_cachegen_serde_with_the_fs_connector(installation: Installation) -> None:
    installation.worker(
        f"{WORKER_RS}-w0", installation.nodes[0], env={"LMCACHE_REMOTE_SERDE": "cachegen"}
    )
    installation.worker(
        f"{WORKER_RS}-w1", installation.nodes[1], env={"LMCACHE_REMOTE_SERDE": "cachegen"}
    )
    _code, doc = installation.diagnose()
    [finding] = findings(doc, "lmcache.cachegen-with-fs-connector")
    assert "in 2 pod(s)" in finding["evidence"] and "naive" in finding["remediation"]


def test_pythonhashseed_unset(installation: Installation) -> None:
    for i, node in enumerate(installation.nodes):
        installation.worker(f"{WORKER_RS}-w{i}", node, env={"PYTHONHASHSEED": None})
    _code, doc = installation.diagnose()
    [finding] = findings(doc, "lmcache.pythonhashseed-unset")
    assert "without a fixed PYTHONHASHSEED" in finding["evidence"]
    assert not findings(doc, "lmcache.replica-mismatch")


def test_replicas_that_differ(installation: Installation) -> None:
    installation.worker(
        f"{WORKER_RS}-w1", installation.nodes[1], env={"PYTHONHASHSEED": "123"}, tp="2"
    )
    _code, doc = installation.diagnose()
    [finding] = findings(doc, "lmcache.replica-mismatch")
    assert (
        f"PYTHONHASHSEED differs ({ENDPOINT_NS}/{WORKER_RS}-w0=0, {ENDPOINT_NS}/{WORKER_RS}-w1=123)"
        in finding["evidence"]
    )
    assert "tensor-parallel-size differs" in finding["evidence"]
    assert "model differs" not in finding["evidence"]


def test_routing_service_called_with_https(installation: Installation) -> None:
    installation.kube.apply_object(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "client", "namespace": ENDPOINT_NS},
            "data": {"ENDPOINT": "https://llama-routing-service.inference:443/invocations"},
        }
    )
    add_pod(
        installation.kube,
        "default",
        "loadgen",
        containers=[
            {
                "name": "client",
                "image": "example/loadgen",
                "env": [{"name": "TARGET", "value": "https://llama-routing-service.inference:443"}],
            }
        ],
    )
    code, doc = installation.diagnose()
    found = findings(doc, "routing.https-scheme")
    assert [f["objects"] for f in found] == [
        [f"ConfigMap/{ENDPOINT_NS}/client"],
        ["Pod/default/loadgen"],
    ]
    assert "WRONG_VERSION_NUMBER" in found[0]["evidence"]
    assert "http://<name>-routing-service.<namespace>:443" in found[0]["remediation"]
    assert code == 1


def test_a_detector_without_an_answer_reads_unknown_without_hanging(
    installation: Installation,
) -> None:
    installation.scenario.aws.inject(
        Fault("sagemaker", "DescribeCluster", kind="delay", seconds=4, times=-1)
    )
    started = time.monotonic()
    code, doc = installation.diagnose("--check-timeout", "1s", "--stage", "tiered-storage")
    assert time.monotonic() - started < 4
    failed = {d["id"]: d["error"] for d in doc["detectors"] if d["result"] == "failed"}
    assert "no answer within 1s" in failed["tiered-storage.node-recovery-missing"]
    assert code == 3 and doc["state"] == "UNKNOWN"


def test_pods_are_inspected_in_endpoint_namespaces_only(
    installation: Installation, shared_dir: Path
) -> None:
    """An InferenceEndpointConfig's namespace is in scope; an unrelated namespace is not."""
    upstream = shared_dir / "upstream" / "hyperpod-inference-operator"
    crd = yaml.safe_load(
        (upstream / "inference.sagemaker.aws.amazon.com_inferenceendpointconfigs.yaml").read_text()
    )
    crd["spec"]["conversion"] = {"strategy": "None"}  # the upstream file is a Helm template
    installation.kube.apply_object(crd)
    text = (upstream / "sample_v1_llama31_8b_kv_cache_l1_l2.yaml").read_text()
    for placeholder, value in {
        "<PLACEHOLDER_TLS_CERT_S3_URI>": "s3://hyperpod-tls-demo/certs",
        "<PLACEHOLDER_MODEL_STORAGE_BUCKET>": "models-bucket",
        "<PLACEHOLDER_L2_CACHE_LOCAL_URL>": "redis://redis.ns-team-a.svc.cluster.local:6379",
    }.items():
        text = text.replace(placeholder, value)
    sample = yaml.safe_load(text)
    ensure_namespace(installation.kube, sample["metadata"]["namespace"])
    installation.kube.wait_until(
        lambda: _served(installation), what="the InferenceEndpointConfig CRD to be served"
    )
    installation.kube.apply_object(sample)
    crashing = [container_status("main", waiting="CrashLoopBackOff", restarts=9, last_exit=2)]
    for namespace in (sample["metadata"]["namespace"], "unrelated"):
        add_pod(
            installation.kube, namespace, "web-0", node=installation.nodes[0], statuses=crashing
        )
    _code, doc = installation.diagnose()
    assert [f["objects"][0] for f in findings(doc, "pods.crash-looping")] == ["Pod/ns-team-a/web-0"]


def _served(installation: Installation) -> bool:
    status, _body = installation.kube.raw(
        "GET", "/apis/inference.sagemaker.aws.amazon.com/v1/inferenceendpointconfigs"
    )
    return status == 200
