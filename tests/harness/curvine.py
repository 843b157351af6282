"""Curvine as the tests see it.

* :class:`ChartRepo`: a real Helm chart repository on 127.0.0.1 (``helm package`` + ``helm repo
  index`` + an HTTP server) holding the stand-in charts in ``tests/fixtures/charts`` under the
  versions the tests ask for; hpkv reaches it with ``--repo`` exactly as it reaches
  https://curvineio.github.io/helm-charts.
* :class:`MasterStub`: the Curvine master's web API (``/api/overview``, ``/api/workers``) with the
  JSON shapes Curvine serves; hpkv reaches it through ``HPKV_INCLUSTER_ROUTES``.
* :class:`CurvinePlayer`: a thread playing the controllers Curvine's objects need on the test
  apiserver: the StatefulSet controller (pods, master PVCs, status), the DaemonSet controller
  (CSI node plugin pods), the garbage collector, kubelets (Ready pods) and the Curvine CSI
  external-provisioner (binds ``curvine-sc`` PVCs, deletes their PVs after the claim goes).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import http.server
import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from tests.harness.binaries import harness_binary
from tests.harness.kube import KubeHarness
from tests.harness.play import ensure_namespace, pod_status

CHART_SOURCES = Path(__file__).resolve().parents[1] / "fixtures" / "charts"
VERSIONS = ("0.4.1", "0.3.1-alpha")
GIB = 1024**3
PLAYED = "hpkv-test/played-by"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


class ChartRepo:
    def __init__(self, directory: Path, helm: str) -> None:
        self.directory = directory
        self.helm = helm  # resolved now: tests run with an isolated HOME
        self._server: http.server.ThreadingHTTPServer | None = None

    @classmethod
    def build(cls, directory: Path, versions: Iterable[str] = VERSIONS) -> ChartRepo:
        helm = str(harness_binary("helm"))
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(directory / ".cache"),
            "HELM_CONFIG_HOME": str(directory / ".config"),
            "HELM_DATA_HOME": str(directory / ".data"),
        }
        packages = directory / "charts"
        packages.mkdir(parents=True, exist_ok=True)
        for chart in ("curvine", "curvine-csi"):
            for version in versions:
                subprocess.run(
                    [helm, "package", str(CHART_SOURCES / chart), "--version", version,
                     "--app-version", version, "-d", str(packages)],
                    check=True, capture_output=True, env=env,
                )  # fmt: skip
        subprocess.run(
            [helm, "repo", "index", str(packages)], check=True, capture_output=True, env=env
        )
        return cls(packages, helm)

    def start(self) -> ChartRepo:
        handler = functools.partial(_QuietHandler, directory=str(self.directory))
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


# --- the master API -------------------------------------------------------------------------------
def worker_info(host: str, *, capacity: int, available: int, status: str = "Live") -> dict:
    """A WorkerInfo as /api/workers and `cv report json` show it."""
    return {
        "address": {
            "worker_id": abs(hash(host)) % 10**9,
            "hostname": host,
            "ip_addr": "10.1.0.10",
            "rpc_port": 8997,
            "web_port": 9001,
        },
        "capacity": capacity,
        "available": available,
        "fs_used": capacity - available,
        "status": status,
        "storage_map": {
            "data1": {
                "storage_type": "SSD",
                "dir_path": "/data/data1",
                "capacity": capacity,
                "available": available,
                "failed": False,
            }
        },
        "software_version": "0.4.1",
        "last_update": int(time.time() * 1000),
    }


class MasterStub:
    """The Curvine master's web API; tests edit :attr:`overview` and :attr:`workers`."""

    def __init__(self) -> None:
        self.overview: dict[str, Any] = {}
        self.workers: dict[str, Any] = {"live_workers": [], "lost_workers": []}
        self.requests: list[str] = []
        self.latency = 0.0  # seconds before each answer (the API server's proxy hop)
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                time.sleep(stub.latency)
                stub.requests.append(self.path)
                routes = {"/api/overview": stub.overview, "/api/workers": stub.workers}
                body = routes.get(self.path.split("?")[0])
                if body is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def set_cluster(
        self,
        *,
        live: int,
        lost: int = 0,
        state: str = "Active",
        per_worker: int = 1500 * GIB,
        used_ratio: float = 0.25,
        namespace: str = "curvine",
    ) -> None:
        def host(i: int) -> str:
            return f"curvine-worker-{i}.curvine-worker.{namespace}.svc.cluster.local"

        available = int(per_worker * (1 - used_ratio))
        live_infos = [
            worker_info(host(i), capacity=per_worker, available=available) for i in range(live)
        ]
        lost_infos = [
            worker_info(host(live + i), capacity=per_worker, available=available, status="Lost")
            for i in range(lost)
        ]
        capacity = per_worker * live
        self.workers = {"live_workers": live_infos, "lost_workers": lost_infos}
        self.overview = {
            "cluster_id": "curvine",
            "master_addr": f"curvine-master-0.curvine-master.{namespace}.svc.cluster.local:8995",
            "start_time": int(time.time() * 1000) - 3_600_000,
            "live_workers": live,
            "lost_workers": lost,
            "available": available * live,
            "capacity": capacity,
            "fs_used": capacity - available * live,
            "reserved_bytes": 0,
            "files_total": 1234,
            "dir_total": 56,
            "master_state": state,
        }


