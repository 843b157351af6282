"""Names shared across stages: where the operator, its CRDs and Curvine live, and how an inference
endpoint's pods find the L2. Stages read overrides from hpkv.yaml where a key exists
(``curvine.namespace``, ``curvine.pvcName``, ``curvine.storageClassName``, ``l2.mountPath``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpkv.kube import KubeClients

# HyperPod Inference Operator (EKS add-on amazon-sagemaker-hyperpod-inference)
OPERATOR_NAMESPACE = "hyperpod-inference-system"
OPERATOR_DEPLOYMENT = "hyperpod-inference-controller-manager"
OPERATOR_SERVICE_ACCOUNT = "hyperpod-inference-controller-manager"  # its IRSA subject
INFERENCE_GROUP = "inference.sagemaker.aws.amazon.com"
INFERENCE_VERSION = "v1"
INFERENCE_API_VERSION = f"{INFERENCE_GROUP}/{INFERENCE_VERSION}"
ENDPOINT_KIND = "InferenceEndpointConfig"
ENDPOINT_PLURAL = "inferenceendpointconfigs"
REGISTRATION_KIND = "SageMakerEndpointRegistration"
REGISTRATION_PLURAL = "sagemakerendpointregistrations"

# What the operator renders for an InferenceEndpointConfig <name> in <namespace>: a worker
# Deployment <name> (pods labelled app=<name>, vLLM container <name>), a ClusterIP Service
# <name>-routing-service (port 443, plain HTTP) and router pods app=<name>-<namespace>-router in the
# operator's namespace.
WORKER_LABEL = "app"
ROUTING_SERVICE_SUFFIX = "-routing-service"

# Env every worker needs (hpkv's endpoint template sets them): one hash seed across replicas, or
# they never hit each other's cache; the naive serde, as cachegen breaks under the fs L2 connector.
REQUIRED_WORKER_ENV = {"PYTHONHASHSEED": "0", "LMCACHE_REMOTE_SERDE": "naive"}

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


# The routing service listens on 443 but speaks plain HTTP: https:// to it fails with
# "SSL: WRONG_VERSION_NUMBER".
ROUTING_HTTPS = re.compile(r"https://[^\s\"',;]*routing-service[^\s\"',;]*", re.IGNORECASE)


def routing_service(name: str) -> str:
    return f"{name}{ROUTING_SERVICE_SUFFIX}"


def router_selector(name: str, namespace: str) -> str:
    return f"{WORKER_LABEL}={name}-{namespace}-router"


@dataclass(frozen=True, order=True)
class EndpointRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def endpoint_api_served(kube: KubeClients) -> bool:
    """Whether the operator's InferenceEndpointConfig API is served (its CRD is installed)."""
    return kube.serves(INFERENCE_API_VERSION, ENDPOINT_KIND)


def list_endpoints(kube: KubeClients, namespace: str | None = None) -> list[EndpointRef]:
    """InferenceEndpointConfigs in the cluster (all namespaces by default); [] if the CRD is absent.

    One list request (no API discovery): the API answers 404 when the CRD is not served.
    """
    from hpkv.kube import is_status, kube_errors

    with kube_errors("list InferenceEndpointConfigs"):
        try:
            if namespace:
                listed: Any = kube.custom.list_namespaced_custom_object(
                    INFERENCE_GROUP, INFERENCE_VERSION, namespace, ENDPOINT_PLURAL
                )
            else:
                listed = kube.custom.list_cluster_custom_object(
                    INFERENCE_GROUP, INFERENCE_VERSION, ENDPOINT_PLURAL
                )
        except Exception as exc:
            if is_status(exc, 404):
                return []
            raise
    return sorted(
        EndpointRef(i["metadata"]["namespace"], i["metadata"]["name"])
        for i in listed.get("items", [])
    )
