"""Inference workloads as the HyperPod operator renders them, and the controllers that run them.

* :func:`install_endpoint_crd` / :func:`create_endpoint`: the real InferenceEndpointConfig CRD
  (from ``shared/upstream``) and an endpoint made from the upstream sample.
* :func:`operator_deployment`: a worker Deployment shaped like the operator's (three containers:
  vLLM named after the endpoint, reverse-proxy, otel-collector; the LMCache env it injects).
* :class:`DeploymentPlayer`: plays the Deployment/ReplicaSet controllers, the scheduler and the
  kubelet for chosen Deployments, creating pods **through the API** (so admission runs).
* :class:`FakePods`: answers hpkv's pod exec seam (``HPKV_POD_ROUTES``); exec runs the command
  for real with the pod's mount path mapped to a local directory. Logs go through the pod-log
  seam (``HPKV_POD_LOGS_DIR``): :meth:`FakePods.log` writes them there.
"""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from tests.harness.kube import KubeHarness
from tests.harness.play import ensure_namespace, pod_status, write_pod_log

IEC_API = "inference.sagemaker.aws.amazon.com/v1"
OPERATOR_NAMESPACE = "hyperpod-inference-system"
OPERATOR_DEPLOYMENT = "hyperpod-inference-controller-manager"
KV_TRANSFER_CONFIG = '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'
HYPERPOD_SHM_CONFIG = '{"sagemaker_hyperpod_shared_memory_name": "ai_toolkit_cache"}'


def install_endpoint_crd(kube: KubeHarness, shared_dir: Path) -> None:
    """Apply the upstream InferenceEndpointConfig CRD; its conversion webhook is chart-templated
    (``{{ .Values... }}``) and has no server here, so conversion is set to None."""
    path = (
        shared_dir
        / "upstream/hyperpod-inference-operator"
        / "inference.sagemaker.aws.amazon.com_inferenceendpointconfigs.yaml"
    )
    crd = yaml.safe_load(path.read_text())
    crd["spec"]["conversion"] = {"strategy": "None"}
    crd["metadata"].pop("annotations", None)
    kube.apply_object(crd)

    def established() -> bool:
        live = kube.get_object(
            "apiextensions.k8s.io/v1", "CustomResourceDefinition", crd["metadata"]["name"]
        )
        conditions = ((live or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    kube.wait_until(established, what="the InferenceEndpointConfig CRD to be established")
    kube._resources = None


def create_endpoint(kube: KubeHarness, shared_dir: Path, namespace: str, name: str) -> None:
    sample = yaml.safe_load(
        (
            shared_dir
            / "upstream/hyperpod-inference-operator/sample_v1_llama31_8b_kv_cache_l1_l2.yaml"
        ).read_text()
    )
    sample["metadata"] = {"name": name, "namespace": namespace}
    sample["spec"]["endpointName"] = f"{name}-sme"
    sample["spec"]["modelSourceConfig"]["s3Storage"]["bucketName"] = "models"
    sample["spec"]["kvCacheSpec"]["l2CacheSpec"] = {"l2CacheBackend": "tieredstorage"}
    sample["spec"]["tlsConfig"] = {"tlsCertificateOutputS3Uri": "s3://tls-certs/certs"}
    ensure_namespace(kube, namespace)
    kube.apply_object(sample)


def operator_deployment(
    namespace: str,
    name: str,
    *,
    replicas: int = 2,
    gpus: int = 1,
    model: str = "/opt/ml/model",
    extra_env: list[dict[str, Any]] | None = None,
    extra_args: list[str] | None = None,
) -> dict[str, Any]:
    """The worker Deployment the operator renders for an endpoint with L1+L2 enabled."""
    vllm = {
        "name": name,
        "image": "lmcache/vllm-openai:v0.3.7",
        "args": [
            model,
            "--max-model-len",
            "4096",
            "--kv-transfer-config",
            KV_TRANSFER_CONFIG,
            *(extra_args or []),
        ],
        "env": [
            {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "LMCACHE_LOCAL_CPU", "value": "True"},
            {"name": "LMCACHE_REMOTE_URL", "value": "sagemaker-hyperpod://$(NODE_IP):9200"},
            {"name": "LMCACHE_EXTRA_CONFIG", "value": HYPERPOD_SHM_CONFIG},
            *(extra_env or []),
        ],
        "ports": [{"name": "http", "containerPort": 8000}],
        "resources": {
            "limits": {"nvidia.com/gpu": str(gpus)},
            "requests": {"cpu": "6", "memory": "30Gi", "nvidia.com/gpu": str(gpus)},
        },
        "volumeMounts": [
            {"name": "model-weights", "mountPath": "/opt/ml/model"},
            {"name": "dev-shm", "mountPath": "/dev/shm"},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0},
            },
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        vllm,
                        {
                            "name": "reverse-proxy",
                            "image": "public.ecr.aws/example/reverse-proxy:1",
                            "ports": [{"containerPort": 8080}],
                        },
                        {"name": "otel-collector", "image": "otel/opentelemetry-collector:0.1"},
                    ],
                    "volumes": [
                        {"name": "model-weights", "emptyDir": {}},
                        {"name": "dev-shm", "hostPath": {"path": "/dev/shm"}},
                    ],
                },
            },
        },
    }


