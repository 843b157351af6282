"""Playing the HyperPod Inference Operator and its add-ons against the test apiserver.

* :func:`install_inference_crds` applies the real upstream InferenceEndpointConfig and
  SageMakerEndpointRegistration CRDs (read from ``shared/upstream`` at test time; the Helm template
  values in them are filled in as the add-on does), so the apiserver's own validation judges what
  hpkv creates.
* :class:`AddonPlayer` hooks into the EKS emulator: when an add-on becomes ACTIVE it creates what
  that add-on installs (CSIDrivers and the FSx node DaemonSet, cert-manager CRDs, the operator
  Deployment, CRDs and its conversion-webhook Service with a ready EndpointSlice); when one is
  deleted (without ``preserve``) it removes them.
* :func:`play_endpoint` plays the operator for one endpoint: status, worker pods, the routing
  service and a SageMakerEndpointRegistration with a load balancer hostname.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from tests.harness.kube import KubeHarness
from tests.harness.play import ensure_namespace, play_daemonset, pod_status

OPERATOR_NAMESPACE = "hyperpod-inference-system"
OPERATOR_DEPLOYMENT = "hyperpod-inference-controller-manager"
# The add-on's names for what the Helm chart templates as {{ .Values.namePrefix }} etc.
TEMPLATE_VALUES = {
    "{{ .Values.namePrefix }}": "hyperpod-inference",
    "{{ .Values.shortPrefix }}": "hyperpod-inference",
}
CRD_FILES = (
    "inference.sagemaker.aws.amazon.com_inferenceendpointconfigs.yaml",
    "inference.sagemaker.aws.amazon.com_sagemakerendpointregistrations.yaml",
)
CERT_MANAGER_CRDS = {
    "certificates.cert-manager.io": ("Certificate", "certificates"),
    "certificaterequests.cert-manager.io": ("CertificateRequest", "certificaterequests"),
}
CSI_DRIVERS = {
    "aws-mountpoint-s3-csi-driver": "s3.csi.aws.com",
    "aws-fsx-csi-driver": "fsx.csi.aws.com",
}
FSX_NODE_DAEMONSET = "fsx-csi-node"  # in kube-system
CONVERSION_WEBHOOK = "hyperpod-inference-conversion-webhook"  # the CRDs' conversion Service


ALB_POLICY = "AWSLoadBalancerControllerIAMPolicy"


def create_alb_policy(aws: Any) -> None:
    """The AWS Load Balancer Controller policy, created once per account as the controller's
    install guide says (hpkv's ALB role attaches it; it is not an AWS managed policy)."""
    iam = aws.client("iam")
    if any(p["PolicyName"] == ALB_POLICY for p in iam.list_policies(Scope="Local")["Policies"]):
        return
    iam.create_policy(
        PolicyName=ALB_POLICY,
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Action": "elasticloadbalancing:*", "Resource": "*"}
                ],
            }
        ),
    )


def upstream_crd(shared_dir: Path, filename: str) -> dict[str, Any]:
    text = (shared_dir / "upstream" / "hyperpod-inference-operator" / filename).read_text()
    for placeholder, value in TEMPLATE_VALUES.items():
        text = text.replace(placeholder, value)
    return yaml.safe_load(text)


def wait_established(kube: KubeHarness, name: str, timeout: float = 20.0) -> None:
    def established() -> bool:
        crd = kube.get_object("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
        conditions = ((crd or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    kube.wait_until(established, timeout=timeout, what=f"CRD {name} Established")
    kube._resources = None  # the harness's discovery cache


def install_inference_crds(kube: KubeHarness, shared_dir: Path) -> None:
    for filename in CRD_FILES:
        crd = upstream_crd(shared_dir, filename)
        kube.apply_object(crd)
        wait_established(kube, crd["metadata"]["name"])


def remove_inference_crds(kube: KubeHarness, shared_dir: Path) -> None:
    for filename in CRD_FILES:
        kube.delete_object(upstream_crd(shared_dir, filename))


def _simple_crd(name: str, kind: str, plural: str) -> dict[str, Any]:
    group = name.split(".", 1)[1]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": group,
            "names": {
                "kind": kind,
                "plural": plural,
                "singular": kind.lower(),
                "listKind": f"{kind}List",
            },
            "scope": "Namespaced",
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


def _deployment(namespace: str, name: str, *, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "manager", "image": "example/manager:1"}]},
            },
        },
    }