# --- controllers ----------------------------------------------------------------------------------
class CurvinePlayer:
    """Plays the StatefulSet/DaemonSet controllers, kubelets, the garbage collector and the Curvine
    CSI provisioner against the test apiserver, in a background thread."""

    def __init__(
        self,
        kube: KubeHarness,
        nodes: list[str],
        *,
        namespace: str = "curvine",
        l2_class: str = "curvine-sc",
        interval: float = 0.1,
    ) -> None:
        self.kube = kube
        self.nodes = nodes
        self.namespace = namespace
        self.l2_class = l2_class
        self.interval = interval
        self.errors: list[str] = []
        # StatefulSets whose pods never start (a master stuck in a crash loop, say).
        self.stalled: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="curvine-player")

    def __enter__(self) -> CurvinePlayer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # keep playing; tests can inspect the errors
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.interval)

    def _list(self, path: str) -> list[dict[str, Any]]:
        status, body = self.kube.raw("GET", path)
        if status != 200:
            return []
        return json.loads(body).get("items", [])

    def tick(self) -> None:
        ns = self.namespace
        owners: set[str] = set()
        for sts in self._list(f"/apis/apps/v1/namespaces/{ns}/statefulsets"):
            owners.add(f"StatefulSet/{sts['metadata']['name']}")
            if sts["metadata"]["name"] not in self.stalled:
                self._play_statefulset(sts)
        for ds in self._list(f"/apis/apps/v1/namespaces/{ns}/daemonsets"):
            owners.add(f"DaemonSet/{ds['metadata']['name']}")
            self._play_daemonset(ds)
        for pod in self._list(f"/api/v1/namespaces/{ns}/pods"):
            owner = (pod["metadata"].get("annotations") or {}).get(PLAYED)
            name = pod["metadata"]["name"]
            if pod["metadata"].get("deletionTimestamp"):
                # The kubelet confirms a deletion once the containers stopped.
                self.kube.raw("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=0")
            elif owner and owner not in owners:
                self.kube.delete_object({**_ref(pod), "apiVersion": "v1", "kind": "Pod"})
        self._play_provisioner()

    def _pods(self, selector: dict[str, str]) -> dict[str, dict[str, Any]]:
        query = ",".join(f"{k}={v}" for k, v in selector.items())
        pods = self._list(f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={query}")
        return {p["metadata"]["name"]: p for p in pods}

    def _run_pod(self, name: str, labels: dict[str, str], node: str, owner: str) -> None:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": labels,
                "annotations": {PLAYED: owner},
            },
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "example"}]},
        }
        self.kube.apply_object(pod)
        self.kube.apply_object(
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": name, "namespace": self.namespace}, "status": pod_status()},
            subresource="status",
        )  # fmt: skip

    def _play_statefulset(self, sts: dict[str, Any]) -> None:
        name = sts["metadata"]["name"]
        replicas = int(sts["spec"].get("replicas", 1))
        labels = sts["spec"]["template"]["metadata"].get("labels", {})
        existing = self._pods(sts["spec"]["selector"]["matchLabels"])
        for i in range(replicas):
            for template in sts["spec"].get("volumeClaimTemplates") or []:
                self._bound_claim(f"{template['metadata']['name']}-{name}-{i}", template)
            pod_name = f"{name}-{i}"
            if pod_name not in existing:
                node = self.nodes[i % len(self.nodes)] if "worker" in name else self.nodes[0]
                self._run_pod(pod_name, labels, node, f"StatefulSet/{name}")
        status = sts.get("status") or {}
        if status.get("readyReplicas") != replicas or status.get("observedGeneration") != sts[
            "metadata"
        ].get("generation"):
            self.kube.apply_object(
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "metadata": {"name": name, "namespace": self.namespace},
                    "status": {
                        "replicas": replicas,
                        "readyReplicas": replicas,
                        "currentReplicas": replicas,
                        "updatedReplicas": replicas,
                        "availableReplicas": replicas,
                        "observedGeneration": sts["metadata"].get("generation", 1),
                    },
                },
                subresource="status",
            )

    def _bound_claim(self, name: str, template: dict[str, Any]) -> None:
        if self.kube.get_object("v1", "PersistentVolumeClaim", name, self.namespace) is not None:
            return
        spec = copy.deepcopy(template["spec"])
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": (template.get("metadata") or {}).get("labels", {}),
            },
            "spec": spec,
        }
        self.kube.apply_object(claim)
        self._bind(claim, driver="ebs.csi.aws.com")

    def _play_daemonset(self, ds: dict[str, Any]) -> None:
        name = ds["metadata"]["name"]
        labels = ds["spec"]["template"]["metadata"].get("labels", {})
        existing = self._pods(ds["spec"]["selector"]["matchLabels"])
        for node in self.nodes:
            pod_name = f"{name}-{node}"[:63]
            if pod_name not in existing:
                self._run_pod(pod_name, labels, node, f"DaemonSet/{name}")

    def _bind(self, claim: dict[str, Any], *, driver: str) -> None:
        meta = claim["metadata"]
        live = self.kube.get_object("v1", "PersistentVolumeClaim", meta["name"], meta["namespace"])
        if live is None:
            return
        volume = f"pvc-{live['metadata']['uid']}"
        self.kube.apply_object(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": volume},
                "spec": {
                    "capacity": {"storage": live["spec"]["resources"]["requests"]["storage"]},
                    "accessModes": live["spec"]["accessModes"],
                    "persistentVolumeReclaimPolicy": "Delete",
                    "storageClassName": live["spec"].get("storageClassName", ""),
                    "csi": {"driver": driver, "volumeHandle": f"{uuid.uuid4().hex[:8]}@{volume}"},
                    "claimRef": {
                        "kind": "PersistentVolumeClaim",
                        "namespace": meta["namespace"],
                        "name": meta["name"],
                        "uid": live["metadata"]["uid"],
                    },
                },
            }
        )
        with contextlib.suppress(RuntimeError):
            self.kube.apply_object(
                {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                 "spec": {"volumeName": volume}},
            )  # fmt: skip
        self.kube.apply_object(
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
             "status": {"phase": "Bound", "accessModes": live["spec"]["accessModes"],
                        "capacity": {"storage": live["spec"]["resources"]["requests"]["storage"]}}},
            subresource="status",
        )  # fmt: skip

    def _play_provisioner(self) -> None:
        """Bind Pending curvine-sc claims; delete curvine PVs whose claim is gone."""
        if self.kube.get_object("storage.k8s.io/v1", "StorageClass", self.l2_class) is not None:
            for claim in self._list("/api/v1/persistentvolumeclaims"):
                if claim["spec"].get("storageClassName") != self.l2_class:
                    continue
                if (claim.get("status") or {}).get("phase") != "Bound":
                    self._bind(claim, driver="curvine")
        claims = {
            (c["metadata"]["namespace"], c["metadata"]["name"]): c["metadata"]["uid"]
            for c in self._list("/api/v1/persistentvolumeclaims")
        }
        for volume in self._list("/api/v1/persistentvolumes"):
            ref = volume["spec"].get("claimRef") or {}
            if (volume["spec"].get("csi") or {}).get("driver") != "curvine":
                continue
            if claims.get((ref.get("namespace"), ref.get("name"))) != ref.get("uid"):
                self.kube.delete_object(
                    {"apiVersion": "v1", "kind": "PersistentVolume",
                     "metadata": {"name": volume["metadata"]["name"]}}
                )  # fmt: skip


