"""Every stage installed by hpkv itself, with the controllers played: the healthy cluster that the
``hpkv status`` / ``hpkv diagnose`` tests (and ``benchmarks/status_latency.py``) start from.

:class:`Stack` seeds a HyperPod cluster (Tiered Storage on, two one-GPU nodes, the ai-toolkit
DaemonSet), then runs the real ``hpkv operator apply``, ``hpkv curvine apply`` and ``hpkv l2
apply`` against the AWS emulator and the kube-apiserver while the harness plays the add-ons
(:class:`~tests.harness.inference.AddonPlayer`), Curvine's controllers and master
(:mod:`tests.harness.curvine`) and the endpoint's Deployment
(:class:`~tests.harness.workloads.DeploymentPlayer`). Stages can be installed one at a time; a
stage left out is replaced by the minimum the others need (the endpoint CRD, a Bound Curvine PVC).
Pods answer the exec seam (:class:`~tests.harness.workloads.FakePods`), their logs come from
``HPKV_POD_LOGS_DIR`` and their ``/metrics`` from :class:`MetricsStub` (``HPKV_INCLUSTER_ROUTES``).
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.harness.cli import CliResult
from tests.harness.curvine import CurvinePlayer, MasterStub, seed_aws_managed_policy
from tests.harness.inference import AddonPlayer, create_alb_policy, play_service_endpoints
from tests.harness.play import add_pod, ensure_namespace, write_pod_log
from tests.harness.scenario import Scenario
from tests.harness.workloads import (
    DeploymentPlayer,
    FakePods,
    create_endpoint,
    curvine_pvc,
    install_endpoint_crd,
    list_pods,
    operator_deployment,
)

ENDPOINT_NS = "team-a"
ENDPOINT = "llama"
OPERATOR_NS = "hyperpod-inference-system"
CURVINE_NS = "curvine"
METRICS_PORT = 8000  # the vLLM container's port in the rendered Deployment
ALL_STAGES = ("operator", "curvine", "l2")

# A worker that serves from every tier: GPU prefix hits, LMCache hits, reads and writes on the L2.
HEALTHY_COUNTERS = {
    "vllm:prefix_cache_queries_total": 200_000.0,
    "vllm:prefix_cache_hits_total": 60_000.0,
    "vllm:external_prefix_cache_queries_total": 140_000.0,
    "vllm:external_prefix_cache_hits_total": 70_000.0,
    "lmcache:num_requested_tokens_total": 140_000.0,
    "lmcache:num_hit_tokens_total": 70_000.0,
    "lmcache:num_remote_read_requests_total": 120.0,
    "lmcache:num_remote_read_bytes_total": 1.2e9,
    "lmcache:num_remote_write_requests_total": 300.0,
    "lmcache:num_remote_write_bytes_total": 3.0e9,
}


class MetricsStub:
    """``/metrics`` of worker pods (vLLM + LMCache counters in Prometheus text), one server for
    all; :attr:`counters` maps a pod name to its counters (default :data:`HEALTHY_COUNTERS`)."""

    def __init__(self) -> None:
        self.counters: dict[str, dict[str, float]] = {}
        self.latency = 0.0  # seconds before each answer (the API server's pod proxy hop)
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                time.sleep(stub.latency)
                pod = self.path.strip("/").split("/")[0]
                counters = stub.counters.get(pod, HEALTHY_COUNTERS)
                labels = 'model_name="llama",engine="0"'
                body = "".join(
                    f"# TYPE {name.removesuffix('_total')} counter\n{name}{{{labels}}} {value}\n"
                    for name, value in counters.items()
                ).encode()
                self.send_response(200 if self.path.endswith("/metrics") else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return None

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def url(self, pod: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/{pod}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class Stack:
    def __init__(
        self,
        scenario: Scenario,
        shared_dir: Path,
        chart_repo: Any,
        workdir: Path,
        monkeypatch: Any,
    ) -> None:
        self.scenario = scenario
        self.kube = scenario.kube
        self.aws = scenario.aws
        self.shared_dir = shared_dir
        self.monkeypatch = monkeypatch
        self.logs = workdir / "pod-logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.routes: dict[str, str] = {}
        self.installed: list[str] = []
        self._alb_policy = False
        monkeypatch.setenv("HPKV_POD_LOGS_DIR", str(self.logs))
        monkeypatch.setenv("HPKV_HELM", chart_repo.helm)
        monkeypatch.setenv("HPKV_CURVINE__CHART_REPO", chart_repo.url)
        monkeypatch.setenv("HPKV_TIMEOUT", "60s")
        scenario.hyperpod(
            tiered_storage={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20}
        )
        self.nodes = scenario.nodes(2, gpus=1)
        scenario.ai_toolkit()
        self.addons = AddonPlayer(self.kube, shared_dir, self.aws.extensions["eks"])
        self.master = MasterStub()
        self.master.set_cluster(live=len(self.nodes))
        self.route(f"{CURVINE_NS}/services/curvine-master:9000", self.master.url)
        self.metrics = MetricsStub()
        storage = workdir / "l2-storage"
        storage.mkdir(exist_ok=True)
        self.pods = FakePods(storage, logs_dir=self.logs).__enter__()
        monkeypatch.setenv("HPKV_POD_ROUTES", self.pods.routes(ENDPOINT_NS))
        self.curvine_player: CurvinePlayer | None = None
        self.workers: DeploymentPlayer | None = None

    # --- seams --------------------------------------------------------------------------------
    def route(self, key: str, url: str) -> None:
        """Send hpkv's in-cluster HTTP for ``key`` (``ns/services|pods/name:port``) to ``url``."""
        self.routes[key] = url
        self.monkeypatch.setenv("HPKV_INCLUSTER_ROUTES", json.dumps(self.routes))

    def log(
        self, namespace: str, pod: str, container: str, text: str, *, previous: bool = False
    ) -> None:
        write_pod_log(self.logs, namespace, pod, container, text, previous=previous)

    # --- installing ---------------------------------------------------------------------------
    def install(self, stages: Iterable[str] = ALL_STAGES) -> Stack:
        """Install the stages with hpkv (in order), then run the endpoint's pods."""
        wanted = [s for s in ALL_STAGES if s in set(stages)]
        if "operator" in wanted:
            self.apply("operator")
        else:
            install_endpoint_crd(self.kube, self.shared_dir)
        self._endpoint()
        if "curvine" in wanted:
            seed_aws_managed_policy(self.aws, "AmazonEBSCSIDriverPolicy")
            self.curvine_player = CurvinePlayer(self.kube, self.nodes).__enter__()
            self.apply("curvine")
        else:
            curvine_pvc(self.kube, ENDPOINT_NS)
        if "l2" in wanted:
            self.apply("l2")  # before the pods exist: they are wired at admission
            self.kube.wait_until(self.admission_wires, timeout=30, what="the L2 policy to act")
        self.start_workers()
        return self

    def admission_wires(self) -> bool:
        """A server-side dry-run pod of the endpoint comes back wired (the API server takes a
        moment to start enforcing a new admission policy)."""
        deployment = self.kube.get_object("apps/v1", "Deployment", ENDPOINT, ENDPOINT_NS)
        assert deployment is not None
        template = deployment["spec"]["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{ENDPOINT}-probe-",
                "labels": template["metadata"]["labels"],
            },
            "spec": template["spec"],
        }
        status, body = self.kube.raw(
            "POST", f"/api/v1/namespaces/{ENDPOINT_NS}/pods?dryRun=All", pod
        )
        if status >= 300:
            return False
        env = json.loads(body)["spec"]["containers"][0].get("env") or []
        return any(
            e["name"] == "LMCACHE_REMOTE_URL" and str(e.get("value", "")).startswith("fs://")
            for e in env
        )

    def apply(self, stage: str, *, check: bool = True) -> CliResult:
        """``hpkv <stage> apply --yes``; with ``check`` a failure fails the test."""
        if stage == "operator" and not self._alb_policy:
            self._alb_policy = True  # created once per account, as its install guide says
            create_alb_policy(self.aws)
        result = self.scenario.hpkv(stage, "apply", "--cluster", "demo", "--yes")
        if check and result.exit_code != 0:
            raise AssertionError(f"hpkv {stage} apply failed:\n{result}")
        if result.exit_code == 0:
            self.installed.append(stage)
        return result

    def _endpoint(self) -> None:
        """The InferenceEndpointConfig and what the operator renders for it: the worker
        Deployment, the routing Service and the router pod."""
        create_endpoint(self.kube, self.shared_dir, ENDPOINT_NS, ENDPOINT)
        deployment = operator_deployment(ENDPOINT_NS, ENDPOINT, replicas=2)
        vllm = deployment["spec"]["template"]["spec"]["containers"][0]
        vllm["ports"] = [{"name": "http", "containerPort": METRICS_PORT}]
        self.kube.apply_object(deployment)
        play_service_endpoints(
            self.kube, ENDPOINT_NS, f"{ENDPOINT}-routing-service", ready=True, target_port=8081
        )
        router = f"{ENDPOINT}-{ENDPOINT_NS}-router"
        add_pod(
            self.kube,
            OPERATOR_NS,
            f"{router}-6d9f8b7c5-x2x4z",
            node=self.nodes[0],
            owner=("ReplicaSet", f"{router}-6d9f8b7c5"),
            labels={"app": router},
            containers=[{"name": "router", "image": "public.ecr.aws/example/router:1"}],
        )

    def start_workers(self) -> list[str]:
        """Run the endpoint's Deployment (pods created through the API, so admission wires
        them); returns the pod names once every replica is Ready, with /metrics routed."""
        ensure_namespace(self.kube, ENDPOINT_NS)
        self.workers = DeploymentPlayer(self.kube, [(ENDPOINT_NS, ENDPOINT)], self.nodes)
        self.workers.__enter__()
        self.kube.wait_until(
            lambda: len(self.worker_pods()) == 2, timeout=30, what="the endpoint's pods"
        )
        names = self.worker_pods()
        for name in names:
            self.route(f"{ENDPOINT_NS}/pods/{name}:{METRICS_PORT}", self.metrics.url(name))
        return names

    def stop_workers(self) -> None:
        """Stop playing the Deployment controller (a test then writes the pods itself)."""
        if self.workers is not None:
            self.workers.__exit__(None, None, None)
            self.workers = None

    def worker_pods(self) -> list[str]:
        return sorted(
            p["metadata"]["name"]
            for p in list_pods(self.kube, ENDPOINT_NS, ENDPOINT)
            if not p["metadata"].get("deletionTimestamp")
        )

    def set_latency(self, seconds: float) -> None:
        """Delay every AWS and Kubernetes call (the scenario's proxy must be set) and every
        in-cluster answer the stubs give."""
        self.aws.latency = seconds
        self.scenario.proxy.latency = seconds
        self.master.latency = self.metrics.latency = self.pods.latency = seconds

    def stop_controllers(self) -> None:
        """Stop every played controller (the objects stay as they are): for measurements, where
        their polling would compete for the CPU."""
        self.stop_workers()
        if self.curvine_player is not None:
            self.curvine_player.__exit__(None, None, None)
            self.curvine_player = None

    def stop(self) -> None:
        self.stop_controllers()
        self.pods.__exit__(None, None, None)
        self.master.stop()
        self.metrics.stop()
