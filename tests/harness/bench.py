"""Playing the inference operator, the Job controller and the kubelet for ``hpkv bench`` tests.

* :func:`install_endpoint_crd` applies the real InferenceEndpointConfig CRD (from ../shared/upstream;
  its Helm-templated conversion webhook is replaced by ``None``: there is no operator here).
* :func:`play_endpoint` creates an endpoint as the operator would leave it: the IEC, Ready worker
  pods labelled ``app=<name>`` whose pod IPs are loopback addresses served by a
  :class:`~tests.harness.fake_vllm.FakeCluster`, nodes with instance types, the routing Service.
* :class:`JobPlayer` plays the Job controller and the kubelet: for each bench Job it creates the
  pods, runs the container's command with the system ``python3`` on the ConfigMap's files (cluster
  DNS is played with ``HPKV_BENCH_RESOLVE``), writes their output where ``HPKV_POD_LOGS_DIR``
  points, and writes pod and Job status.
"""

from __future__ import annotations

import copy
import json
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hpkv.kube.podlogs import log_path
from tests.harness.fake_vllm import Costs, FakeCluster
from tests.harness.kube import KubeHarness
from tests.harness.play import add_nodes, ensure_namespace, pod_status

IEC_API = "inference.sagemaker.aws.amazon.com/v1"
CRD_FILE = "upstream/hyperpod-inference-operator/inference.sagemaker.aws.amazon.com_inferenceendpointconfigs.yaml"
SAMPLE_FILE = "upstream/hyperpod-inference-operator/sample_v1_llama31_8b_kv_cache_l1_l2.yaml"
SERVING_IMAGE = "lmcache/vllm-openai:v0.3.7"
SYSTEM_PYTHON = "/usr/bin/python3"
# Costs large enough that scheduling noise on a shared 2-core machine stays small against them.
MEASURED_COSTS = Costs(
    base_ms=20.0, prefill_ms_per_token=0.4, load_fixed_ms=5.0, l2_ms_per_token=0.04
)


def install_endpoint_crd(kube: KubeHarness, shared_dir: Path) -> None:
    crd = yaml.safe_load((shared_dir / CRD_FILE).read_text())
    crd["spec"]["conversion"] = {"strategy": "None"}
    crd["metadata"].pop("annotations", None)
    kube.apply_object(crd)
    kube.wait_until(lambda: _served(kube), timeout=20, what="the InferenceEndpointConfig API")


def _served(kube: KubeHarness) -> bool:
    status, _ = kube.raw("GET", f"/apis/{IEC_API}")
    kube._resources = None
    return status == 200


