"""Names shared across stages: where the operator, its CRDs and Curvine live, and how an inference
endpoint's pods find the L2. Stages read overrides from hpkv.yaml where a key exists
(``curvine.namespace``, ``curvine.pvcName``, ``curvine.storageClassName``, ``l2.mountPath``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpkv.kube import KubeClients

# HyperPod Inference Operator (EKS add-on amazon-sagemaker-hyperpod-inference)
OPERATOR_NAMESPACE = "hyperpod-inference-system"
OPERATOR_DEPLOYMENT = "hyperpod-inference-controller-manager"
INFERENCE_GROUP = "inference.sagemaker.aws.amazon.com"
INFERENCE_VERSION = "v1"
INFERENCE_API_VERSION = f"{INFERENCE_GROUP}/{INFERENCE_VERSION}"
ENDPOINT_KIND = "InferenceEndpointConfig"
ENDPOINT_PLURAL = "inferenceendpointconfigs"
REGISTRATION_KIND = "SageMakerEndpointRegistration"
REGISTRATION_PLURAL = "sagemakerendpointregistrations"

# Curvine (stage 3) defaults
CURVINE_NAMESPACE = "curvine"
CURVINE_RELEASE = "curvine"
CURVINE_CSI_RELEASE = "curvine-csi"
CURVINE_STORAGE_CLASS = "curvine-sc"
CURVINE_PVC = "curvine-pvc"
CURVINE_FS_PATH = "/l2cache"

# L2 wiring (stage 4) defaults
L2_MOUNT_PATH = "/mnt/curvine/l2cache"
L2_VOLUME_NAME = "curvine-cache"


@dataclass(frozen=True, order=True)
class EndpointRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def list_endpoints(kube: KubeClients, namespace: str | None = None) -> list[EndpointRef]:
    """InferenceEndpointConfigs in the cluster (all namespaces by default); [] if the CRD is absent."""
    from hpkv.errors import NotFound
    from hpkv.kube import kube_errors

    try:
        resource = kube.resource(INFERENCE_API_VERSION, ENDPOINT_KIND)
    except NotFound:
        return []
    with kube_errors("list InferenceEndpointConfigs"):
        items: list[Any] = (
            resource.get(namespace=namespace).items if namespace else resource.get().items
        )
    return sorted(EndpointRef(i.metadata.namespace, i.metadata.name) for i in items)
