"""Run the bench runner inside the cluster as a Kubernetes Job, collect its output, clean up.

One ConfigMap per run holds ``runner.py`` (this package's stdlib-only engine) and ``spec.json``.
Each scenario is one Job using the endpoint's own serving image (``python3 runner.py ...``), so no
image is built or pushed and the laptop's network is not in the numbers. ``--clients N`` makes it
an Indexed Job of N pods; a headless Service gives pod 0 a stable name so the others can wait for
it and start together (``runner.barrier``). Each pod prints its raw per-request timings between
marker lines; hpkv reads them from the pod logs (:class:`hpkv.kube.podlogs.PodLogs`) and deletes
the Job, its pods, the Service and the ConfigMap (also on failure or Ctrl-C, unless asked to keep
them). Owner references and ``ttlSecondsAfterFinished`` clean up after an interrupted hpkv.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpkv.bench import runner
from hpkv.context import poll_interval
from hpkv.errors import ApiError, HpkvError, NotFound, PreconditionFailed, WaitTimeout

if TYPE_CHECKING:
    from hpkv.context import RunContext

MOUNT_PATH = "/opt/hpkv-bench"
RUNNER_KEY = "runner.py"
SPEC_KEY = "spec.json"
RUN_LABEL = "hpkv.io/bench-run"
JOB_LABEL = "hpkv.io/bench-job"
SCENARIO_LABEL = "hpkv.io/bench-scenario"
COMMON_LABELS = {"app.kubernetes.io/name": "hpkv-bench", "app.kubernetes.io/managed-by": "hpkv"}
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
JOB_TTL_S = 3600
# Waiting reasons that will not fix themselves: fail at once instead of waiting for the timeout.
FATAL_WAITING = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
}


def runner_source() -> str:
    return Path(runner.__file__).read_text(encoding="utf-8")


@dataclass
class JobSettings:
    namespace: str
    run_id: str
    image: str
    python: str = "python3"
    cpu: str = "2"
    memory: str = "2Gi"
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    barrier_port: int = 29600
    timeout_s: float = 1800.0

    @property
    def configmap_name(self) -> str:
        return f"hpkv-bench-{self.run_id}"

    def job_name(self, scenario: str) -> str:
        return f"hpkv-bench-{self.run_id}-{scenario}"[:63].rstrip("-")


def barrier_for(settings: JobSettings, scenario: str, clients: int) -> dict[str, Any] | None:
    if clients <= 1:
        return None
    job = settings.job_name(scenario)
    return {
        "host": f"{job}-0.{job}.{settings.namespace}.svc.cluster.local",
        "port": settings.barrier_port,
        "timeoutS": settings.timeout_s,
    }


def configmap_manifest(settings: JobSettings, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": settings.configmap_name,
            "namespace": settings.namespace,
            "labels": {**COMMON_LABELS, RUN_LABEL: settings.run_id},
        },
        "data": {RUNNER_KEY: runner_source(), SPEC_KEY: json.dumps(spec, indent=1)},
    }


def job_manifest(settings: JobSettings, scenario: str, clients: int) -> dict[str, Any]:
    name = settings.job_name(scenario)
    labels = {**COMMON_LABELS, RUN_LABEL: settings.run_id, SCENARIO_LABEL: scenario}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 5,
        "containers": [
            {
                "name": "runner",
                "image": settings.image,
                "command": [settings.python, f"{MOUNT_PATH}/{RUNNER_KEY}"],
                "args": [
                    "--spec",
                    f"{MOUNT_PATH}/{SPEC_KEY}",
                    "--scenario",
                    scenario,
                    "--clients",
                    str(clients),
                ],
                "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                "resources": {
                    "requests": {"cpu": settings.cpu, "memory": settings.memory},
                    "limits": {"memory": settings.memory},
                },
                "volumeMounts": [{"name": "runner", "mountPath": MOUNT_PATH, "readOnly": True}],
            }
        ],
        "volumes": [{"name": "runner", "configMap": {"name": settings.configmap_name}}],
    }
    if clients > 1:
        pod_spec["subdomain"] = name
    if settings.node_selector:
        pod_spec["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        pod_spec["tolerations"] = list(settings.tolerations)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": clients,
            "parallelism": clients,
            "backoffLimit": 0,
            "activeDeadlineSeconds": int(settings.timeout_s),
            "ttlSecondsAfterFinished": JOB_TTL_S,
            "template": {"metadata": {"labels": {**labels, JOB_LABEL: name}}, "spec": pod_spec},
        },
    }


def service_manifest(settings: JobSettings, scenario: str) -> dict[str, Any]:
    name = settings.job_name(scenario)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": {**COMMON_LABELS, RUN_LABEL: settings.run_id},
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {JOB_LABEL: name},
            "ports": [{"name": "barrier", "port": settings.barrier_port, "protocol": "TCP"}],
        },
    }


def _owned_by(obj: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    obj["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": meta["name"],
            "uid": meta["uid"],
            "blockOwnerDeletion": False,
        }
    ]
    return obj


class JobLauncher:
    """Creates the run's ConfigMap once, then one Job per scenario; always cleans up."""

    def __init__(self, ctx: RunContext, settings: JobSettings, *, keep: bool = False) -> None:
        self.ctx = ctx
        self.settings = settings
        self.keep = keep
        self.created: list[tuple[str, str, str]] = []  # (apiVersion, kind, name)
        self._spec: dict[str, Any] | None = None
        self._jobs: list[dict[str, Any]] = []

    @property
    def kube(self) -> Any:
        return self.ctx.kube

    def create_configmap(self, spec: dict[str, Any]) -> None:
        from hpkv.kube import objects

        objects.apply(self.kube, configmap_manifest(self.settings, spec))
        self.created.append(("v1", "ConfigMap", self.settings.configmap_name))
        self._spec = spec

    def run(self, scenario: str, clients: int) -> list[dict[str, Any]]:
        """Run one scenario's Job to completion; one result per client pod (index order)."""
        from hpkv.kube import objects

        job_obj = job_manifest(self.settings, scenario, clients)
        name = job_obj["metadata"]["name"]
        job = objects.apply(self.kube, job_obj)
        self.created.append(("batch/v1", "Job", name))
        self._adopt_configmap(job)
        if clients > 1:
            objects.apply(self.kube, _owned_by(service_manifest(self.settings, scenario), job))
            self.created.append(("v1", "Service", name))
        self.ctx.reporter.step(
            f"job {self.settings.namespace}/{name}: {clients} runner pod(s), image "
            f"{self.settings.image}"
        )
        self._wait(name, clients)
        return self._collect(name, clients)

    def _adopt_configmap(self, job: dict[str, Any]) -> None:
        """Make every Job of the run an owner of the ConfigMap, so the garbage collector removes it
        once the Jobs are gone even if hpkv is interrupted before its own clean-up."""
        from hpkv.kube import objects

        if self._spec is None:
            return
        self._jobs.append(job)
        configmap = configmap_manifest(self.settings, self._spec)
        owners = [
            _owned_by({"metadata": {}}, j)["metadata"]["ownerReferences"][0] for j in self._jobs
        ]
        configmap["metadata"]["ownerReferences"] = owners
        objects.apply(self.kube, configmap)

    def cleanup(self) -> list[str]:
        """Delete what this launcher created (newest first); names of what was deleted."""
        from hpkv.kube import objects

        if self.keep:
            return []
        deleted = []
        for api_version, kind, name in reversed(self.created):
            try:
                if kind == "Job":
                    self._delete_job(name)
                else:
                    objects.delete(self.kube, api_version, kind, name, self.settings.namespace)
                deleted.append(f"{kind}/{self.settings.namespace}/{name}")
            except HpkvError as exc:
                self.ctx.reporter.warn(f"could not delete {kind} {name}: {exc.one_line()}")
        self.created.clear()
        return deleted

    def _delete_job(self, name: str) -> None:
        from hpkv.kube import is_status, kube_errors

        with kube_errors(f"delete Job {self.settings.namespace}/{name}"):
            try:
                self.kube.batch.delete_namespaced_job(
                    name, self.settings.namespace, propagation_policy="Background"
                )
            except Exception as exc:
                if not is_status(exc, 404):
                    raise

    # --- waiting -----------------------------------------------------------------------------
    def _wait(self, name: str, clients: int) -> None:
        from hpkv.kube import kube_errors

        namespace = self.settings.namespace
        deadline = time.monotonic() + self.settings.timeout_s
        interval = poll_interval(2.0)
        with self.ctx.reporter.waiting(f"waiting for job {name} ({clients} pod(s))"):
            while True:
                with kube_errors(f"read Job {namespace}/{name}"):
                    job = self.kube.batch.read_namespaced_job(name, namespace)
                    pods = self.kube.core.list_namespaced_pod(
                        namespace, label_selector=f"{JOB_LABEL}={name}"
                    ).items
                status = job.status
                conditions = {c.type: c for c in (status.conditions or [])}
                if (status.succeeded or 0) >= clients or _true(conditions.get("Complete")):
                    return
                failed = conditions.get("Failed")
                if (status.failed or 0) > 0 or _true(failed):
                    reason = failed.message or failed.reason if _true(failed) else "a pod failed"
                    raise self._failure(name, pods, str(reason))
                self._check_pods(name, pods)
                if time.monotonic() > deadline:
                    raise WaitTimeout(
                        f"job {namespace}/{name} did not finish in {self.settings.timeout_s:.0f} s",
                        fix="raise --timeout, or check 'kubectl describe job' for scheduling",
                    )
                time.sleep(interval)

    def _check_pods(self, name: str, pods: list[Any]) -> None:
        for pod in pods:
            for status in (pod.status.container_statuses or []) if pod.status else []:
                waiting = status.state.waiting if status.state else None
                if waiting is not None and waiting.reason in FATAL_WAITING:
                    raise PreconditionFailed(
                        f"runner pod {pod.metadata.name} cannot start: {waiting.reason}: "
                        f"{waiting.message or ''}".strip(),
                        fix="set bench.image to an image with python3 that the nodes can pull",
                    )

    def _failure(self, name: str, pods: list[Any], reason: str) -> HpkvError:
        from hpkv.kube.podlogs import PodLogs

        logs = PodLogs(self.kube)
        for pod in pods:
            if pod.status is None or pod.status.phase != "Failed":
                continue
            try:
                text = logs.read(self.settings.namespace, pod.metadata.name, container="runner")
            except HpkvError:
                continue
            error = runner.find_error(text)
            if error:
                return ApiError(
                    f"bench runner in pod {pod.metadata.name} failed: {error}",
                    fix="check that the endpoint's pods are healthy; rerun with --keep-job to inspect",
                )
            tail = " | ".join(text.strip().splitlines()[-3:])
            return ApiError(
                f"bench runner in pod {pod.metadata.name} failed: {tail or reason}",
                fix="rerun with --keep-job and read 'kubectl logs' of the pod",
            )
        return ApiError(
            f"job {self.settings.namespace}/{name} failed: {reason}",
            fix="rerun with --keep-job and check 'kubectl describe job'",
        )

    # --- results -----------------------------------------------------------------------------
    def _collect(self, name: str, clients: int) -> list[dict[str, Any]]:
        from hpkv.kube import kube_errors
        from hpkv.kube.podlogs import PodLogs

        namespace = self.settings.namespace
        with kube_errors(f"list the pods of Job {namespace}/{name}"):
            pods = self.kube.core.list_namespaced_pod(
                namespace, label_selector=f"{JOB_LABEL}={name}"
            ).items
        logs = PodLogs(self.kube)
        by_index: dict[int, dict[str, Any]] = {}
        for pod in pods:
            if pod.status is None or pod.status.phase != "Succeeded":
                continue
            text = logs.read(namespace, pod.metadata.name, container="runner")
            for result in runner.decode_results(text):
                by_index[int(result.get("client", 0))] = result
        missing = [i for i in range(clients) if i not in by_index]
        if missing:
            raise NotFound(
                f"job {namespace}/{name} finished but no result came from client(s) "
                f"{', '.join(map(str, missing))}",
                fix="the pod logs may have been rotated or the pods removed; rerun with --keep-job",
            )
        return [by_index[i] for i in range(clients)]


def _true(condition: Any) -> bool:
    return condition is not None and condition.status == "True"
