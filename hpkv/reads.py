"""Reads that several checks and detectors share, memoized per health run.

Inside ``ctx.shared_reads()`` (``hpkv status``, ``hpkv diagnose``) each of these is fetched once,
however many checks ask for it, even concurrently; outside it every call reads afresh (plans and
waits must see the live state). Keys name the API call so a stage can share a read with another
stage by calling the same function.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
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


# --- AWS reads shared by stages 2 and 3 -----------------------------------------------------------
def addon(ctx: RunContext, name: str) -> dict[str, Any] | None:
    """EKS DescribeAddon of ``name`` on the cluster's EKS cluster (None when not installed)."""
    from hpkv.aws import eks

    cluster = eks_cluster(ctx)
    if cluster is None:
        return None
    return ctx.memo(
        ("eks:DescribeAddon", cluster["name"], name),
        lambda: eks.describe_addon(ctx.aws, cluster["name"], name),
    )


def role(ctx: RunContext, name: str) -> dict[str, Any] | None:
    """IAM GetRole (None when the role does not exist)."""
    from hpkv.aws import iam

    return ctx.memo(("iam:GetRole", name), lambda: iam.get_role(ctx.aws, name))


def attached_policies(ctx: RunContext, role_name: str) -> list[str]:
    from hpkv.aws import iam

    return ctx.memo(
        ("iam:ListAttachedRolePolicies", role_name),
        lambda: iam.attached_policies(ctx.aws, role_name),
    )


def inline_policy(ctx: RunContext, role_name: str, policy: str) -> dict[str, Any] | None:
    from hpkv.aws import iam

    return ctx.memo(
        ("iam:GetRolePolicy", role_name, policy),
        lambda: iam.inline_policy(ctx.aws, role_name, policy),
    )


# --- Kubernetes reads by name and of optional APIs ------------------------------------------------
def optional(ctx: RunContext, key: Hashable, what: str, call: Callable[[], Any]) -> Any:
    """An object read by name, None when it does not exist (404), memoized under ``key``."""
    from hpkv.kube import is_status, kube_errors

    def load() -> Any:
        with kube_errors(f"read {what}"):
            try:
                return call()
            except Exception as exc:
                if is_status(exc, 404):
                    return None
                raise

    return ctx.memo(key, load)


def crd(ctx: RunContext, name: str) -> Any:
    """A CustomResourceDefinition by name (None when absent)."""
    return optional(
        ctx,
        ("kube:crd", name),
        f"CRD {name}",
        lambda: ctx.kube.apiextensions.read_custom_resource_definition(name),
    )


def csi_drivers(ctx: RunContext) -> list[Any]:
    return _listed(ctx, "kube:csidrivers", "CSIDrivers", lambda: ctx.kube.storage.list_csi_driver())


def served_kinds(ctx: RunContext, api_version: str) -> set[str]:
    """Kinds the API server serves under ``api_version`` (one discovery request, memoized)."""
    return ctx.memo(("kube:served", api_version), lambda: ctx.kube.served_kinds(api_version))


def serves(ctx: RunContext, api_version: str, kind: str) -> bool:
    return kind in served_kinds(ctx, api_version)


def endpoint_refs(ctx: RunContext) -> list[Any]:
    """Every InferenceEndpointConfig as an ``EndpointRef`` ([] when the CRD is absent)."""
    from hpkv.topology import list_endpoints

    return ctx.memo("kube:inferenceendpointconfigs", lambda: list_endpoints(ctx.kube))


def endpoint_slices(ctx: RunContext, namespace: str, service: str) -> list[Any]:
    """The EndpointSlices of one Service."""
    from kubernetes import client

    return _listed(
        ctx,
        f"kube:endpointslices:{namespace}/{service}",
        f"EndpointSlices of Service {namespace}/{service}",
        lambda: client.DiscoveryV1Api(ctx.kube.api_client).list_namespaced_endpoint_slice(
            namespace, label_selector=f"kubernetes.io/service-name={service}"
        ),
    )


def helm_release_objects(ctx: RunContext, namespace: str, release: str) -> list[Any]:
    """The Secrets (Helm's default storage) or ConfigMaps holding a Helm release's revisions;
    their presence says the release is installed without running helm."""
    selector = f"owner=helm,name={release}"

    def load() -> list[Any]:
        from hpkv.kube import kube_errors

        with kube_errors(f"list the Helm release {namespace}/{release}"):
            found = list(
                ctx.kube.core.list_namespaced_secret(namespace, label_selector=selector).items
            )
            if not found:
                found = list(
                    ctx.kube.core.list_namespaced_config_map(
                        namespace, label_selector=selector
                    ).items
                )
        return found

    return ctx.memo(("kube:helm-release", namespace, release), load)


def custom_objects(
    ctx: RunContext, api_version: str, plural: str, label_selector: str = ""
) -> list[dict[str, Any]]:
    """Cluster-scoped objects of a custom or optional API ([] when the API is not served)."""
    from hpkv.kube import is_status, kube_errors

    group, version = api_version.split("/")

    def load() -> list[dict[str, Any]]:
        with kube_errors(f"list {plural}.{group}"):
            try:
                listed = ctx.kube.custom.list_cluster_custom_object(
                    group, version, plural, label_selector=label_selector
                )
            except Exception as exc:
                if is_status(exc, 404):
                    return []
                raise
        return list(listed.get("items", []))

    return ctx.memo(("kube:custom-list", api_version, plural, label_selector), load)
