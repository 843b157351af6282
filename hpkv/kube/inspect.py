"""Pure helpers that read Kubernetes objects (the kubernetes client's V1* models) for problems.

Detectors of every stage use these: container problems (crash loops, image pulls, exec format
errors), pod readiness and ownership, node architecture and kernel. Nothing here calls an API.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

ARCH_LABEL = "kubernetes.io/arch"
CRASH_LOOP = "CrashLoopBackOff"
IMAGE_PULL_REASONS = frozenset(
    {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull"}
)
EXEC_FORMAT_ERROR = "exec format error"
# Restarts after which a container that keeps exiting with an error counts as crash-looping even
# when the kubelet happens to be between back-off waits.
CRASH_RESTARTS = 3


@dataclass(frozen=True)
class ContainerProblem:
    """Why one container of a pod is not running normally."""

    pod: str  # namespace/name
    node: str
    container: str
    image: str
    init: bool
    reason: str  # CrashLoopBackOff, ImagePullBackOff, ...
    message: str
    restarts: int
    last_exit_code: int | None = None
    last_reason: str = ""
    last_message: str = ""

    @property
    def crash_looping(self) -> bool:
        if self.reason == CRASH_LOOP:
            return True
        return self.restarts >= CRASH_RESTARTS and (self.last_exit_code or 0) != 0

    @property
    def image_pull(self) -> bool:
        return self.reason in IMAGE_PULL_REASONS

    @property
    def exec_format_error(self) -> bool:
        text = f"{self.message} {self.last_reason} {self.last_message}".lower()
        return EXEC_FORMAT_ERROR in text

    def describe(self) -> str:
        what = f"container {self.container}" + (" (init)" if self.init else "")
        text = f"{self.pod} {what}: {self.reason or 'restarting'}"
        if self.restarts:
            text += f", {self.restarts} restarts"
        if self.last_exit_code is not None:
            last = f"exit {self.last_exit_code}"
            if self.last_reason:
                last += f" {self.last_reason}"
            if self.last_message:
                last += f": {_one_line(self.last_message)[:200]}"
            text += f", last {last}"
        elif self.message and self.message != self.reason:
            text += f": {_one_line(self.message)[:200]}"
        return text


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def pod_key(pod: Any) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name}"


def pod_ready(pod: Any) -> bool:
    for condition in (pod.status.conditions or []) if pod.status else []:
        if condition.type == "Ready":
            return condition.status == "True"
    return False


def container_problems(pod: Any) -> list[ContainerProblem]:
    """Containers (init containers included) that are waiting with a reason or restarting."""
    status = pod.status
    if status is None:
        return []
    images = {c.name: c.image for c in [*(pod.spec.init_containers or []), *pod.spec.containers]}
    problems = []
    for init, statuses in (
        (True, status.init_container_statuses),
        (False, status.container_statuses),
    ):
        for cs in statuses or []:
            waiting = cs.state.waiting if cs.state else None
            terminated = cs.last_state.terminated if cs.last_state else None
            reason = (waiting.reason or "") if waiting else ""
            restarts = cs.restart_count or 0
            if not reason and not (restarts and terminated and terminated.exit_code):
                continue
            if reason in ("ContainerCreating", "PodInitializing"):
                continue
            problems.append(
                ContainerProblem(
                    pod=pod_key(pod),
                    node=pod.spec.node_name or "",
                    container=cs.name,
                    image=cs.image or images.get(cs.name, ""),
                    init=init,
                    reason=reason,
                    message=(waiting.message or "") if waiting else "",
                    restarts=restarts,
                    last_exit_code=terminated.exit_code if terminated else None,
                    last_reason=(terminated.reason or "") if terminated else "",
                    last_message=(terminated.message or "") if terminated else "",
                )
            )
    return problems


def owner(pod: Any) -> str:
    """'Kind/namespace/name' of the workload that owns the pod (a ReplicaSet reads as its
    Deployment); the pod itself when it has no controller."""
    ns = pod.metadata.namespace
    for ref in pod.metadata.owner_references or []:
        if not ref.controller:
            continue
        if ref.kind == "ReplicaSet":
            template_hash = (pod.metadata.labels or {}).get("pod-template-hash")
            if template_hash and ref.name.endswith(f"-{template_hash}"):
                return f"Deployment/{ns}/{ref.name[: -len(template_hash) - 1]}"
        return f"{ref.kind}/{ns}/{ref.name}"
    return f"Pod/{ns}/{pod.metadata.name}"


def group_by(items: Iterable[Any], key: Callable[[Any], str]) -> dict[str, list[Any]]:
    groups: dict[str, list[Any]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return dict(sorted(groups.items()))


def node_arch(node: Any) -> str:
    labels = node.metadata.labels or {}
    if labels.get(ARCH_LABEL):
        return labels[ARCH_LABEL]
    info = node.status.node_info if node.status else None
    return (info.architecture if info else "") or ""


def kernel_version(node: Any) -> str:
    info = node.status.node_info if node.status else None
    return (info.kernel_version if info else "") or ""


def kernel_major(version: str) -> int | None:
    match = re.match(r"(\d+)\.", version or "")
    return int(match.group(1)) if match else None


def node_ready(node: Any) -> bool:
    for condition in (node.status.conditions or []) if node.status else []:
        if condition.type == "Ready":
            return condition.status == "True"
    return False


def pinned_arch(pod: Any) -> set[str]:
    """Architectures the pod is restricted to by nodeSelector or required node affinity."""
    spec = pod.spec
    arches: set[str] = set()
    selector = spec.node_selector or {}
    if selector.get(ARCH_LABEL):
        arches.add(selector[ARCH_LABEL])
    affinity = spec.affinity.node_affinity if spec.affinity else None
    required = affinity.required_during_scheduling_ignored_during_execution if affinity else None
    for term in (required.node_selector_terms or []) if required else []:
        for expr in term.match_expressions or []:
            if expr.key == ARCH_LABEL and expr.operator == "In":
                arches.update(expr.values or [])
    return arches


def container_env(container: Any) -> dict[str, str | None]:
    """Literal env values of a container (None for valueFrom entries)."""
    return {e.name: e.value for e in container.env or []}
