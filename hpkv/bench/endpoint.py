"""What the bench needs to know about an inference endpoint (an InferenceEndpointConfig).

The operator renders a Deployment named after the endpoint whose pods carry ``app=<name>``; the
vLLM container is named after the endpoint too and listens on ``worker.modelInvocationPort``. The
routing service is ``<name>-routing-service`` (port 443, plain HTTP) in the endpoint's namespace;
some operator versions put it in ``hyperpod-inference-system`` as ``<name>-<ns>-routing-service``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpkv.errors import NotFound, PreconditionFailed, UsageError
from hpkv.topology import (
    ENDPOINT_KIND,
    INFERENCE_API_VERSION,
    OPERATOR_NAMESPACE,
    list_endpoints,
)

if TYPE_CHECKING:
    from hpkv.kube import KubeClients

DEFAULT_PORT = 8080  # the operator's modelMetrics.port default
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


@dataclass
class PodInfo:
    name: str
    ip: str | None
    node: str | None
    ready: bool
    image: str | None = None
    instance_type: str | None = None
    lmcache_env: dict[str, str] = field(default_factory=dict)

    def to_dict(self, url: str | None = None) -> dict[str, Any]:
        return {
            "name": self.name,
            "ip": self.ip,
            "node": self.node,
            "instanceType": self.instance_type,
            "url": url,
        }


@dataclass
class RouterInfo:
    namespace: str
    service: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.service}.{self.namespace}.svc.cluster.local:{self.port}"


@dataclass
class EndpointInfo:
    namespace: str
    name: str
    spec: dict[str, Any]
    port: int
    pods: list[PodInfo]
    router: RouterInfo | None
    not_ready: list[str] = field(default_factory=list)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def image(self) -> str | None:
        for pod in self.pods:
            if pod.image:
                return pod.image
        return (self.spec.get("worker") or {}).get("image")

    @property
    def instance_type(self) -> str | None:
        declared = self.spec.get("instanceType")
        if declared:
            return str(declared)
        found = sorted({p.instance_type for p in self.pods if p.instance_type})
        return ",".join(found) if found else None

    def pod_url(self, pod: PodInfo) -> str:
        return f"http://{pod.ip}:{self.port}"

    def environment(self) -> dict[str, Any]:
        kv = self.spec.get("kvCacheSpec") or {}
        routing = self.spec.get("intelligentRoutingSpec") or {}
        env = next((p.lmcache_env for p in self.pods if p.lmcache_env), {})
        return {
            "namespace": self.namespace,
            "endpoint": self.name,
            "modelName": self.spec.get("modelName"),
            "replicas": self.spec.get("replicas"),
            "readyReplicas": len(self.pods),
            "instanceType": self.instance_type,
            "image": self.image,
            "routingStrategy": routing.get("routingStrategy") if routing.get("enabled") else None,
            "kvCache": {
                "l1": kv.get("enableL1Cache"),
                "l2": kv.get("enableL2Cache"),
                "l2Backend": (kv.get("l2CacheSpec") or {}).get("l2CacheBackend"),
                "remoteUrl": env.get("LMCACHE_REMOTE_URL"),
                "chunkSize": _int_or_none(env.get("LMCACHE_CHUNK_SIZE")),
            },
        }


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def find_endpoint(
    kube: KubeClients, name: str, namespace: str | None
) -> tuple[str, dict[str, Any]]:
    """(namespace, IEC object) for ``name``; NotFound / UsageError when absent or ambiguous."""
    from hpkv.kube import objects

    if namespace:
        obj = objects.read(kube, INFERENCE_API_VERSION, ENDPOINT_KIND, name, namespace)
        if obj is None:
            raise NotFound(
                f"InferenceEndpointConfig {namespace}/{name} not found",
                fix="check the name with 'kubectl get inferenceendpointconfigs -A'",
            )
        return namespace, obj
    refs = list_endpoints(kube)
    matches = [r for r in refs if r.name == name]
    if not matches:
        known = ", ".join(str(r) for r in refs) or "none"
        raise NotFound(
            f"no InferenceEndpointConfig named '{name}' (endpoints: {known})",
            fix="pass the name of a deployed endpoint (and --namespace if needed)",
        )
    if len(matches) > 1:
        where = ", ".join(r.namespace for r in matches)
        raise UsageError(
            f"endpoint '{name}' exists in several namespaces ({where})",
            fix="pass --namespace to pick one",
        )
    ref = matches[0]
    obj = objects.read(kube, INFERENCE_API_VERSION, ENDPOINT_KIND, ref.name, ref.namespace)
    if obj is None:
        raise NotFound(f"InferenceEndpointConfig {ref} disappeared", fix="rerun")
    return ref.namespace, obj


def worker_port(spec: dict[str, Any], override: int | None) -> int:
    if override:
        return int(override)
    worker = spec.get("worker") or {}
    port = (worker.get("modelInvocationPort") or {}).get("containerPort")
    if port:
        return int(port)
    metrics_port = ((spec.get("metrics") or {}).get("modelMetrics") or {}).get("port")
    return int(metrics_port) if metrics_port else DEFAULT_PORT


def discover(
    kube: KubeClients, name: str, namespace: str | None = None, *, port: int | None = None
) -> EndpointInfo:
    """The endpoint's spec, its ready worker pods and its routing service."""
    from hpkv.kube import kube_errors

    namespace, obj = find_endpoint(kube, name, namespace)
    spec = obj.get("spec") or {}
    with kube_errors(f"list the pods of endpoint {namespace}/{name}"):
        pods = kube.core.list_namespaced_pod(namespace, label_selector=f"app={name}").items
    node_types = _node_instance_types(kube, {p.spec.node_name for p in pods if p.spec.node_name})
    ready: list[PodInfo] = []
    not_ready: list[str] = []
    for pod in sorted(pods, key=lambda p: p.metadata.name):
        info = _pod_info(pod, name, node_types)
        if info.ready and info.ip:
            ready.append(info)
        else:
            not_ready.append(info.name)
    return EndpointInfo(
        namespace=namespace,
        name=name,
        spec=spec,
        port=worker_port(spec, port),
        pods=ready,
        router=_router(kube, name, namespace),
        not_ready=not_ready,
    )