def free_shared_port(hosts: list[str]) -> int:
    """A TCP port free on every one of ``hosts``."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        ok = True
        for host in hosts:
            with socket.socket() as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
    raise RuntimeError("no shared free port")


@dataclass
class PlayedEndpoint:
    name: str
    namespace: str
    cluster: FakeCluster
    pods: list[str]
    port: int
    routes: dict[str, str]
    log_dir: Path

    def pod_log(self, index: int) -> Path:
        return log_path(self.log_dir, self.namespace, self.pods[index], self.name)


def play_endpoint(
    kube: KubeHarness,
    shared_dir: Path,
    log_dir: Path,
    *,
    name: str = "demo",
    namespace: str = "default",
    replicas: int = 2,
    costs: Costs | None = None,
    router: bool = True,
    instance_type: str = "ml.g6e.4xlarge",
    ready: int | None = None,
    **cluster_options: Any,
) -> PlayedEndpoint:
    """An endpoint whose worker pods are fake vLLM servers on 127.0.0.{2,3,...}:<port>."""
    hosts = [f"127.0.0.{i + 2}" for i in range(replicas)]
    port = free_shared_port(hosts)
    pods = [f"{name}-7d9f8b6c5-{secrets.token_hex(3)[:5]}" for _ in range(replicas)]
    for pod in pods:
        log_path(log_dir, namespace, pod, name).parent.mkdir(parents=True, exist_ok=True)
    cluster = FakeCluster(
        pods=replicas,
        hosts=hosts,
        port=port,
        costs=costs or Costs(),
        router=router,
        names=pods,
        log_paths=[str(log_path(log_dir, namespace, pod, name)) for pod in pods],
        process=True,  # its own process: its clocks never wait for this one's GIL
        **cluster_options,
    ).start()
    ensure_namespace(kube, namespace)
    nodes = add_nodes(
        kube, [f"hyperpod-i-{name}-{i}" for i in range(replicas)], instance_type=instance_type
    )
    sample = yaml.safe_load((shared_dir / SAMPLE_FILE).read_text())
    spec = copy.deepcopy(sample["spec"])
    spec.update(replicas=replicas, instanceType=instance_type, modelName="Qwen2-7B-Instruct")
    spec["worker"]["modelInvocationPort"]["containerPort"] = port
    spec["worker"]["image"] = SERVING_IMAGE
    spec["kvCacheSpec"] = {
        "enableL1Cache": True,
        "enableL2Cache": True,
        "l2CacheSpec": {"l2CacheBackend": "tieredstorage"},
    }
    spec["intelligentRoutingSpec"] = {"enabled": True, "routingStrategy": "roundrobin"}
    spec.pop("tlsConfig", None)
    kube.apply_object(
        {
            "apiVersion": IEC_API,
            "kind": "InferenceEndpointConfig",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
    )
    routes = {}
    ready_count = replicas if ready is None else ready
    for i, (pod, fake) in enumerate(zip(pods, cluster.members, strict=True)):
        container = {
            "name": name,
            "image": SERVING_IMAGE,
            "ports": [{"containerPort": port, "name": "http"}],
            "env": [
                {"name": "LMCACHE_REMOTE_URL", "value": "fs://localhost:0/mnt/curvine/l2cache/"},
                {"name": "LMCACHE_CHUNK_SIZE", "value": "256"},
                {"name": "PYTHONHASHSEED", "value": "0"},
            ],
        }
        kube.apply_object(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod, "namespace": namespace, "labels": {"app": name}},
                "spec": {
                    "nodeName": nodes[i],
                    "containers": [container, {"name": "reverse-proxy", "image": "nginx"}],
                },
            }
        )
        status = pod_status(ready=i < ready_count, containers=[name, "reverse-proxy"])
        status.update(podIP=hosts[i], podIPs=[{"ip": hosts[i]}])
        write_pod_status(kube, namespace, pod, status)
        routes[f"{namespace}/pods/{pod}:{port}"] = fake.url
    if router:
        kube.apply_object(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": f"{name}-routing-service", "namespace": namespace},
                "spec": {
                    "selector": {"app": f"{name}-{namespace}-router"},
                    "ports": [{"port": 443, "targetPort": 8081, "name": "http"}],
                },
            }
        )
        routes[f"{namespace}/services/{name}-routing-service:443"] = cluster.router_url
    return PlayedEndpoint(name, namespace, cluster, pods, port, routes, log_dir)


@dataclass
class PlayedJob:
    manifest: dict[str, Any]
    configmap: dict[str, Any]
    pods: list[str] = field(default_factory=list)
    exit_codes: list[int] = field(default_factory=list)
    resolve: dict[str, str] = field(default_factory=dict)


class JobPlayer:
    """The Job controller and kubelet for hpkv's bench Jobs in one namespace."""

    def __init__(
        self,
        kube: KubeHarness,
        log_dir: Path,
        *,
        namespace: str = "default",
        router: tuple[str, str] | None = None,
        waiting_reason: str | None = None,
        waiting_for: str = "",
    ) -> None:
        self.kube = kube
        self.log_dir = log_dir
        self.namespace = namespace
        self.router = router  # (in-cluster host:port, local host:port)
        self.waiting_reason = waiting_reason
        self.waiting_for = waiting_for  # only Jobs whose name ends with this get stuck
        self.jobs: list[PlayedJob] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._seen: set[str] = set()
        self._thread = threading.Thread(target=self._loop, name="job-player", daemon=True)
        self._workdir = Path(tempfile.mkdtemp(prefix="hpkv-kubelet-"))

    def __enter__(self) -> JobPlayer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        shutil.rmtree(self._workdir, ignore_errors=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                status, body = self.kube.raw(
                    "GET",
                    f"/apis/batch/v1/namespaces/{self.namespace}/jobs?labelSelector=app.kubernetes.io/managed-by%3Dhpkv",
                )
                for job in json.loads(body).get("items", []) if status == 200 else []:
                    uid = job["metadata"]["uid"]
                    if uid not in self._seen:
                        self._seen.add(uid)
                        self._play(job)
            except BaseException as exc:  # surfaced by the test through .errors
                self.errors.append(exc)
            time.sleep(0.05)

    def _play(self, job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        template = job["spec"]["template"]
        container = template["spec"]["containers"][0]
        cm_name = template["spec"]["volumes"][0]["configMap"]["name"]
        configmap = self.kube.get_object("v1", "ConfigMap", cm_name, self.namespace)
        assert configmap is not None, f"Job {name} started before its ConfigMap {cm_name} existed"
        played = PlayedJob(manifest=job, configmap=configmap)
        self.jobs.append(played)
        files = self._workdir / name
        files.mkdir()
        for key, value in configmap["data"].items():
            (files / key).write_text(value)
        mount = template["spec"]["containers"][0]["volumeMounts"][0]["mountPath"]
        spec = json.loads(configmap["data"]["spec.json"])
        resolve = {}
        for barrier in (spec.get("barriers") or {}).values():
            if barrier:
                resolve[f"{barrier['host']}:{barrier['port']}"] = f"127.0.0.1:{barrier['port']}"
        if self.router:
            resolve[self.router[0]] = self.router[1]
        played.resolve = resolve
        count = int(job["spec"]["completions"])
        started = _now()
        stuck = bool(self.waiting_reason) and name.endswith(self.waiting_for)
        procs = []
        for index in range(count):
            pod = f"{name}-{index}-{secrets.token_hex(3)[:5]}"
            played.pods.append(pod)
            labels = {
                **template["metadata"]["labels"],
                "batch.kubernetes.io/job-name": name,
                "job-name": name,
                "batch.kubernetes.io/job-completion-index": str(index),
            }
            pod_spec = copy.deepcopy(template["spec"])
            pod_spec["hostname"] = f"{name}-{index}"
            self.kube.apply_object(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": pod,
                        "namespace": self.namespace,
                        "labels": labels,
                        "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
                    },
                    "spec": pod_spec,
                }
            )
            if stuck:
                status = pod_status(
                    ready=False,
                    phase="Pending",
                    containers=["runner"],
                    waiting_reason=self.waiting_reason,
                )
                write_pod_status(self.kube, self.namespace, pod, status)
                continue
            self._pod_phase(pod, "Running")
            argv = [
                a.replace(mount, str(files))
                for a in container["command"] + container.get("args", [])
            ]
            assert argv[0] == "python3", argv
            argv[0] = SYSTEM_PYTHON
            env = {
                "PATH": "/usr/bin:/bin",
                "JOB_COMPLETION_INDEX": str(index),
                "HPKV_BENCH_RESOLVE": json.dumps(resolve),
            }
            env.update({e["name"]: e["value"] for e in container.get("env", [])})
            log = _open_for_write(log_path(self.log_dir, self.namespace, pod, "runner"))
            procs.append(
                (
                    pod,
                    subprocess.Popen(
                        argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=files
                    ),
                    log,
                )
            )
        if stuck:
            return
        for pod, proc, log in procs:
            try:
                code = proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            log.close()
            played.exit_codes.append(code)
            self._pod_phase(pod, "Succeeded" if code == 0 else "Failed", exit_code=code)
        self._job_status(name, started, count, played.exit_codes)

    def _pod_phase(self, pod: str, phase: str, exit_code: int | None = None) -> None:
        status = pod_status(ready=phase == "Running", phase=phase, containers=["runner"])
        if exit_code is not None:
            status["containerStatuses"][0]["state"] = {
                "terminated": {
                    "exitCode": exit_code,
                    "reason": "Completed" if exit_code == 0 else "Error",
                    "startedAt": _now(),
                    "finishedAt": _now(),
                }
            }
            status["conditions"][0]["status"] = "False"
        write_pod_status(self.kube, self.namespace, pod, status)

    def _job_status(self, name: str, started: str, count: int, codes: list[int]) -> None:
        finished = _now()
        succeeded = sum(1 for c in codes if c == 0)
        failed = len(codes) - succeeded
        if failed:
            conditions = [
                {
                    "type": "FailureTarget",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit",
                    "lastTransitionTime": finished,
                    "lastProbeTime": finished,
                },
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit",
                    "lastTransitionTime": finished,
                    "lastProbeTime": finished,
                },
            ]
            status = {
                "startTime": started,
                "failed": failed,
                "succeeded": succeeded,
                "conditions": conditions,
            }
        else:
            conditions = [
                {
                    "type": "SuccessCriteriaMet",
                    "status": "True",
                    "reason": "CompletionsReached",
                    "message": "Reached expected number of succeeded pods",
                    "lastTransitionTime": finished,
                    "lastProbeTime": finished,
                },
                {
                    "type": "Complete",
                    "status": "True",
                    "reason": "CompletionsReached",
                    "message": "Reached expected number of succeeded pods",
                    "lastTransitionTime": finished,
                    "lastProbeTime": finished,
                },
            ]
            status = {
                "startTime": started,
                "completionTime": finished,
                "succeeded": succeeded,
                "completedIndexes": "0" if count == 1 else f"0-{count - 1}",
                "conditions": conditions,
            }
        status.update(active=0, ready=0, terminating=0, uncountedTerminatedPods={})
        self.kube.apply_object(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name, "namespace": self.namespace},
                "status": status,
            },
            subresource="status",
        )