def _ref(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {"metadata": {"name": meta["name"], "namespace": meta.get("namespace")}}


# --- AWS -----------------------------------------------------------------------------------------
@functools.cache
def _aws_managed_policy_data() -> dict[str, Any]:
    from moto.iam.aws_managed_policies import aws_managed_policies_data

    return json.loads(aws_managed_policies_data)


def seed_aws_managed_policy(aws: Any, name: str) -> str:
    """Make an AWS managed policy exist in the emulator (moto loads none by default; every real
    account has them). Returns its ARN."""
    import moto.backends
    from moto.iam.models import AWSManagedPolicy

    backend = moto.backends.get_backend("iam")[aws.account_id]["aws"]
    policy = AWSManagedPolicy.from_data(
        name, aws.account_id, aws.region, _aws_managed_policy_data()[name]
    )
    backend.managed_policies[policy.arn] = policy
    return policy.arn


# --- inference endpoints --------------------------------------------------------------------------
def install_endpoint_crd(kube: KubeHarness, shared_dir: Path) -> None:
    """The upstream InferenceEndpointConfig CRD, without its conversion webhook (no operator)."""
    path = (
        shared_dir
        / "upstream"
        / "hyperpod-inference-operator"
        / "inference.sagemaker.aws.amazon.com_inferenceendpointconfigs.yaml"
    )
    crd = yaml.safe_load(path.read_text())
    crd["metadata"].pop("annotations", None)
    crd["spec"]["conversion"] = {"strategy": "None"}
    kube.apply_object(crd)

    def established() -> bool:
        live = kube.get_object(
            "apiextensions.k8s.io/v1", "CustomResourceDefinition", crd["metadata"]["name"]
        )
        conditions = ((live or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    kube.wait_until(established, timeout=30, what="the InferenceEndpointConfig CRD")
    kube._resources = None


def add_endpoint(kube: KubeHarness, shared_dir: Path, namespace: str, name: str) -> None:
    """An InferenceEndpointConfig from the upstream sample, in ``namespace``."""
    sample = yaml.safe_load(
        (
            shared_dir
            / "upstream"
            / "hyperpod-inference-operator"
            / "sample_v1_llama31_8b_kv_cache_l1_l2.yaml"
        ).read_text()
    )
    sample["metadata"] = {"name": name, "namespace": namespace}
    spec = sample["spec"]
    spec["modelSourceConfig"]["s3Storage"]["bucketName"] = "hpkv-test-models"
    spec["kvCacheSpec"]["l2CacheSpec"]["l2CacheLocalUrl"] = "redis://redis.example:6379"
    spec["tlsConfig"]["tlsCertificateOutputS3Uri"] = "s3://hpkv-test-tls/certs"
    ensure_namespace(kube, namespace)
    kube.apply_object(sample)


# --- the whole setup ------------------------------------------------------------------------------
class CurvineEnv:
    """A HyperPod cluster with GPU nodes and an inference endpoint, hpkv pointed at the stand-in
    chart repository and the stub master, and the controllers played."""

    def __init__(self, scenario: Any, repo: ChartRepo, shared_dir: Path, monkeypatch: Any) -> None:
        from hpkv.kube.incluster import ROUTES_ENV

        self.scenario = scenario
        self.kube: KubeHarness = scenario.kube
        self.repo_url = repo.url
        self.chart_directory = repo.directory
        self.shared_dir = shared_dir
        self.helm_binary = repo.helm
        self.harness_kubeconfig = self.kube.write_kubeconfig(
            scenario.workdir / "harness.kubeconfig", user="harness"
        )
        scenario.hyperpod()
        scenario.nodes(2)
        seed_aws_managed_policy(scenario.aws, "AmazonEBSCSIDriverPolicy")
        install_endpoint_crd(self.kube, shared_dir)
        add_endpoint(self.kube, shared_dir, "team-a", "llama-a")
        self.stub = MasterStub()
        self.stub.set_cluster(live=2)
        monkeypatch.setenv("HPKV_HELM", self.helm_binary)
        monkeypatch.setenv("HPKV_CURVINE__CHART_REPO", repo.url)
        monkeypatch.setenv("HPKV_TIMEOUT", "60s")
        monkeypatch.setenv(
            ROUTES_ENV, json.dumps({"curvine/services/curvine-master:9000": self.stub.url})
        )
        self.player = CurvinePlayer(self.kube, scenario.node_names)
        self.player.__enter__()

    def stop(self) -> None:
        self.player.__exit__(None, None, None)
        self.stub.stop()

    @property
    def eks(self) -> Any:
        return self.scenario.aws.extensions["eks"]

    # --- helm, as the harness ------------------------------------------------------------------
    def helm(self, *args: str, input: str | None = None) -> str:
        home = self.scenario.workdir / "harness-helm"
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        result = subprocess.run(
            [self.helm_binary, *args, "--kubeconfig", str(self.harness_kubeconfig)],
            input=input, capture_output=True, text=True, env=env, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def history(self, release: str = "curvine", namespace: str = "curvine") -> list[dict]:
        try:
            return json.loads(self.helm("history", release, "-n", namespace, "-o", "json"))
        except RuntimeError as exc:
            if "not found" in str(exc):
                return []
            raise

    def values(self, revision: int, release: str = "curvine", namespace: str = "curvine") -> dict:
        out = self.helm(
            "get", "values", release, "-n", namespace, "--revision", str(revision), "-o", "json"
        )
        return json.loads(out) or {}

    def format_flags_by_revision(self, release: str = "curvine") -> dict[int, bool]:
        """Revision -> whether any cluster.format* value was on in it."""
        result = {}
        for entry in self.history(release):
            cluster = self.values(entry["revision"], release).get("cluster") or {}
            result[entry["revision"]] = any(
                cluster.get(k) for k in ("formatMaster", "formatWorker", "formatJournal")
            )
        return result
