"""Stage 2's detectors (hpkv.stages.operator): each broken state seeded on a cluster where
'hpkv operator apply' ran against the AWS emulator and the add-ons were played in Kubernetes."""

from __future__ import annotations

import json

import pytest

from tests.harness.inference import CONVERSION_WEBHOOK, play_service_endpoints
from tests.harness.play import add_pod, container_status
from tests.harness.stack import OPERATOR_NS, Stack
from tests.health.conftest import findings, run_json

pytestmark = [pytest.mark.kube, pytest.mark.aws, pytest.mark.helm]

OPERATOR_ADDON = "amazon-sagemaker-hyperpod-inference"
WEBHOOK_ISSUE = {
    "code": "AdmissionRequestDenied",
    "message": 'conversion webhook for inference.sagemaker.aws.amazon.com/v1alpha1 failed: Post "'
    "https://hyperpod-inference-conversion-webhook.hyperpod-inference-system.svc:443/convert"
    '?timeout=30s": no endpoints available for service "hyperpod-inference-conversion-webhook"',
    "resourceIds": [],
}


def _kueue_scaled_to_zero(stack: Stack) -> None:
    """Kueue's webhook configuration with its controller scaled to 0: no ready endpoints."""
    play_service_endpoints(stack.kube, "kueue-system", "kueue-webhook-service", ready=False)
    stack.kube.apply_object(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "kueue-validating-webhook-configuration"},
            "webhooks": [
                {
                    "name": "vworkload.kb.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "clientConfig": {
                        "service": {
                            "namespace": "kueue-system",
                            "name": "kueue-webhook-service",
                            "path": "/validate-kueue-x-k8s-io-v1beta1-workload",
                        }
                    },
                    # Only Kueue's own kind here, so the harness keeps working meanwhile.
                    "rules": [
                        {
                            "apiGroups": ["kueue.x-k8s.io"],
                            "apiVersions": ["v1beta1"],
                            "operations": ["CREATE"],
                            "resources": ["workloads"],
                        }
                    ],
                }
            ],
        }
    )


def test_addon_create_failed_behind_a_kueue_webhook_without_endpoints(stack: Stack) -> None:
    """The incident in the reference: Kueue scaled to 0, the operator add-on ends CREATE_FAILED.
    Both are found, with the health issue verbatim and the fix it points to."""
    _kueue_scaled_to_zero(stack)
    stack.aws.extensions["eks"].fail_next(OPERATOR_ADDON, "CREATE_FAILED", [WEBHOOK_ISSUE])
    failed = stack.apply("operator", check=False)
    assert failed.exit_code != 0 and "CREATE_FAILED" in failed.stderr

    code, doc = run_json(stack.scenario, "diagnose")
    [addon] = findings(doc, "operator.addon-unhealthy")
    assert addon["severity"] == "critical" and addon["objects"] == [f"eks addon/{OPERATOR_ADDON}"]
    assert f"add-on {OPERATOR_ADDON} is CREATE_FAILED at v1.3.0-eksbuild.1" in addon["evidence"]
    assert (
        'no endpoints available for service "hyperpod-inference-conversion-webhook"'
        in (addon["evidence"])
    )
    assert "kueue-controller-manager --replicas=1" in addon["remediation"]
    assert "--addon-name amazon-sagemaker-hyperpod-inference" in addon["remediation"]
    [webhook] = findings(doc, "operator.webhook-without-endpoints")
    assert webhook["objects"] == ["Service/kueue-system/kueue-webhook-service"]
    assert "has no ready endpoints" in webhook["evidence"]
    assert (
        "webhook vworkload.kb.io (ValidatingWebhookConfiguration kueue-validating-"
        in (webhook["evidence"])
    )
    assert "Kueue is scaled to 0" in webhook["remediation"]
    assert code == 2


def test_a_dead_webhook_is_found_before_the_operator_is_installed(stack: Stack) -> None:
    _kueue_scaled_to_zero(stack)
    _code, doc = run_json(stack.scenario, "diagnose", "--stage", "operator")
    results = {d["id"]: d["result"] for d in doc["detectors"]}
    assert results["operator.csi-driver-missing"] == "skipped"  # expected missing before install
    assert results["operator.webhook-without-endpoints"] == "ran"
    assert [f["id"] for f in doc["findings"]] == ["operator.webhook-without-endpoints"]


def test_conversion_webhook_without_endpoints(stack: Stack) -> None:
    stack.install(["operator"])
    play_service_endpoints(stack.kube, OPERATOR_NS, CONVERSION_WEBHOOK, ready=False)
    code, doc = run_json(stack.scenario, "diagnose")
    [finding] = findings(doc, "operator.webhook-without-endpoints")
    assert finding["objects"] == [f"Service/{OPERATOR_NS}/{CONVERSION_WEBHOOK}"]
    assert (
        "it serves the conversion webhook of CRD "
        "inferenceendpointconfigs.inference.sagemaker.aws.amazon.com" in finding["evidence"]
    )
    assert "logs deployment/hyperpod-inference-controller-manager" in finding["remediation"]
    assert code == 2


