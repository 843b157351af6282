"""Helpers that play Kubernetes controllers and kubelets against the test apiserver."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.harness.kube import KubeHarness

HYPERPOD_LABELS = {
    "sagemaker.amazonaws.com/compute-type": "hyperpod",
    "kubernetes.io/arch": "amd64",
    "kubernetes.io/os": "linux",
}


def add_nodes(
    kube: KubeHarness,
    names: Iterable[str],
    *,
    instance_type: str = "ml.g6e.4xlarge",
    gpus: int = 1,
    kernel: str = "5.10.238-231.953.amzn2.x86_64",
    arch: str = "amd64",
    labels: dict[str, str] | None = None,
    ready: bool = True,
) -> list[str]:
    created = []
    for name in names:
        node_labels = {
            **HYPERPOD_LABELS,
            "kubernetes.io/arch": arch,
            "node.kubernetes.io/instance-type": instance_type,
            "kubernetes.io/hostname": name,
            **(labels or {}),
        }
        kube.apply_object(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": node_labels}}
        )
        capacity = {
            "cpu": "16",
            "memory": "128Gi",
            "pods": "110",
            "nvidia.com/gpu": str(gpus),
            "ephemeral-storage": "1900Gi",
        }
        kube.apply_object(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name},
                "status": {
                    "capacity": capacity,
                    "allocatable": capacity,
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True" if ready else "False",
                            "reason": "KubeletReady",
                            "message": "kubelet is posting ready status",
                        }
                    ],
                    "nodeInfo": {
                        "kernelVersion": kernel,
                        "architecture": arch,
                        "operatingSystem": "linux",
                        "osImage": "Amazon Linux 2",
                        "containerRuntimeVersion": "containerd://1.7.27",
                        "kubeletVersion": "v1.33.0",
                        "kubeProxyVersion": "v1.33.0",
                        "machineID": name,
                        "systemUUID": name,
                        "bootID": name,
                    },
                    "addresses": [{"type": "InternalIP", "address": f"10.1.0.{len(created) + 10}"}],
                },
            },
            subresource="status",
        )
        created.append(name)
    return created


def ensure_namespace(kube: KubeHarness, name: str) -> None:
    kube.apply_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def pod_status(
    ready: bool = True,
    phase: str = "Running",
    containers: Iterable[str] = ("main",),
    waiting_reason: str | None = None,
    restarts: int = 0,
) -> dict[str, Any]:
    statuses = []
    for name in containers:
        state: dict[str, Any] = {"running": {"startedAt": "2026-11-29T00:00:00Z"}}
        if waiting_reason:
            state = {"waiting": {"reason": waiting_reason, "message": waiting_reason}}
        statuses.append(
            {
                "name": name,
                "ready": ready and not waiting_reason,
                "restartCount": restarts,
                "image": "example",
                "imageID": "",
                "state": state,
            }
        )
    return {
        "phase": phase,
        "conditions": [
            {"type": "Ready", "status": "True" if ready and not waiting_reason else "False"}
        ],
        "containerStatuses": statuses,
    }


def play_daemonset(
    kube: KubeHarness,
    namespace: str,
    name: str,
    nodes: Iterable[str],
    *,
    labels: dict[str, str] | None = None,
    ready_nodes: Iterable[str] | None = None,
    image: str = "public.ecr.aws/example/ai-toolkit:1.0",
) -> None:
    """Create a DaemonSet and play its controller: one pod per node, status written."""
    labels = labels or {"app": name}
    nodes = list(nodes)
    ready = set(nodes if ready_nodes is None else ready_nodes)
    ensure_namespace(kube, namespace)
    kube.apply_object(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": name, "image": image}]},
                },
            },
        }
    )
    for node in nodes:
        pod_name = f"{name}-{node}"[:63]
        kube.apply_object(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod_name, "namespace": namespace, "labels": labels},
                "spec": {"nodeName": node, "containers": [{"name": name, "image": image}]},
            }
        )
        kube.apply_object(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod_name, "namespace": namespace},
                "status": pod_status(ready=node in ready, containers=[name]),
            },
            subresource="status",
        )
    kube.apply_object(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": namespace},
            "status": {
                "desiredNumberScheduled": len(nodes),
                "currentNumberScheduled": len(nodes),
                "numberReady": len(ready & set(nodes)),
                "numberAvailable": len(ready & set(nodes)),
                "numberMisscheduled": 0,
                "updatedNumberScheduled": len(nodes),
                "observedGeneration": 1,
            },
        },
        subresource="status",
    )


def container_status(
    name: str = "main",
    *,
    ready: bool = True,
    waiting: str | None = None,
    message: str = "",
    restarts: int = 0,
    last_exit: int | None = None,
    last_reason: str = "",
    last_message: str = "",
    image: str = "example",
) -> dict[str, Any]:
    """One containerStatuses entry: running, or waiting with a reason; optionally a last exit."""
    status: dict[str, Any] = {
        "name": name,
        "ready": ready and waiting is None,
        "restartCount": restarts,
        "image": image,
        "imageID": "",
        "state": {"waiting": {"reason": waiting, "message": message or waiting}}
        if waiting
        else {"running": {"startedAt": "2026-11-29T00:00:00Z"}},
    }
    if last_exit is not None:
        status["lastState"] = {
            "terminated": {
                "exitCode": last_exit,
                "reason": last_reason or "Error",
                "message": last_message,
                "startedAt": "2026-11-29T00:00:00Z",
                "finishedAt": "2026-11-29T00:00:05Z",
            }
        }
    return status


def add_pod(
    kube: KubeHarness,
    namespace: str,
    name: str,
    *,
    node: str | None = None,
    containers: list[dict[str, Any]] | None = None,
    statuses: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    owner: tuple[str, str] | None = None,
    spec: dict[str, Any] | None = None,
    phase: str = "Running",
) -> None:
    """Create a pod and play its kubelet: write the given container statuses (default: ready).

    ``owner`` is (kind, name) of its controller, e.g. ("ReplicaSet", "web-5d8f9c7b4")."""
    ensure_namespace(kube, namespace)
    containers = containers or [{"name": "main", "image": "example"}]
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
    if owner is not None:
        kind, owner_name = owner
        metadata["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": kind,
                "name": owner_name,
                "uid": f"uid-{owner_name}",
                "controller": True,
            }
        ]
        if kind == "ReplicaSet":
            metadata["labels"]["pod-template-hash"] = owner_name.rsplit("-", 1)[-1]
    body: dict[str, Any] = {"containers": containers, **(spec or {})}
    if node:
        body["nodeName"] = node
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}
    # A pod's spec is immutable: replace an existing one (at once; no kubelet confirms deletion).
    kube.raw("DELETE", kube.object_path(pod) + "?gracePeriodSeconds=0")
    kube.apply_object(pod)
    statuses = statuses or [
        container_status(c["name"], image=c.get("image", "example")) for c in containers
    ]
    ready = all(s["ready"] for s in statuses)
    kube.apply_object(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "status": {
                "phase": phase,
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                "containerStatuses": statuses,
            },
        },
        subresource="status",
    )


def write_pod_log(
    root: Path, namespace: str, pod: str, container: str, text: str, *, previous: bool = False
) -> None:
    """Play the kubelet's log for hpkv's pod-log seam (``HPKV_POD_LOGS_DIR=root``)."""
    from hpkv.kube.podlogs import log_path

    path = log_path(root, namespace, pod, container, previous=previous)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def add_csi_node_pod_pulling(
    kube: Any, namespace: str, name: str, node: str, sidecar_image: str
) -> None:
    """A Curvine CSI node pod whose registrar sidecar cannot pull ``sidecar_image``."""
    add_pod(
        kube,
        namespace,
        name,
        node=node,
        owner=("DaemonSet", "curvine-csi-node"),
        containers=[
            {"name": "csi-plugin", "image": "ghcr.io/curvineio/curvine-csi:v0.4.1"},
            {"name": "node-driver-registrar", "image": sidecar_image},
        ],
        statuses=[
            container_status("csi-plugin"),
            container_status(
                "node-driver-registrar",
                waiting="ImagePullBackOff",
                image=sidecar_image,
                message=f'Back-off pulling image "{sidecar_image}"',
            ),
        ],
    )