def play_deployment_status(
    kube: KubeHarness, namespace: str, name: str, *, replicas: int, ready: int
) -> None:
    available = ready >= max(1, replicas) or (replicas == 0)
    kube.apply_object(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "status": {
                "observedGeneration": 1,
                "replicas": replicas,
                "readyReplicas": ready,
                "availableReplicas": ready,
                "updatedReplicas": replicas,
                "conditions": [
                    {
                        "type": "Available",
                        "status": "True" if available else "False",
                        "reason": "MinimumReplicasAvailable"
                        if available
                        else "MinimumReplicasUnavailable",
                        "message": "Deployment has minimum availability."
                        if available
                        else "Deployment does not have minimum availability.",
                    }
                ],
            },
        },
        subresource="status",
    )


class AddonPlayer:
    """Plays what each add-on installs in Kubernetes when the EKS emulator settles it."""

    def __init__(
        self, kube: KubeHarness, shared_dir: Path, eks: Any, *, operator_ready: bool = True
    ) -> None:
        self.kube = kube
        self.shared_dir = shared_dir
        self.operator_ready = operator_ready
        self.installed: list[str] = []
        eks.on_active.append(self.on_active)
        eks.on_deleted.append(self.on_deleted)

    def on_active(self, addon: Any) -> None:
        self.install(addon.name)

    def install(self, name: str) -> None:
        """What add-on ``name`` puts in Kubernetes (also usable to play a self-managed install)."""
        if name in self.installed:
            return
        self.installed.append(name)
        if name in CSI_DRIVERS:
            self.kube.apply_object(
                {
                    "apiVersion": "storage.k8s.io/v1",
                    "kind": "CSIDriver",
                    "metadata": {"name": CSI_DRIVERS[name]},
                    "spec": {"attachRequired": False, "podInfoOnMount": True},
                }
            )
            if name == "aws-fsx-csi-driver":
                play_daemonset(self.kube, "kube-system", FSX_NODE_DAEMONSET, self._nodes())
        elif name == "cert-manager":
            for crd, (kind, plural) in CERT_MANAGER_CRDS.items():
                self.kube.apply_object(_simple_crd(crd, kind, plural))
        elif name == "amazon-sagemaker-hyperpod-inference":
            self.install_operator()

    def _nodes(self) -> list[str]:
        status, body = self.kube.raw("GET", "/api/v1/nodes")
        return [n["metadata"]["name"] for n in json.loads(body)["items"]] if status == 200 else []

    def install_operator(self) -> None:
        ensure_namespace(self.kube, OPERATOR_NAMESPACE)
        labels = {"control-plane": "controller-manager"}
        self.kube.apply_object(_deployment(OPERATOR_NAMESPACE, OPERATOR_DEPLOYMENT, labels=labels))
        play_service_endpoints(self.kube, OPERATOR_NAMESPACE, CONVERSION_WEBHOOK, ready=True)
        play_deployment_status(
            self.kube,
            OPERATOR_NAMESPACE,
            OPERATOR_DEPLOYMENT,
            replicas=1,
            ready=1 if self.operator_ready else 0,
        )
        install_inference_crds(self.kube, self.shared_dir)

    def on_deleted(self, addon: Any) -> None:
        name = addon.name
        if name in self.installed:
            self.installed.remove(name)
        if addon.preserve:
            return
        if name in CSI_DRIVERS:
            self.kube.delete_object(
                {
                    "apiVersion": "storage.k8s.io/v1",
                    "kind": "CSIDriver",
                    "metadata": {"name": CSI_DRIVERS[name]},
                }
            )
            if name == "aws-fsx-csi-driver":
                self.kube.delete_object(
                    {
                        "apiVersion": "apps/v1",
                        "kind": "DaemonSet",
                        "metadata": {"name": FSX_NODE_DAEMONSET, "namespace": "kube-system"},
                    }
                )
        elif name == "cert-manager":
            for crd, (kind, plural) in CERT_MANAGER_CRDS.items():
                self.kube.delete_object(_simple_crd(crd, kind, plural))
        elif name == "amazon-sagemaker-hyperpod-inference":
            self.kube.delete_object(
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "metadata": {"name": OPERATOR_DEPLOYMENT, "namespace": OPERATOR_NAMESPACE},
                }
            )
            remove_inference_crds(self.kube, self.shared_dir)


def play_service_endpoints(
    kube: KubeHarness,
    namespace: str,
    name: str,
    *,
    ready: bool,
    port: int = 443,
    target_port: int = 9443,
) -> None:
    """A Service and the EndpointSlice the endpoint-slice controller keeps for it: one address,
    ready or not (``ready=False``: its pods are down, e.g. scaled to 0)."""
    ensure_namespace(kube, namespace)
    kube.apply_object(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"ports": [{"port": port, "targetPort": target_port}]},
        }
    )
    kube.apply_object(
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{name}-abcde",
                "namespace": namespace,
                "labels": {"kubernetes.io/service-name": name},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.1.0.50"], "conditions": {"ready": ready}}],
            "ports": [{"port": target_port, "protocol": "TCP"}],
        }
    )