def test_missing_csi_drivers_and_fsx_node_daemonset_with_a_degraded_addon(stack: Stack) -> None:
    stack.install(["operator"])
    kube, eks = stack.kube, stack.aws.extensions["eks"]
    kube.delete_object(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIDriver",
            "metadata": {"name": "s3.csi.aws.com"},
        }
    )
    kube.delete_object(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "fsx-csi-node", "namespace": "kube-system"},
        }
    )
    fsx = eks.addons[("hpkv-eks", "aws-fsx-csi-driver")]
    fsx.status = "DEGRADED"
    fsx.issues = [
        {
            "code": "InsufficientNumberOfReplicas",
            "message": "DaemonSet fsx-csi-node is missing",
            "resourceIds": ["kube-system/fsx-csi-node"],
        }
    ]
    code, doc = run_json(stack.scenario, "diagnose")
    by_object = {f["objects"][0]: f for f in findings(doc, "operator.csi-driver-missing")}
    s3 = by_object["CSIDriver/s3.csi.aws.com"]
    assert "check-csi-drivers init container waits for it" in s3["evidence"]
    assert (
        "aws eks update-addon --cluster-name hpkv-eks --addon-name aws-mountpoint-s3-csi-driver "
        "--resolve-conflicts OVERWRITE" in s3["remediation"]
    )
    fsx_node = by_object["DaemonSet/kube-system/fsx-csi-node"]
    assert "driver name fsx.csi.aws.com not found" in fsx_node["evidence"]
    assert (
        "--addon-name aws-fsx-csi-driver --resolve-conflicts OVERWRITE" in fsx_node["remediation"]
    )
    [degraded] = findings(doc, "operator.addon-unhealthy")
    assert "aws-fsx-csi-driver is DEGRADED" in degraded["evidence"]
    assert (
        "[InsufficientNumberOfReplicas] DaemonSet fsx-csi-node is missing" in degraded["evidence"]
    )
    assert "fsx-csi-node DaemonSet is missing" in degraded["remediation"]
    assert code == 2


def test_cert_manager_crds_missing(stack: Stack) -> None:
    stack.install(["operator"])
    crd = "certificaterequests.cert-manager.io"
    stack.kube.delete_object(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": crd},
        }
    )

    # The apiserver removes a deleted CRD, then its kind from discovery, asynchronously.
    def gone() -> bool:
        kube = stack.kube
        if kube.get_object("apiextensions.k8s.io/v1", "CustomResourceDefinition", crd):
            return False
        status, body = kube.raw("GET", "/apis/cert-manager.io/v1")
        kinds = {r["kind"] for r in json.loads(body)["resources"]} if status == 200 else set()
        return "CertificateRequest" not in kinds

    stack.kube.wait_until(gone, timeout=30, what=f"CRD {crd} to be gone")
    code, doc = run_json(stack.scenario, "diagnose")
    [finding] = findings(doc, "operator.cert-manager-crds-missing")
    assert finding["objects"] == ["CustomResourceDefinition/certificaterequests.cert-manager.io"]
    assert "the operator never starts" in finding["evidence"]
    assert "the cert-manager add-on is ACTIVE" in finding["remediation"]
    assert code == 2


def test_irsa_role_trust_drift(stack: Stack) -> None:
    stack.install(["operator"])
    iam = stack.aws.client("iam")
    trust = iam.get_role(RoleName="HyperPodInference-demo-Keda")["Role"]["AssumeRolePolicyDocument"]
    condition = trust["Statement"][0]["Condition"]["StringEquals"]
    subject = next(k for k in condition if k.endswith(":sub"))
    condition[subject] = "system:serviceaccount:keda:keda-operator"  # moved by hand
    iam.update_assume_role_policy(
        RoleName="HyperPodInference-demo-Keda", PolicyDocument=json.dumps(trust)
    )
    code, doc = run_json(stack.scenario, "diagnose")
    [finding] = findings(doc, "operator.irsa-trust-drift")
    assert finding["objects"] == ["iam role/HyperPodInference-demo-Keda"]
    assert finding["severity"] == "warning"
    assert (
        "lacks sts:AssumeRoleWithWebIdentity for "
        "system:serviceaccount:hyperpod-inference-system:keda-operator" in finding["evidence"]
    )
    assert "hpkv operator apply --yes" in finding["remediation"]
    assert code == 1


def test_operator_pods_crash_looping_in_its_namespace(stack: Stack) -> None:
    """The generic detectors cover the operator's namespace (the stage names it); on a node of
    another architecture the crash is reported as that."""
    stack.install(["operator"])
    replica_set = "hyperpod-inference-controller-manager-7f9b8c6d5"
    add_pod(
        stack.kube,
        OPERATOR_NS,
        f"{replica_set}-abcde",
        node=stack.nodes[0],
        owner=("ReplicaSet", replica_set),
        containers=[{"name": "manager", "image": "example/operator:v3.2"}],
        statuses=[container_status("manager", waiting="CrashLoopBackOff", restarts=6, last_exit=1)],
    )
    code, doc = run_json(stack.scenario, "diagnose")
    [finding] = findings(doc, "pods.crash-looping")
    assert (
        finding["objects"][0] == f"Deployment/{OPERATOR_NS}/hyperpod-inference-controller-manager"
    )
    [arm] = stack.scenario.nodes(1, arch="arm64", instance_type="ml.c7g.4xlarge")
    add_pod(
        stack.kube,
        OPERATOR_NS,
        f"{replica_set}-fghij",
        node=arm,
        owner=("ReplicaSet", replica_set),
        containers=[{"name": "manager", "image": "example/operator:v3.1"}],
        statuses=[container_status("manager", waiting="CrashLoopBackOff", restarts=5, last_exit=1)],
    )
    _code, doc = run_json(stack.scenario, "diagnose")
    [wrong] = findings(doc, "pods.wrong-architecture")
    assert f"on node {arm} (arm64)" in wrong["evidence"]
    assert code == 2
