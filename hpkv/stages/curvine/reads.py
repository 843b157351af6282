"""Configuration, cluster facts and the reads that stage 3's status and plan share."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from hpkv.config import deep_merge
from hpkv.errors import PreconditionFailed, WaitTimeout
from hpkv.stages.base import Stage
from hpkv.stages.curvine.values import (
    CONFIG_DEFAULTS,
    CSI_CHART,
    GPU_RESOURCE,
    HYPERPOD_LABEL,
    HYPERPOD_VALUE,
    L2_SELECTOR,
    ChartSource,
    GpuNode,
    fullname,
    parse_quantity,
    validate_config,
)


@dataclass
class ReleaseState:
    """A Helm release as planned: the live revision, its values, and what hpkv wants."""

    name: str
    namespace: str
    chart: Any
    revision: Any | None
    live_values: dict[str, Any] | None
    desired: dict[str, Any]
    needs_upgrade: bool

    @property
    def target(self) -> str:
        return f"helm release {self.namespace}/{self.name}"

    @property
    def status(self) -> str:
        if self.revision is None:
            return "absent"
        return str(getattr(self.revision.status, "value", self.revision.status))


class CurvineReads(Stage):
    """Configuration and reads; :class:`~hpkv.stages.curvine.stage.CurvineStage` is the stage."""

    # --- configuration and cluster facts -----------------------------------------------------
    @cached_property
    def cfg(self) -> dict[str, Any]:
        cfg = deep_merge(CONFIG_DEFAULTS, self.ctx.settings.section("curvine"))
        validate_config(cfg)
        return cfg

    @property
    def namespace(self) -> str:
        return self.cfg["namespace"]

    @property
    def release(self) -> str:
        return self.cfg["release"]

    @property
    def csi_release(self) -> str:
        return self.cfg["csiRelease"]

    @property
    def master_base(self) -> str:
        return f"{fullname(self.release)}-master"

    @cached_property
    def eks_cluster(self) -> dict[str, Any]:
        from hpkv import reads

        cluster = reads.eks_cluster(self.ctx)  # shared in a health run, afresh otherwise
        if cluster is None:
            raise PreconditionFailed(
                f"HyperPod cluster '{self.ctx.require_cluster()}' is not orchestrated by EKS",
                fix="hpkv supports HyperPod clusters with the EKS orchestrator only",
            )
        return cluster

    @property
    def account(self) -> str:
        return str(self.eks_cluster["arn"]).split(":")[4]

    @property
    def role_name(self) -> str:
        from hpkv.aws import ebs_csi

        configured = self.cfg["ebsCsi"].get("roleName")
        return configured or ebs_csi.default_role_name(self.eks_cluster["name"])

    def gpu_nodes(self) -> list[GpuNode]:
        from hpkv import reads

        items = [
            n
            for n in reads.nodes(self.ctx)
            if (n.metadata.labels or {}).get(HYPERPOD_LABEL) == HYPERPOD_VALUE
        ]
        nodes = []
        for node in items:
            capacity = (node.status.capacity if node.status else None) or {}
            gpus = capacity.get(GPU_RESOURCE)
            if not gpus or parse_quantity(gpus) <= 0:
                continue
            disk = capacity.get("ephemeral-storage")
            info = node.status.node_info
            nodes.append(
                GpuNode(
                    name=node.metadata.name,
                    kernel=info.kernel_version if info else "",
                    disk_bytes=parse_quantity(disk) if disk else None,
                )
            )
        return sorted(nodes, key=lambda n: n.name)

    def pvc_namespaces(self) -> list[str]:
        from hpkv import reads

        namespaces = {ref.namespace for ref in reads.endpoint_refs(self.ctx)}
        namespaces.update(self.cfg["pvcNamespaces"])
        return sorted(namespaces)

    # --- Helm --------------------------------------------------------------------------------
    def chart_source(self, chart: str) -> ChartSource:
        version = self.cfg["chartVersion"]
        if chart == CSI_CHART:
            version = self.cfg["csiChartVersion"] or version
        return ChartSource(self.cfg["chartRepo"], chart, version)

    def fetch_chart(self, source: ChartSource) -> Any:
        ref, repo, version = source.locate()
        chart = self.ctx.helm.chart(ref, repo=repo, version=version)
        found = str(chart.metadata.version)
        if chart.metadata.name != source.name or found != source.version:
            raise PreconditionFailed(
                f"the chart at {ref} is {chart.metadata.name} {found}, not {source}",
                fix="point curvine.chartRepo at the right charts, or set curvine.chartVersion",
            )
        return chart

    def release_state(self, name: str, chart: Any, desired: dict[str, Any]) -> ReleaseState:
        helm = self.ctx.helm
        revision = helm.current_revision(name, self.namespace)
        live = helm.release_values(revision) if revision is not None else None
        return ReleaseState(
            name=name,
            namespace=self.namespace,
            chart=chart,
            revision=revision,
            live_values=live,
            desired=desired,
            needs_upgrade=helm.needs_upgrade(revision, chart, desired),
        )

    def _ensure(self, name: str, chart: Any, values: dict[str, Any]) -> Any:
        return self.ctx.helm.ensure(
            name, chart, values, namespace=self.namespace, timeout=self.ctx.options.timeout
        )

    # --- Kubernetes reads --------------------------------------------------------------------
    def master_pvcs(self) -> list[str]:
        """PVCs holding the master's metadata/journal (they outlive the release)."""
        from hpkv.kube import kube_errors

        with kube_errors(f"list PVCs in {self.namespace}"):
            items = self.ctx.kube.core.list_namespaced_persistent_volume_claim(self.namespace).items
        names = []
        for pvc in items:
            labels = pvc.metadata.labels or {}
            by_label = (
                labels.get("app.kubernetes.io/instance") == self.release
                and labels.get("app.kubernetes.io/component") == "master"
            )
            if by_label or f"-{self.master_base}-" in pvc.metadata.name:
                names.append(pvc.metadata.name)
        return sorted(names)

    def storage_classes(self) -> list[dict[str, Any]]:
        from hpkv.kube import kube_errors

        with kube_errors("list StorageClasses"):
            items = self.ctx.kube.storage.list_storage_class().items
        return [self.ctx.kube.api_client.sanitize_for_serialization(sc) for sc in items]

    def l2_pvcs(self) -> list[Any]:
        from hpkv.kube import kube_errors

        with kube_errors("list the L2 PVCs"):
            items = self.ctx.kube.core.list_persistent_volume_claim_for_all_namespaces(
                label_selector=L2_SELECTOR
            ).items
        return [p for p in items if p.metadata.name == self.cfg["pvcName"]]

    def _wait_until(
        self,
        what: str,
        list_call: Callable[..., Any],
        kwargs: dict[str, Any],
        done: Callable[[list[Any]], tuple[bool, str]],
        *,
        fix: str,
    ) -> None:
        """List, test, and block on a watch from that list's version until done or timeout."""
        from kubernetes import watch

        from hpkv.kube import kube_errors

        timeout = self.ctx.options.timeout
        deadline = time.monotonic() + timeout
        with self.ctx.reporter.waiting(f"waiting for {what}"):
            while True:
                with kube_errors(f"wait for {what}"):
                    listing = list_call(**kwargs)
                ok, detail = done(listing.items)
                if ok:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WaitTimeout(
                        f"timed out after {int(timeout)}s waiting for {what}: {detail}", fix=fix
                    )
                seconds = max(1, int(min(remaining, 30)))
                w = watch.Watch()
                with kube_errors(f"watch for {what}"):
                    for _event in w.stream(
                        list_call,
                        resource_version=listing.metadata.resource_version,
                        timeout_seconds=seconds,
                        _request_timeout=seconds + 5,
                        **kwargs,
                    ):
                        w.stop()
                        break