def operator_controller(kube: KubeHarness, replicas: int = 1) -> None:
    """The HyperPod inference operator's own Deployment (no pods: hpkv only scales it)."""
    ensure_namespace(kube, OPERATOR_NAMESPACE)
    labels = {"control-plane": "controller-manager"}
    kube.apply_object(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": OPERATOR_DEPLOYMENT, "namespace": OPERATOR_NAMESPACE},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "manager", "image": "example/operator:3.2"}]},
                },
            },
        }
    )


def curvine_pvc(
    kube: KubeHarness,
    namespace: str,
    *,
    name: str = "curvine-pvc",
    phase: str = "Bound",
    access_modes: tuple[str, ...] = ("ReadWriteMany",),
    storage_class: str = "curvine-sc",
) -> None:
    """The Curvine PVC stage 3 creates in each endpoint namespace, with the status a binder sets."""
    ensure_namespace(kube, namespace)
    kube.apply_object(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "accessModes": list(access_modes),
                "storageClassName": storage_class,
                "resources": {"requests": {"storage": "100Gi"}},
            },
        }
    )
    status: dict[str, Any] = {"phase": phase}
    if phase == "Bound":
        status |= {"accessModes": list(access_modes), "capacity": {"storage": "100Gi"}}
    kube.apply_object(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "status": status,
        },
        subresource="status",
    )


def _template_hash(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def create_pod(
    kube: KubeHarness,
    deployment: dict[str, Any],
    *,
    node: str | None = None,
    ready: bool = True,
    mutate: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Create one pod from the Deployment's template through the API, as a ReplicaSet does."""
    meta = deployment["metadata"]
    template = copy.deepcopy(deployment["spec"]["template"])
    labels = {**template["metadata"].get("labels", {})}
    labels["pod-template-hash"] = _template_hash(deployment["spec"]["template"])
    replica_set = f"{meta['name']}-{labels['pod-template-hash']}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{replica_set}-",
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": template["metadata"].get("annotations") or {},
            # As a ReplicaSet creates it (nothing here garbage-collects by it).
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": replica_set,
                    "uid": f"uid-{replica_set}",
                    "controller": True,
                }
            ],
        },
        "spec": {**template["spec"], **({"nodeName": node} if node else {})},
    }
    if mutate:
        mutate(pod)
    status, body = kube.raw("POST", f"/api/v1/namespaces/{meta['namespace']}/pods", pod)
    if status >= 300:
        raise RuntimeError(f"create pod failed: {status} {body[:500]}")
    created = json.loads(body)
    names = [c["name"] for c in created["spec"]["containers"]]
    kube.apply_object(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": created["metadata"]["name"], "namespace": meta["namespace"]},
            "status": pod_status(ready=ready, containers=names),
        },
        subresource="status",
    )
    return created


def list_pods(kube: KubeHarness, namespace: str, app: str) -> list[dict[str, Any]]:
    status, body = kube.raw("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector=app%3D{app}")
    assert status == 200, body
    return json.loads(body)["items"]


def vllm_env(pod: dict[str, Any], name: str) -> list[dict[str, Any]]:
    container = next(c for c in pod["spec"]["containers"] if c["name"] == name)
    return container.get("env") or []