def _pod_info(pod: Any, endpoint: str, node_types: dict[str, str]) -> PodInfo:
    status = pod.status
    conditions = {c.type: c.status for c in (status.conditions or [])} if status else {}
    ready = bool(status and status.phase == "Running" and conditions.get("Ready") == "True")
    containers = pod.spec.containers or []
    main = next(
        (c for c in containers if c.name == endpoint), containers[0] if containers else None
    )
    env: dict[str, str] = {}
    if main is not None:
        for item in main.env or []:
            if item.name.startswith("LMCACHE_") and item.value is not None:
                env[item.name] = item.value
    return PodInfo(
        name=pod.metadata.name,
        ip=status.pod_ip if status else None,
        node=pod.spec.node_name,
        ready=ready,
        image=main.image if main is not None else None,
        instance_type=node_types.get(pod.spec.node_name or ""),
        lmcache_env=env,
    )


def _node_instance_types(kube: KubeClients, nodes: set[str]) -> dict[str, str]:
    from hpkv.errors import HpkvError
    from hpkv.kube import kube_errors

    found: dict[str, str] = {}
    for node in sorted(nodes):
        try:
            with kube_errors(f"read node {node}"):
                labels = kube.core.read_node(node).metadata.labels or {}
        except HpkvError:
            continue  # nodes are cluster-scoped: a namespaced user may not read them
        if labels.get(INSTANCE_TYPE_LABEL):
            found[node] = labels[INSTANCE_TYPE_LABEL]
    return found


def _router(kube: KubeClients, name: str, namespace: str) -> RouterInfo | None:
    from hpkv.kube import is_status, kube_errors

    for svc_namespace, service in (
        (namespace, f"{name}-routing-service"),
        (OPERATOR_NAMESPACE, f"{name}-{namespace}-routing-service"),
    ):
        with kube_errors(f"read Service {svc_namespace}/{service}"):
            try:
                svc = kube.core.read_namespaced_service(service, svc_namespace)
            except Exception as exc:
                if is_status(exc, 404) or is_status(exc, 403):
                    continue
                raise
        ports = svc.spec.ports or []
        return RouterInfo(svc_namespace, service, int(ports[0].port) if ports else 443)
    return None


def require_pods(info: EndpointInfo, count: int, why: str) -> None:
    if len(info.pods) >= count:
        return
    waiting = f" ({', '.join(info.not_ready)} not ready)" if info.not_ready else ""
    raise PreconditionFailed(
        f"{why} needs {count} ready worker pods; endpoint {info.ref} has {len(info.pods)}{waiting}",
        fix=f"scale the endpoint to at least {count} replicas and wait until its pods are Ready",
    )
