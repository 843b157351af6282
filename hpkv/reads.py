"""Reads that several checks and detectors share, memoized per health run.

Inside ``ctx.shared_reads()`` (``hpkv status``, ``hpkv diagnose``) each of these is fetched once,
however many checks ask for it, even concurrently; outside it every call reads afresh (plans and
waits must see the live state). Keys name the API call so a stage can share a read with another
stage by calling the same function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpkv.context import RunContext


def hyperpod_cluster(ctx: RunContext) -> dict[str, Any]:
    """SageMaker DescribeCluster of the configured HyperPod cluster."""
    from hpkv.aws import sagemaker

    name = ctx.require_cluster()
    return ctx.memo(
        ("sagemaker:DescribeCluster", name), lambda: sagemaker.describe_cluster(ctx.aws, name)
    )


def eks_cluster(ctx: RunContext) -> dict[str, Any] | None:
    """EKS DescribeCluster of the cluster orchestrating the HyperPod cluster (None if not EKS)."""
    from hpkv.aws import eks, sagemaker

    name = sagemaker.eks_cluster_name(hyperpod_cluster(ctx))
    if not name:
        return None
    return ctx.memo(("eks:DescribeCluster", name), lambda: eks.describe_cluster(ctx.aws, name))


def _listed(ctx: RunContext, key: str, what: str, call: Callable[[], Any]) -> list[Any]:
    from hpkv.kube import kube_errors

    def load() -> list[Any]:
        with kube_errors(f"list {what}"):
            return list(call().items)

    return ctx.memo(key, load)


def nodes(ctx: RunContext) -> list[Any]:
    """Every Node (V1Node objects)."""
    return _listed(ctx, "kube:nodes", "nodes", lambda: ctx.kube.core.list_node())


def pods(ctx: RunContext) -> list[Any]:
    """Every Pod in every namespace (V1Pod objects)."""
    return _listed(
        ctx,
        "kube:pods",
        "pods in all namespaces",
        lambda: ctx.kube.core.list_pod_for_all_namespaces(),
    )


def pvcs(ctx: RunContext) -> list[Any]:
    """Every PersistentVolumeClaim in every namespace."""
    return _listed(
        ctx,
        "kube:pvcs",
        "PersistentVolumeClaims in all namespaces",
        lambda: ctx.kube.core.list_persistent_volume_claim_for_all_namespaces(),
    )


def storage_classes(ctx: RunContext) -> list[Any]:
    return _listed(
        ctx, "kube:storageclasses", "StorageClasses", lambda: ctx.kube.storage.list_storage_class()
    )


def services(ctx: RunContext) -> list[Any]:
    return _listed(
        ctx,
        "kube:services",
        "Services in all namespaces",
        lambda: ctx.kube.core.list_service_for_all_namespaces(),
    )


def config_maps(ctx: RunContext) -> list[Any]:
    return _listed(
        ctx,
        "kube:configmaps",
        "ConfigMaps in all namespaces",
        lambda: ctx.kube.core.list_config_map_for_all_namespaces(),
    )


def events(ctx: RunContext, namespace: str) -> list[Any]:
    """Core v1 Events of one namespace."""
    return _listed(
        ctx,
        f"kube:events:{namespace}",
        f"events in namespace {namespace}",
        lambda: ctx.kube.core.list_namespaced_event(namespace),
    )


def server_version(ctx: RunContext) -> dict[str, Any]:
    return ctx.memo("kube:version", ctx.kube.server_version)