class DeploymentPlayer:
    """A thread that runs Deployments: pods created through the API (admission runs), placed on
    nodes, made Ready; old-template and surplus pods deleted; terminating pods finalised (kubelet);
    Deployment status kept. Rolling updates replace all old pods at once."""

    def __init__(
        self, kube: KubeHarness, deployments: list[tuple[str, str]], nodes: list[str]
    ) -> None:
        self.kube = kube
        self.deployments = deployments
        self.nodes = nodes
        self.ready = True
        self.created: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> DeploymentPlayer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for namespace, name in self.deployments:
                    self._reconcile(namespace, name)
            except Exception as exc:  # surfaced by the test through .error
                self.error = exc
            time.sleep(0.05)

    def _reconcile(self, namespace: str, name: str) -> None:
        deployment = self.kube.get_object("apps/v1", "Deployment", name, namespace)
        if deployment is None:
            return
        wanted = _template_hash(deployment["spec"]["template"])
        replicas = deployment["spec"].get("replicas", 1)
        pods = list_pods(self.kube, namespace, name)
        active = []
        for pod in pods:
            path = f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}"
            if (
                pod["metadata"].get("deletionTimestamp")
                or pod["metadata"]["labels"].get("pod-template-hash") != wanted
            ):
                self.kube.raw("DELETE", path + "?gracePeriodSeconds=0")
            else:
                active.append(pod)
        for pod in active[replicas:]:
            self.kube.raw(
                "DELETE",
                f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}?gracePeriodSeconds=0",
            )
        used = {p["spec"].get("nodeName") for p in active[:replicas]}
        for _ in range(replicas - len(active)):
            node = next((n for n in self.nodes if n not in used), self.nodes[0])
            used.add(node)
            pod = create_pod(self.kube, deployment, node=node, ready=self.ready)
            self.created.append(pod["metadata"]["name"])
        ready = min(replicas, len(active)) if self.ready else 0
        self.kube.apply_object(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "namespace": namespace},
                "status": {
                    "observedGeneration": deployment["metadata"]["generation"],
                    "replicas": replicas,
                    "updatedReplicas": replicas,
                    "readyReplicas": ready,
                    "availableReplicas": ready,
                },
            },
            subresource="status",
        )


class FakePods:
    """Answers hpkv's pod exec seam. Exec runs the real command locally with the pod's
    ``mount_path`` replaced by ``storage`` (a directory standing in for the shared PVC); pods in
    ``broken`` get a read-only-file-system error. :meth:`log` writes a container log where
    ``HPKV_POD_LOGS_DIR`` (``logs_dir``) points."""

    def __init__(
        self,
        storage: Path,
        mount_path: str = "/mnt/curvine/l2cache",
        *,
        logs_dir: Path | None = None,
    ) -> None:
        self.storage = storage
        self.mount_path = mount_path
        self.logs_dir = logs_dir or storage.parent / "pod-logs"
        self.broken: set[str] = set()
        self.execs: list[dict[str, Any]] = []
        self.latency = 0.0  # seconds before each answer (the API server and kubelet hops)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return None

            def _send(self, code: int, body: str, ctype: str = "application/json") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                time.sleep(fake.latency)
                length = int(self.headers.get("Content-Length", "0"))
                request = json.loads(self.rfile.read(length))
                self._send(200, json.dumps(fake._exec(request)))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def routes(self, namespace: str) -> str:
        return json.dumps({f"{namespace}/*": self.url})

    def log(
        self, namespace: str, pod: str, container: str, text: str, *, previous: bool = False
    ) -> None:
        """A container's log, as the pod-log seam (``HPKV_POD_LOGS_DIR=logs_dir``) serves it."""
        write_pod_log(self.logs_dir, namespace, pod, container, text, previous=previous)

    def _exec(self, request: dict[str, Any]) -> dict[str, Any]:
        self.execs.append(request)
        if request["pod"] in self.broken:
            return {"rc": 1, "stdout": "", "stderr": "sh: can't create: Read-only file system"}
        command = [
            str(self.storage) if part == self.mount_path else part for part in request["command"]
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=10)
        return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}

    def __enter__(self) -> FakePods:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