def play_endpoint(
    kube: KubeHarness,
    name: str,
    namespace: str = "default",
    *,
    state: str = "DeploymentComplete",
    replicas: int = 2,
    ready: int = 2,
    nodes: tuple[str, ...] = ("hyperpod-i-0000", "hyperpod-i-0001"),
    routing: bool = True,
    load_balancer: str | None = "k8s-default-demo-0123456789.us-west-2.elb.amazonaws.com",
    message: str = "",
) -> None:
    """Play the operator reconciling the InferenceEndpointConfig ``namespace/name``."""
    api = "inference.sagemaker.aws.amazon.com/v1"
    ensure_namespace(kube, namespace)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready_condition = "True" if ready >= replicas else "False"
    kube.apply_object(
        {
            "apiVersion": api,
            "kind": "InferenceEndpointConfig",
            "metadata": {"name": name, "namespace": namespace},
            "status": {
                "state": state,
                "replicas": replicas,
                "selector": f"app={name}",
                "conditions": [
                    {
                        "type": "DeploymentReady",
                        "status": ready_condition,
                        "reason": "ReplicasReady" if ready_condition == "True" else "Progressing",
                        "message": message or f"{ready}/{replicas} replicas ready",
                        "lastTransitionTime": now,
                    }
                ],
                "deploymentStatus": {
                    "name": name,
                    "deploymentObjectOverallState": state,
                    "reason": "" if state != "DeploymentFailed" else "ImagePullBackOff",
                    "message": message,
                    "lastUpdated": now,
                    "status": {
                        "replicas": replicas,
                        "readyReplicas": ready,
                        "availableReplicas": ready,
                        "updatedReplicas": replicas,
                    },
                },
            },
        },
        subresource="status",
    )
    labels = {"app": name}
    for i in range(replicas):
        pod = f"{name}-7c9d8f6b5d-{i:05d}"
        containers = [
            {"name": name, "image": "lmcache/vllm-openai"},
            {"name": "reverse-proxy", "image": "proxy"},
            {"name": "otel-collector", "image": "otel"},
        ]
        kube.apply_object(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod, "namespace": namespace, "labels": labels},
                "spec": {"nodeName": nodes[i % len(nodes)], "containers": containers},
            }
        )
        kube.apply_object(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod, "namespace": namespace},
                "status": pod_status(ready=i < ready, containers=[c["name"] for c in containers]),
            },
            subresource="status",
        )
    if routing:
        kube.apply_object(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": f"{name}-routing-service", "namespace": namespace},
                "spec": {
                    "type": "ClusterIP",
                    "selector": {"app": f"{name}-{namespace}-router"},
                    "ports": [{"name": "http", "port": 443, "targetPort": 8081}],
                },
            }
        )
    if load_balancer is not None:
        kube.apply_object(
            {
                "apiVersion": api,
                "kind": "SageMakerEndpointRegistration",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "name": name,
                    "eksClusterDetails": {
                        "name": "hpkv-eks",
                        "arn": "arn:aws:eks:us-west-2:123456789012:cluster/hpkv-eks",
                        "clusterSecurityGroupId": "sg-0123456789abcdef0",
                        "securityGroupIds": ["sg-0123456789abcdef1"],
                        "subnetIds": ["subnet-0123456789abcdef0"],
                        "vpcId": "vpc-0123456789abcdef0",
                    },
                    "executionRole": "arn:aws:iam::123456789012:role/SageMakerHyperPodInference-demo",
                    "imageUri": "lmcache/vllm-openai",
                    "instanceType": "ml.g6e.4xlarge",
                    "loadBalancerHostName": load_balancer,
                    "restApiId": "abc123",
                    "tlsConfig": {
                        "tlsCertificateOutputS3Bucket": "hyperpod-tls-demo",
                        "tlsCertificateS3Keys": [f"certs/{namespace}/{name}.pem"],
                    },
                },
            }
        )
        kube.apply_object(
            {
                "apiVersion": api,
                "kind": "SageMakerEndpointRegistration",
                "metadata": {"name": name, "namespace": namespace},
                "status": {
                    "state": "CreationCompleted",
                    "loadBalancer": {"hostName": load_balancer},
                },
            },
            subresource="status",
        )