def write_pod_status(kube: KubeHarness, namespace: str, pod: str, status: dict[str, Any]) -> None:
    kube.apply_object(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "namespace": namespace},
            "status": status,
        },
        subresource="status",
    )


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def assert_cross_pod_recovered(doc: dict[str, Any], cluster: FakeCluster) -> None:
    """The bench recovered the injected numbers: TTFT within 2 ms (the median error against the
    server's own clock, from reading the request to writing the first token; single requests may
    stray on this shared machine) and speedup within 5% of what the fake server did, hit
    tokens, hit rate and L2 bytes exact, L2 read time equal to the injected retrieve cost; and the
    server followed the injected timing model (loosely: this machine is shared)."""
    truth = cluster.truth_by_id()
    rows = {row["length"]: row for row in doc["summary"]["byLength"]}
    for length, row in rows.items():
        group = [r for r in doc["requests"] if r.get("length") == length]
        warm = [r for r in group if r["role"] == "warm"]
        cold = [r for r in group if r["role"] == "cold"]
        assert warm and cold and all(r["ok"] for r in group), group
        warm_truth = [truth[r["id"]] for r in warm]
        cold_truth = [truth[r["id"]] for r in cold]
        warm_true = _median([t.ttft_true_ms for t in warm_truth])
        cold_true = _median([t.ttft_true_ms for t in cold_truth])
        for records, served in ((warm, warm_truth), (cold, cold_truth)):
            errors = [r["ttftMs"] - t.ttft_true_ms for r, t in zip(records, served, strict=True)]
            assert abs(_median(errors)) <= 2.0, (length, errors)
        assert abs(row["speedup"] / (cold_true / warm_true) - 1) <= 0.05, (
            row["speedup"],
            cold_true / warm_true,
        )
        for group_truth, true_p50 in ((warm_truth, warm_true), (cold_truth, cold_true)):
            model = group_truth[0].ttft_model_ms
            assert all(t.ttft_model_ms == model <= t.ttft_true_ms for t in group_truth)
            assert true_p50 <= model * 1.25 + 5, (true_p50, model)
        assert all(t.external_hit > 0 and t.l2_tokens > 0 for t in warm_truth), (
            "pod B did not read the L2"
        )
        assert all(t.external_hit == 0 for t in cold_truth)
        for record, t in zip(warm, warm_truth, strict=True):
            assert record["hitTokens"] == t.external_hit
            assert record["l0HitTokens"] == t.l0_hit == 0
            assert record["promptTokens"] == t.prompt_tokens
            assert record["l2ReadBytes"] == t.l2_bytes
            assert abs(record["l2ReadMs"] - t.retrieve_ms) < 1e-6
        expected_rate = sum(t.external_hit for t in warm_truth) / sum(
            t.prompt_tokens for t in warm_truth
        )
        assert row["hitRate"] == expected_rate
        assert row["coldHitTokens"] == 0


def _open_for_write(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("w")
