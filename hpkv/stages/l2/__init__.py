"""Stage 4: wire the inference pods to the Curvine L2, durably.

The InferenceEndpointConfig CRD cannot point LMCache at a file system nor mount a volume into the
vLLM container, and a patch of the operator-rendered Deployment is lost at the next re-render. So
the default mode (``policy``) changes the endpoint's **pods at admission**: a
MutatingAdmissionPolicy + binding (``admissionregistration.k8s.io/v1``) where the cluster serves
it, else a Kyverno ClusterPolicy. The operator's Deployment stays exactly as the operator renders
it; every pod created from it, now or after any re-render, gets:

* exactly one ``LMCACHE_REMOTE_URL=fs://localhost:0/<mount>/`` (the operator's entry is replaced,
  duplicates are dropped), ``LMCACHE_REMOTE_SERDE=naive`` (cachegen has a zip bug on fs) and
  ``PYTHONHASHSEED`` (the same on every replica, else cache keys differ across pods);
* the Curvine PVC as a volume, mounted on the vLLM container at the mount path;
* a per-pod temp directory for the fs connector: LMCache writes each chunk through
  ``<chunk>.tmp``, a name shared by every writer, so two replicas storing one chunk collide.
  ``fs_connector_relative_tmp_dir`` is merged into ``LMCACHE_EXTRA_CONFIG`` (keeping what the
  operator sets there) as ``.tmp-$(HPKV_POD_NAME)``; the kubelet expands it from the pod name.

Pods admitted by the policy carry the annotation ``hpkv.io/l2-wiring`` (a fingerprint of the wiring);
pods without the current fingerprint are stale and are re-created: a rolling restart when a surge
pod can be scheduled, else pod by pod (when replicas use every free GPU, surge pods never schedule).

Mode ``patch`` automates the published procedure instead (pause the operator, scale the model to 0,
one JSON patch, scale up, wait Ready, restore the operator), restoring the operator whatever
happens; ``status`` warns that the next re-render undoes it.

Layout: :mod:`hpkv.stages.l2.wiring` (the wiring as data: policies, JSON patch),
:mod:`hpkv.stages.l2.pods` (reading pods: findings, cache-key parts, restart strategy); this module
holds the stage. Other commands use :meth:`L2Stage.reports` / :meth:`L2Stage.status`.
"""

from __future__ import annotations

import contextlib
import datetime
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpkv import reads, topology
from hpkv.context import poll_interval
from hpkv.errors import (
    ApiError,
    HpkvError,
    NotFound,
    PreconditionFailed,
    UsageError,
    WaitTimeout,
)
from hpkv.stages.base import (
    Action,
    ApplyResult,
    Check,
    CheckSpec,
    CheckState,
    Detector,
    IamNeed,
    Plan,
    PlanDeferred,
    Stage,
    Verb,
    worst_state,
)
from hpkv.stages.l2.pods import (
    PodWiring,
    choose_mechanism,
    choose_restart,
    consistency_findings,
    inspect_pod,
    pod_findings,
    probe_command,
)
from hpkv.stages.l2.wiring import (
    ADMISSION_API,
    BINDING_KIND,
    DEGRADED_PATTERN,
    ENDPOINT_ANNOTATION,
    HASH_SEED_ENV,
    KYVERNO_API,
    KYVERNO_CHART,
    KYVERNO_CHART_VERSION,
    KYVERNO_KIND,
    KYVERNO_NAMESPACE,
    KYVERNO_RELEASE,
    KYVERNO_REPO,
    MANAGED_LABELS,
    MECHANISMS,
    MODES,
    PATCH_ORIGINAL_ANNOTATION,
    PATCH_STATE_CONFIGMAP,
    POLICY_KIND,
    REMOTE_URL_ENV,
    RESTARTED_AT_ANNOTATION,
    RESTARTS,
    SEED_WARNING_PATTERN,
    WIRING_ANNOTATION,
    Wiring,
    binding_manifest,
    kyverno_manifest,
    object_name,
    patch_operations,
    policy_manifest,
    vllm_container_index,
)
from hpkv.topology import EndpointRef

if TYPE_CHECKING:
    from hpkv.runbook.profile import ClusterProfile

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "mode": {
            "type": "string",
            "enum": list(MODES),
            "description": "policy (mutate pods at admission, survives re-renders) or patch",
        },
        "mechanism": {
            "type": "string",
            "enum": list(MECHANISMS),
            "description": "auto (MutatingAdmissionPolicy where served, else Kyverno), "
            "admission-policy or kyverno",
        },
        "mountPath": {
            "type": "string",
            # LMCache splits base paths on commas; the path is also embedded in a URL.
            "pattern": r"^/[A-Za-z0-9._/-]*[A-Za-z0-9._-]$",
            "description": "an absolute path without commas or spaces, e.g. /mnt/curvine/l2cache",
        },
        "volumeName": {
            "type": "string",
            "pattern": r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
            "description": "a DNS label naming the pod volume, e.g. curvine-cache",
        },
        "pythonHashSeed": {
            "type": "integer",
            "minimum": 0,
            "maximum": 4294967295,
            "description": "an integer 0..4294967295, the same for every replica",
        },
        "restart": {
            "type": "string",
            "enum": list(RESTARTS),
            "description": "how stale pods are re-created: auto, rollout, pod-by-pod or none",
        },
        "failurePolicy": {
            "type": "string",
            "enum": ["Ignore", "Fail"],
            "description": "Ignore (pods start unwired if the mutation errs; status shows it) "
            "or Fail (pod creation fails)",
        },
        "probe": {
            "type": "boolean",
            "description": "true to exec a write/read probe and read LMCache logs in status",
        },
        "installKyverno": {
            "type": "boolean",
            "description": "true to install Kyverno (what --install-kyverno does, also for "
            "'hpkv up') when the cluster serves no MutatingAdmissionPolicy (Kubernetes < 1.36)",
        },
        "kyverno": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "repo": {
                    "type": "string",
                    "description": "the chart repository URL ('' when chart is a local path)",
                },
                "chart": {"type": "string", "minLength": 1, "description": "the chart name"},
                "chartVersion": {
                    "type": "string",
                    "minLength": 1,
                    "description": "a chart version such as 3.7.2",
                },
                "namespace": {
                    "type": "string",
                    "minLength": 1,
                    "description": "the namespace Kyverno is installed in",
                },
            },
        },
    },
}
# Stage 4 talks to Kubernetes only (plus the DescribeCluster every command makes).
IAM_ACTIONS: list[IamNeed] = []

CONFIG_DEFAULTS: dict[str, Any] = {
    "mode": "policy",
    "mechanism": "auto",
    "mountPath": topology.L2_MOUNT_PATH,
    "volumeName": topology.L2_VOLUME_NAME,
    "pythonHashSeed": 0,
    "restart": "auto",
    "failurePolicy": "Ignore",
    "probe": True,
    "installKyverno": False,
    "kyverno": {
        "repo": KYVERNO_REPO,
        "chart": KYVERNO_CHART,
        "chartVersion": KYVERNO_CHART_VERSION,
        "namespace": KYVERNO_NAMESPACE,
    },
}


START_LOG_BYTES = 4 * 1024 * 1024
POLICY_PLURALS = {
    POLICY_KIND: "mutatingadmissionpolicies",
    BINDING_KIND: "mutatingadmissionpolicybindings",
    KYVERNO_KIND: "clusterpolicies",
}


@contextlib.contextmanager
def _termination_interrupts() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt (as SIGINT does), so ``finally`` blocks run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _interrupts_deferred(on_signal: Callable[[], None]) -> Iterator[None]:
    """Interrupts wait while the operator is being restored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def defer(_signum: int, _frame: Any) -> None:
        on_signal()

    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, defer) for s in sigs}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _op_value(ops: list[dict[str, Any]], suffix: str) -> Any:
    return next(o["value"] for o in ops if o["op"] == "add" and o["path"].endswith(suffix))


# --- the stage ----------------------------------------------------------------------------------
@dataclass
class EndpointReport:
    """The L2 wiring of one endpoint: what is installed, its pods, and the resulting checks."""

    ref: EndpointRef
    mechanism: str  # "admission-policy", "kyverno", "patch" or "" (not wired)
    policy_current: bool
    patched: bool
    pods: list[PodWiring] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    deployment: dict[str, Any] | None = None

    @property
    def state(self) -> CheckState:
        return worst_state(c.state for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "endpoint": str(self.ref),
            "mechanism": self.mechanism,
            "policyCurrent": self.policy_current,
            "patched": self.patched,
            "state": self.state.value,
            "stalePods": self.stale,
            "pods": [p.to_dict() for p in self.pods],
            "checks": [c.to_dict() for c in self.checks],
        }


class L2Stage(Stage):
    name = "l2"
    title = "L2 wiring (LMCache fs connector on the Curvine PVC)"
    number = 4

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self._served: dict[str, bool] = {}
        self._planned: list[EndpointRef] = []
        self._remove_mode: str | None = None

    # --- configuration -------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        section = self.ctx.settings.section("l2")
        merged = {**CONFIG_DEFAULTS, **{k: v for k, v in section.items() if v is not None}}
        merged["kyverno"] = {**CONFIG_DEFAULTS["kyverno"], **(section.get("kyverno") or {})}
        return merged

    def wiring(self) -> Wiring:
        config = self.config()
        # The curvine section is owned by stage 3; read with the shared defaults.
        curvine = self.ctx.settings.section("curvine")
        return Wiring(
            mount_path=str(config["mountPath"]),
            volume_name=str(config["volumeName"]),
            pvc_name=str(curvine.get("pvcName") or topology.CURVINE_PVC),
            storage_class=str(curvine.get("storageClassName") or topology.CURVINE_STORAGE_CLASS),
            hash_seed=str(config["pythonHashSeed"]),
        )

    def _mode(self, mode: str | None) -> str:
        mode = mode or self.config()["mode"]
        if mode not in MODES:
            raise UsageError(
                f"--mode {mode} is not one of {', '.join(MODES)}", fix="use policy or patch"
            )
        return mode

    def _restart_choice(self, restart: str | None) -> str:
        restart = restart or self.config()["restart"]
        if restart not in RESTARTS:
            raise UsageError(
                f"--restart {restart} is not one of {', '.join(RESTARTS)}",
                fix="use auto, rollout, pod-by-pod or none",
            )
        return restart

    # --- discovery -----------------------------------------------------------------------------
    def serves(self, api_version: str, kind: str) -> bool:
        key = f"{api_version}/{kind}"
        if key not in self._served:
            self._served[key] = reads.serves(self.ctx, api_version, kind)
        return self._served[key]

    def available_mechanism(self) -> str:
        """'admission-policy', 'kyverno' or '' for this cluster (honours l2.mechanism)."""
        preference = self.config()["mechanism"]
        admission = preference != "kyverno" and self.serves(ADMISSION_API, POLICY_KIND)
        kyverno = preference != "admission-policy" and self.serves(KYVERNO_API, KYVERNO_KIND)
        return choose_mechanism(admission_policy=admission, kyverno=kyverno, preference=preference)

    def endpoints(self, selected: Sequence[str] | None = None) -> list[EndpointRef]:
        """The endpoints named by ``--endpoint`` (NAME or NAMESPACE/NAME), or all of them."""
        known = reads.endpoint_refs(self.ctx)
        if not selected:
            return known
        chosen: list[EndpointRef] = []
        listing = ", ".join(str(r) for r in known) or "(none)"
        for wanted in selected:
            namespace, _, name = wanted.rpartition("/")
            matches = [r for r in known if r.name == name and namespace in ("", r.namespace)]
            if not matches:
                raise NotFound(
                    f"InferenceEndpointConfig '{wanted}' not found",
                    fix=f"use one of: {listing}",
                )
            if len(matches) > 1:
                raise UsageError(
                    f"endpoint name '{wanted}' exists in several namespaces",
                    fix="name it as NAMESPACE/NAME: " + ", ".join(str(m) for m in matches),
                )
            if matches[0] not in chosen:
                chosen.append(matches[0])
        return chosen

    # --- reads ---------------------------------------------------------------------------------
    def _plain(self, obj: Any) -> dict[str, Any]:
        return self.ctx.kube.api_client.sanitize_for_serialization(obj)

    def _read_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        deployment = reads.optional(
            self.ctx,
            ("kube:deployment", namespace, name),
            f"Deployment {namespace}/{name}",
            lambda: self.ctx.kube.apps.read_namespaced_deployment(name, namespace),
        )
        return None if deployment is None else self._plain(deployment)

    def deployment(self, ref: EndpointRef) -> dict[str, Any] | None:
        """The endpoint's worker Deployment (named after the endpoint, in its namespace)."""
        return self._read_deployment(ref.namespace, ref.name)

    def pods(self, ref: EndpointRef) -> list[dict[str, Any]]:
        """The endpoint's pods (label app=<endpoint>), terminating ones excluded."""
        from hpkv.kube import kube_errors

        def load() -> list[Any]:
            with kube_errors(f"list the pods of {ref}"):
                return list(
                    self.ctx.kube.core.list_namespaced_pod(
                        ref.namespace, label_selector=f"app={ref.name}"
                    ).items
                )

        items = self.ctx.memo(("kube:pods", ref.namespace, f"app={ref.name}"), load)
        pods = [self._plain(p) for p in items]
        return sorted(
            (p for p in pods if not p["metadata"].get("deletionTimestamp")),
            key=lambda p: p["metadata"]["name"],
        )

    def pvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        pvc = reads.optional(
            self.ctx,
            ("kube:pvc", namespace, name),
            f"PersistentVolumeClaim {namespace}/{name}",
            lambda: self.ctx.kube.core.read_namespaced_persistent_volume_claim(name, namespace),
        )
        return None if pvc is None else self._plain(pvc)

    def _read_optional(self, api_version: str, kind: str, name: str) -> dict[str, Any] | None:
        """A cluster-scoped policy object by name (None when absent or its API is not served):
        one GET, no API discovery."""
        group, version = api_version.split("/")
        plural = POLICY_PLURALS[kind]
        return reads.optional(
            self.ctx,
            ("kube:custom", api_version, plural, name),
            f"{kind} {name}",
            lambda: self.ctx.kube.custom.get_cluster_custom_object(group, version, plural, name),
        )

    def managed_policies(self) -> list[dict[str, Any]]:
        """Every admission policy and Kyverno ClusterPolicy hpkv created (any endpoint)."""
        from hpkv.concurrency import fan_out

        selector = ",".join(f"{k}={v}" for k, v in MANAGED_LABELS.items())
        lists = fan_out(
            [
                lambda api=api, kind=kind: reads.custom_objects(
                    self.ctx, api, POLICY_PLURALS[kind], selector
                )
                for api, kind in ((ADMISSION_API, POLICY_KIND), (KYVERNO_API, KYVERNO_KIND))
            ]
        )
        return [item for items in lists for item in items]

    def policy_objects(self, ref: EndpointRef) -> dict[str, dict[str, Any] | None]:
        from hpkv.concurrency import fan_out

        name = object_name(ref)
        kinds = ((ADMISSION_API, POLICY_KIND), (ADMISSION_API, BINDING_KIND))
        kinds += ((KYVERNO_API, KYVERNO_KIND),)
        found = fan_out(
            [lambda a=api, k=kind: self._read_optional(a, k, name) for api, kind in kinds]
        )
        return {kind: obj for (_api, kind), obj in zip(kinds, found, strict=True)}

    def _state_name(self, ref: EndpointRef) -> str:
        return f"{PATCH_STATE_CONFIGMAP}-{ref.name}"[:253]

    def patch_state(self, ref: EndpointRef) -> dict[str, str] | None:
        """What an unfinished ``--mode patch`` run recorded (replica counts to restore), or None."""
        name = self._state_name(ref)
        cm = reads.optional(
            self.ctx,
            ("kube:configmap", ref.namespace, name),
            f"ConfigMap {ref.namespace}/{name}",
            lambda: self.ctx.kube.core.read_namespaced_config_map(name, ref.namespace),
        )
        return None if cm is None else dict(cm.data or {})

    # --- status --------------------------------------------------------------------------------
    def status(
        self, endpoints: Sequence[str] | None = None, *, probe: bool | None = None
    ) -> list[Check]:
        with self.ctx.shared_reads():
            return [self._admission_check(), *self._endpoint_checks(endpoints, probe=probe)]

    def check_functions(self) -> list[CheckSpec]:
        """For ``hpkv status``: the admission API, then every endpoint's wiring rows (endpoints
        checked side by side, the pods of each probed side by side)."""
        return [
            CheckSpec("admission", lambda: [self._admission_check()]),
            CheckSpec("endpoints", lambda: self._endpoint_checks(None)),
        ]

    def _endpoint_checks(
        self, endpoints: Sequence[str] | None, *, probe: bool | None = None
    ) -> list[Check]:
        refs = self.endpoints(endpoints)
        if not refs:
            return [
                self.check(
                    "endpoints",
                    CheckState.WARN,
                    "no InferenceEndpointConfigs in the cluster",
                    "deploy an inference endpoint first (stage 2), then run 'hpkv l2 apply'",
                )
            ]
        return [check for report in self.reports(endpoints, probe=probe) for check in report.checks]

    def installed(self) -> bool | None:
        """An admission policy hpkv created exists, or an endpoint's Deployment carries the
        ``--mode patch`` wiring."""
        from hpkv.concurrency import fan_out

        def endpoints() -> list[dict[str, Any] | None]:
            # Each endpoint's reads are what its checks read first: made now, side by side with
            # the policy lists, they are shared when the checks run.
            refs = self.endpoints()
            fan_out([lambda ref=ref: self._prefetch(ref) for ref in refs])
            return [self.deployment(ref) for ref in refs]

        policies, deployments = fan_out([self.managed_policies, endpoints])
        if policies:
            return True
        return any(self._patch_applied(d) for d in deployments if d is not None)

    def _prefetch(self, ref: EndpointRef) -> None:
        from hpkv.concurrency import fan_out

        wiring = self.wiring()
        fan_out(
            [
                lambda: self.policy_objects(ref),
                lambda: self.deployment(ref),
                lambda: self.pods(ref),
                lambda: self.patch_state(ref),
                lambda: self.pvc(ref.namespace, wiring.pvc_name),
            ]
        )

    @staticmethod
    def _patch_applied(deployment: dict[str, Any]) -> bool:
        annotations = deployment["metadata"].get("annotations") or {}
        return PATCH_ORIGINAL_ANNOTATION in annotations

    def namespaces(self) -> list[str]:
        return sorted({ref.namespace for ref in self.endpoints()})

    def detectors(self) -> list[Detector]:
        from hpkv.stages.l2 import detectors

        return detectors.detectors(self)

    def reports(
        self, endpoints: Sequence[str] | None = None, *, probe: bool | None = None
    ) -> list[EndpointReport]:
        """Per-endpoint wiring reports (for ``hpkv status`` / ``hpkv diagnose``), side by side."""
        from hpkv.concurrency import fan_out

        refs = self.endpoints(endpoints)
        return fan_out([lambda ref=ref: self.report(ref, probe=probe) for ref in refs])

    def _admission_check(self) -> Check:
        preference = self.config()["mechanism"]
        if preference != "kyverno" and self.serves(ADMISSION_API, POLICY_KIND):
            return self.check("admission", CheckState.OK, f"{POLICY_KIND} served ({ADMISSION_API})")
        if preference != "admission-policy" and self.serves(KYVERNO_API, KYVERNO_KIND):
            return self.check("admission", CheckState.OK, f"Kyverno {KYVERNO_KIND} served")
        return self.check(
            "admission",
            CheckState.WARN,
            f"neither {POLICY_KIND} ({ADMISSION_API}) nor Kyverno is available: only "
            "--mode patch works, and the operator's next re-render undoes it",
            "use Kubernetes 1.36+ (MutatingAdmissionPolicy GA), or 'hpkv l2 apply "
            "--install-kyverno'",
        )

    def report(self, ref: EndpointRef, *, probe: bool | None = None) -> EndpointReport:
        """Check one endpoint's wiring: mechanism, PVC, replica consistency, stale pods, pods."""
        from hpkv.concurrency import fan_out

        wiring = self.wiring()
        fingerprint = wiring.fingerprint(ref)
        # The reads are independent: side by side (one after another with a 1-worker runner).
        objs, deployment, pods, state, pvc = fan_out(
            [
                lambda: self.policy_objects(ref),
                lambda: self.deployment(ref),
                lambda: self.pods(ref),
                lambda: self.patch_state(ref),
                lambda: self.pvc(ref.namespace, wiring.pvc_name),
            ]
        )
        patched = False
        if deployment is not None:
            template = deployment["spec"]["template"]
            as_pod = {"metadata": template.get("metadata") or {}, "spec": template["spec"]}
            patched = inspect_pod(as_pod, ref.name, wiring).wired(wiring)
        if objs[BINDING_KIND] is not None or objs[POLICY_KIND] is not None:
            mechanism, live = "admission-policy", objs[POLICY_KIND] or objs[BINDING_KIND]
        elif objs[KYVERNO_KIND] is not None:
            mechanism, live = "kyverno", objs[KYVERNO_KIND]
        else:
            mechanism, live = ("patch" if patched else ""), None
        current = bool(
            live
            and (live["metadata"].get("annotations") or {}).get(WIRING_ANNOTATION) == fingerprint
        )
        report = EndpointReport(ref, mechanism, current, patched)
        report.pods = [inspect_pod(p, ref.name, wiring) for p in pods]
        report.deployment = deployment
        if self._probing(probe):
            fan_out([lambda pod=pod: self._probe_pod(pod, wiring) for pod in report.pods])
        present = bool(mechanism)
        report.stale = [p.name for p in report.pods if present and p.fingerprint != fingerprint]
        if state is not None:
            report.checks.append(self._paused_check(ref, state))
        report.checks.append(self._mechanism_check(ref, report, objs, deployment))
        in_use = present or any(p.wired(wiring) for p in report.pods)
        report.checks.append(self._pvc_check(ref, wiring, pvc, relevant=in_use))
        report.checks.append(self._consistency_check(ref, report.pods, wiring))
        if present:
            report.checks.append(self._stale_check(ref, report))
        for pod in report.pods:
            report.checks.append(self._pod_check(ref, pod, wiring, present=present))
        return report

    def _probing(self, probe: bool | None) -> bool:
        return bool(self.config()["probe"]) if probe is None else probe

    def _paused_check(self, ref: EndpointRef, state: dict[str, str]) -> Check:
        replicas = state.get("operatorReplicas", "?")
        return self.check(
            f"operator {ref}",
            CheckState.FAIL,
            f"a 'hpkv l2 apply --mode patch' run (interrupted, or still running) left state "
            f"for {ref}: operator "
            f"{topology.OPERATOR_NAMESPACE}/{topology.OPERATOR_DEPLOYMENT} to be restored to "
            f"{replicas} replica(s), model to {state.get('modelReplicas', '?')}",
            f"rerun 'hpkv l2 apply --mode patch --endpoint {ref}' (it restores both), or "
            f"'kubectl -n {topology.OPERATOR_NAMESPACE} scale deployment "
            f"{topology.OPERATOR_DEPLOYMENT} --replicas={replicas}'",
        )

    def _mechanism_check(
        self,
        ref: EndpointRef,
        report: EndpointReport,
        objs: dict[str, dict[str, Any] | None],
        deployment: dict[str, Any] | None,
    ) -> Check:
        name = f"l2 {ref}"
        apply_fix = f"run 'hpkv l2 apply --endpoint {ref}'"
        rendered = "" if deployment else "; no worker Deployment yet (the operator renders it)"
        if report.mechanism == "admission-policy" and (
            objs[POLICY_KIND] is None or objs[BINDING_KIND] is None
        ):
            missing = POLICY_KIND if objs[POLICY_KIND] is None else BINDING_KIND
            return self.check(
                name,
                CheckState.FAIL,
                f"{missing} {object_name(ref)} is missing: new pods are not wired",
                apply_fix,
            )
        if report.mechanism in ("admission-policy", "kyverno"):
            kind = (
                POLICY_KIND if report.mechanism == "admission-policy" else f"Kyverno {KYVERNO_KIND}"
            )
            if not report.policy_current:
                return self.check(
                    name,
                    CheckState.WARN,
                    f"{kind} {object_name(ref)} is from another configuration (l2/curvine "
                    "settings changed)",
                    apply_fix,
                )
            extra = "; the Deployment also carries a --mode patch" if report.patched else ""
            return self.check(
                name,
                CheckState.OK,
                f"{kind} {object_name(ref)} wires new pods at admission (survives operator "
                f"re-renders){extra}{rendered}",
            )
        if report.mechanism == "patch":
            return self.check(
                name,
                CheckState.WARN,
                "wired by --mode patch: the operator's next re-render (endpoint edit, operator "
                "upgrade, deleted Deployment) silently undoes it",
                f"run 'hpkv l2 apply --mode policy --endpoint {ref}'",
            )
        return self.check(
            name, CheckState.WARN, f"not wired to the Curvine L2{rendered}", apply_fix
        )

    def _pvc_check(
        self, ref: EndpointRef, wiring: Wiring, pvc: dict[str, Any] | None, *, relevant: bool
    ) -> Check:
        name = f"pvc {ref.namespace}/{wiring.pvc_name}"
        bad = CheckState.FAIL if relevant else CheckState.WARN
        if pvc is None:
            return self.check(
                name,
                bad,
                "not found: wired pods cannot start",
                "run 'hpkv curvine apply' (it creates the Curvine PVC in every endpoint namespace)",
            )
        spec, status = pvc.get("spec") or {}, pvc.get("status") or {}
        phase = status.get("phase") or "Pending"
        modes = spec.get("accessModes") or []
        storage_class = spec.get("storageClassName") or "(none)"
        if phase != "Bound":
            return self.check(
                name,
                bad,
                f"{phase}, not Bound (storage class {storage_class}): pods mounting it stay Pending",
                f"see 'kubectl -n {ref.namespace} describe pvc {wiring.pvc_name}' and 'hpkv "
                "curvine status' (CSI driver, master)",
            )
        if "ReadWriteMany" not in modes:
            return self.check(
                name,
                bad,
                f"access modes {','.join(modes) or '(none)'}: replicas on different nodes need "
                "ReadWriteMany",
                "re-create it with 'hpkv curvine apply'",
            )
        evidence = f"Bound, ReadWriteMany, storage class {storage_class}"
        if storage_class != wiring.storage_class:
            return self.check(
                name,
                CheckState.WARN,
                f"{evidence}, not the Curvine class {wiring.storage_class}",
                "point curvine.pvcName at the Curvine PVC, or re-create it with 'hpkv curvine apply'",
            )
        return self.check(name, CheckState.OK, evidence)

    def _consistency_check(
        self, ref: EndpointRef, pods: Sequence[PodWiring], wiring: Wiring
    ) -> Check:
        name = f"replicas {ref}"
        wired = [p for p in pods if p.wired(wiring)]
        if len(wired) < 2:
            return self.check(
                name,
                CheckState.OK,
                f"{len(wired)} wired pod(s): nothing to compare"
                if wired
                else f"{len(pods)} pod(s), none wired yet",
            )
        differing = consistency_findings(wired)
        if not differing:
            parts = wired[0].key_parts
            shown = ", ".join(f"{k}={v}" for k, v in parts.items())
            return self.check(name, CheckState.OK, f"{len(wired)} pods share {shown}")
        described = "; ".join(
            f"{part}: "
            + ", ".join(f"{value} on {'/'.join(names)}" for value, names in groups.items())
            for part, groups in differing.items()
        )
        return self.check(
            name,
            CheckState.FAIL,
            f"cache keys differ between replicas, so they never hit each other's L2 entries: "
            f"{described}",
            f"make the endpoint's pods identical: re-create old pods ('hpkv l2 apply --endpoint "
            f"{ref}') or fix the differing args/env in the InferenceEndpointConfig",
        )

    def _stale_check(self, ref: EndpointRef, report: EndpointReport) -> Check:
        name = f"stale {ref}"
        if not report.stale:
            return self.check(name, CheckState.OK, "every pod carries the current wiring")
        shown = ", ".join(report.stale[:10]) + (" ..." if len(report.stale) > 10 else "")
        return self.check(
            name,
            CheckState.WARN,
            f"{len(report.stale)} pod(s) created before the current wiring: {shown}",
            f"run 'hpkv l2 apply --endpoint {ref}' (re-creates them), or 'kubectl -n "
            f"{ref.namespace} delete pod {' '.join(report.stale[:10])}'",
        )

    def _pod_check(
        self, ref: EndpointRef, pod: PodWiring, wiring: Wiring, *, present: bool
    ) -> Check:
        name = f"pod {pod.namespace}/{pod.name}"
        findings = pod_findings(pod, wiring, ref, mechanism_present=present)
        if findings:
            worst = findings[0]
            return self.check(
                name, worst.state, "; ".join(f.evidence for f in findings), worst.remediation
            )
        evidence = [
            f"{REMOTE_URL_ENV}={wiring.remote_url} (once)",
            f"{wiring.mount_path} <- PVC {pod.claim_name}",
            f"{HASH_SEED_ENV}={pod.seeds[0]}",
            f"tmp dir {pod.tmp_dir}",
        ]
        if pod.probe is not None:
            evidence.append(pod.probe_evidence)
        if pod.log_state is not None:
            evidence.append(pod.log_evidence)
        if pod.phase != "Running":
            evidence.append(f"phase {pod.phase}")
        return self.check(name, CheckState.OK, "; ".join(evidence))

    def _probe_pod(self, pod: PodWiring, wiring: Wiring) -> None:
        """Exec a write/read probe in the mount and scan the start-up log (Running pods only)."""
        from hpkv.kube import podlogs
        from hpkv.kube.podio import PodIO

        if pod.phase != "Running" or not pod.wired(wiring) or pod.mount_volume is None:
            return
        io = PodIO(self.ctx.kube, timeout=20.0)
        token = f"{pod.name}-{secrets.token_hex(4)}"
        try:
            result = io.exec(
                pod.namespace, pod.name, pod.container, probe_command(wiring.mount_path, token)
            )
        except HpkvError as exc:
            pod.probe, pod.probe_evidence = CheckState.UNKNOWN, f"probe not run: {exc.message}"
        else:
            if result.ok and result.stdout.strip() == token:
                pod.probe = CheckState.OK
                pod.probe_evidence = f"wrote and read back a file in {wiring.mount_path}"
            else:
                detail = " ".join((result.stderr or result.stdout).split())[:200] or "no output"
                pod.probe = CheckState.FAIL
                pod.probe_evidence = (
                    f"probe write/read in {wiring.mount_path} failed (exit {result.rc}): {detail}"
                )
        try:
            log = podlogs.read_log(
                self.ctx.kube,
                pod.namespace,
                pod.name,
                pod.container,
                tail_lines=None,
                limit_bytes=START_LOG_BYTES,  # start-up messages come first
                timeout=20.0,
            )
        except HpkvError as exc:
            pod.log_state, pod.log_evidence = CheckState.UNKNOWN, f"logs not read: {exc.message}"
            return
        if log is None:
            pod.log_state, pod.log_evidence = CheckState.OK, "no log to scan yet"
            return
        degraded = DEGRADED_PATTERN.search(log)
        if degraded:
            line = next((ln for ln in log.splitlines() if DEGRADED_PATTERN.search(ln)), "")
            pod.log_state = CheckState.FAIL
            pod.log_evidence = f"LMCache started in degraded mode: {' '.join(line.split())[:200]}"
        elif SEED_WARNING_PATTERN.search(log):
            pod.log_state = CheckState.WARN
            pod.log_evidence = "LMCache logged that PYTHONHASHSEED is not set"
        else:
            pod.log_state, pod.log_evidence = CheckState.OK, "no LMCache degraded mode in the log"

    # --- plan ----------------------------------------------------------------------------------
    def plan(
        self,
        *,
        endpoints: Sequence[str] | None = None,
        mode: str | None = None,
        restart: str | None = None,
        install_kyverno: bool = False,
        **_: Any,
    ) -> Plan:
        mode = self._mode(mode)
        restart = self._restart_choice(restart)
        plan = Plan(stage=self.name)
        self.require_endpoint_api()
        refs = self._planned = self.endpoints(endpoints)
        if not refs:
            plan.notes.append("no InferenceEndpointConfigs found: nothing to wire yet")
            return plan
        wiring = self.wiring()
        for ref in refs:
            self._require_pvc(ref, wiring)
        if mode == "patch":
            for ref in refs:
                plan.add(self._plan_patch(ref, wiring, revert=False))
            plan.notes.append(
                "--mode patch is undone by the operator's next re-render (endpoint edit, operator "
                "upgrade, deleted Deployment); --mode policy is not"
            )
            return plan
        mechanism = self._plan_mechanism(plan, install_kyverno)
        failure_policy = self.config()["failurePolicy"]
        for ref in refs:
            if mechanism == "admission-policy":
                desired = [
                    policy_manifest(ref, wiring, failure_policy),
                    binding_manifest(ref, wiring),
                ]
                other = (KYVERNO_API, KYVERNO_KIND)
            else:
                desired = [kyverno_manifest(ref, wiring, failure_policy)]
                other = (ADMISSION_API, BINDING_KIND)
            for obj in desired:
                plan.add(self._plan_object(obj, ref))
            state = self.patch_state(ref)
            if state is not None:  # scaled back up once the policy wires the new pods
                plan.add(self._plan_restore(ref, state, expect=wiring.fingerprint(ref)))
            for api_version, kind in [other] + (
                [(ADMISSION_API, POLICY_KIND)] if mechanism == "kyverno" else []
            ):
                if self._read_optional(api_version, kind, object_name(ref)) is not None:
                    plan.add(
                        self._plan_delete(api_version, kind, ref, "replaced by the " + mechanism)
                    )
            plan.add(self._plan_restart(ref, wiring, restart, expect=wiring.fingerprint(ref)))
            if self._template_patched(ref, wiring):
                plan.notes.append(
                    f"Deployment {ref} also carries a --mode patch (harmless with the policy); "
                    f"'hpkv l2 remove --mode patch --endpoint {ref}' reverts it"
                )
        return plan

    def _require_pvc(self, ref: EndpointRef, wiring: Wiring) -> None:
        """Refuse to wire pods to a PVC that does not exist or cannot bind (they would not start)."""
        pvc = self.pvc(ref.namespace, wiring.pvc_name)
        fix = "run 'hpkv curvine apply' first (it creates the Curvine PVC in endpoint namespaces)"
        if pvc is None:
            raise PlanDeferred(
                "curvine",
                f"PersistentVolumeClaim {ref.namespace}/{wiring.pvc_name} does not exist; pods "
                "wired to it would not start",
                fix=fix,
            )
        phase = (pvc.get("status") or {}).get("phase")
        if phase != "Bound":
            raise PreconditionFailed(
                f"PersistentVolumeClaim {ref.namespace}/{wiring.pvc_name} is {phase or 'Pending'}, "
                "not Bound; pods wired to it would not start",
                fix=f"see 'kubectl -n {ref.namespace} describe pvc {wiring.pvc_name}' and "
                "'hpkv curvine status'",
            )
        if "ReadWriteMany" not in ((pvc.get("spec") or {}).get("accessModes") or []):
            raise PreconditionFailed(
                f"PersistentVolumeClaim {ref.namespace}/{wiring.pvc_name} is not ReadWriteMany; "
                "replicas on several nodes cannot share it",
                fix=fix,
            )

    def _plan_mechanism(self, plan: Plan, install_kyverno: bool) -> str:
        mechanism = self.available_mechanism()
        if mechanism:
            return mechanism
        preference = self.config()["mechanism"]
        install_kyverno = install_kyverno or bool(self.config()["installKyverno"])
        if install_kyverno and preference != "admission-policy":
            plan.add(self._plan_kyverno_install())
            return "kyverno"
        served = f"{POLICY_KIND} ({ADMISSION_API})"
        if preference == "admission-policy":
            cause = f"l2.mechanism is admission-policy but the cluster does not serve {served}"
        elif preference == "kyverno":
            cause = "l2.mechanism is kyverno but Kyverno is not installed"
        else:
            cause = f"the cluster serves neither {served} nor Kyverno's {KYVERNO_KIND}"
        raise PreconditionFailed(
            f"{cause}, so pods cannot be wired at admission",
            fix="rerun with --install-kyverno or set l2.installKyverno: true (for 'hpkv up'; "
            "installs the kyverno/kyverno Helm chart), or use --mode patch (undone by the "
            "operator's next re-render)",
        )

    def _plan_kyverno_install(self) -> Action:
        settings = self.config()["kyverno"]
        namespace = settings["namespace"]
        summary = (
            f"install Helm chart {settings['chart']} {settings['chartVersion']} from "
            f"{settings['repo'] or 'a local path'} (the Kyverno admission controller)"
        )
        return Action(
            f"helm release {namespace}/{KYVERNO_RELEASE}",
            Verb.CREATE,
            summary,
            None,
            {"chart": settings["chart"], "version": settings["chartVersion"]},
            run=lambda: self._install_kyverno(settings),
        )

    def _install_kyverno(self, settings: dict[str, Any]) -> None:
        helm = self.ctx.helm
        chart = helm.chart(
            settings["chart"], repo=settings["repo"] or None, version=settings["chartVersion"]
        )
        with self.ctx.reporter.waiting("installing Kyverno"):
            helm.ensure(
                KYVERNO_RELEASE,
                chart,
                {},
                namespace=settings["namespace"],
                wait=True,
                timeout=self.ctx.options.timeout,
            )
        self._served.clear()

        def served() -> tuple[bool, str]:
            self._served.clear()
            return self.serves(KYVERNO_API, KYVERNO_KIND), f"{KYVERNO_KIND} not served yet"

        self._wait_for(f"Kyverno's {KYVERNO_KIND} API", served)

    def _plan_object(self, obj: dict[str, Any], ref: EndpointRef) -> Action:
        from hpkv.kube import objects

        kind = obj["kind"]
        summary = f"wire the pods of {ref} at admission"
        if not self.serves(obj["apiVersion"], kind):  # its CRD arrives with an earlier action
            return Action(
                objects.describe(obj),
                Verb.CREATE,
                summary,
                None,
                objects.comparable(obj),
                run=lambda: objects.apply(self.ctx.kube, obj),
            )
        return objects.plan_apply(self.ctx.kube, obj, summary=summary)

    def _plan_delete(self, api_version: str, kind: str, ref: EndpointRef, why: str) -> Action:
        from hpkv.kube import objects

        return objects.plan_delete(
            self.ctx.kube, api_version, kind, object_name(ref), summary=f"delete ({why})"
        )

    # --- restarts ------------------------------------------------------------------------------
    def _plan_restart(
        self, ref: EndpointRef, wiring: Wiring, restart: str, *, expect: str | None
    ) -> Action:
        pods = [inspect_pod(p, ref.name, wiring) for p in self.pods(ref)]
        stale = [p.name for p in pods if p.fingerprint != expect]
        target = f"pods {ref.namespace}/app={ref.name}"
        wanted = "the current wiring" if expect else "no L2 wiring"
        if not stale:
            return Action(target, Verb.NONE, f"{len(pods)} pod(s) carry {wanted}")
        if restart == "none":
            return Action(
                target,
                Verb.NONE,
                f"{len(stale)} stale pod(s) left running (--restart none); they change when "
                "next re-created",
            )
        deployment = self.deployment(ref)
        if deployment is None:
            return Action(
                target,
                Verb.NONE,
                f"{len(stale)} stale pod(s) but no Deployment {ref} to re-create them; delete "
                "them once the operator has rendered it",
            )
        strategy, why = (restart, "requested") if restart != "auto" else self._choose(deployment)
        return Action(
            target,
            Verb.UPDATE,
            f"re-create {len(stale)} stale pod(s) with {wanted}: {strategy} ({why})",
            before={"stale pods": stale},
            after={"pods carry": expect or "no wiring"},
            run=lambda: self._restart(ref, wiring, strategy, expect=expect),
        )

    def _choose(self, deployment: dict[str, Any]) -> tuple[str, str]:
        from hpkv.kube import kube_errors

        with kube_errors("list nodes and pods to count free GPUs"):
            nodes = [self._plain(n) for n in self.ctx.kube.core.list_node().items]
            pods = [
                self._plain(p)
                for p in self.ctx.kube.core.list_pod_for_all_namespaces(
                    field_selector="status.phase!=Succeeded,status.phase!=Failed"
                ).items
            ]
        return choose_restart(deployment, nodes, pods)

    def _restart(
        self, ref: EndpointRef, wiring: Wiring, strategy: str, *, expect: str | None
    ) -> None:
        self._wait_admission(ref, expect)
        if strategy == "pod-by-pod":
            self._recreate_pod_by_pod(ref, wiring, expect)
            return
        self._rollout_restart(ref)
        if self.ctx.options.wait is not False:
            self._wait_pods(ref, wiring, expect)

    def _dry_run_pod(self, ref: EndpointRef) -> dict[str, Any] | None:
        """A pod from the Deployment's template as admission would create it (server dry run)."""
        from hpkv.kube import kube_errors

        deployment = self.deployment(ref)
        if deployment is None:
            return None
        template = deployment["spec"]["template"]
        meta = template.get("metadata") or {}
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{ref.name}-hpkv-dry-run-",
                "namespace": ref.namespace,
                "labels": meta.get("labels") or {"app": ref.name},
                "annotations": meta.get("annotations") or {},
            },
            "spec": template["spec"],
        }
        with kube_errors(f"dry-run a pod of {ref} through admission"):
            created = self.ctx.kube.core.create_namespaced_pod(ref.namespace, body, dry_run="All")
        return self._plain(created)

    def _wait_admission(self, ref: EndpointRef, expect: str | None) -> None:
        """Wait until new pods are admitted with (or without) the wiring: policies load async."""

        def effective() -> tuple[bool, str]:
            pod = self._dry_run_pod(ref)
            if pod is None:
                return True, ""
            found = (pod["metadata"].get("annotations") or {}).get(WIRING_ANNOTATION)
            return found == expect, f"a dry-run pod got wiring {found or 'none'}"

        what = "the admission policy to take effect" if expect else "the wiring to be gone"
        try:
            self._wait_for(what, effective, timeout=min(120.0, self.ctx.options.timeout))
        except WaitTimeout as exc:
            raise PreconditionFailed(
                f"new pods of {ref} are still admitted without the expected wiring ({exc.message})",
                fix=f"check that the {POLICY_KIND} admission plugin is enabled on the API server "
                "(or that Kyverno runs); nothing was restarted",
            ) from None

    def _rollout_restart(self, ref: EndpointRef) -> None:
        from hpkv.kube import objects

        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        objects.apply(
            self.ctx.kube,
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": ref.name, "namespace": ref.namespace},
                "spec": {"template": {"metadata": {"annotations": {RESTARTED_AT_ANNOTATION: now}}}},
            },
        )

    def _pod_counts(
        self, ref: EndpointRef, wiring: Wiring, expect: str | None
    ) -> tuple[list[str], int]:
        """(stale pod names, Ready pods carrying ``expect``)."""
        pods = [inspect_pod(p, ref.name, wiring) for p in self.pods(ref)]
        stale = [p.name for p in pods if p.fingerprint != expect]
        fresh_ready = sum(1 for p in pods if p.fingerprint == expect and p.ready)
        return stale, fresh_ready

    def _replicas(self, ref: EndpointRef) -> int:
        deployment = self.deployment(ref)
        replicas = (deployment or {}).get("spec", {}).get("replicas")
        return int(replicas if replicas is not None else 1)

    def _wait_pods(self, ref: EndpointRef, wiring: Wiring, expect: str | None) -> None:
        def done() -> tuple[bool, str]:
            stale, fresh = self._pod_counts(ref, wiring, expect)
            replicas = self._replicas(ref)
            return (
                not stale and fresh >= replicas,
                f"{fresh}/{replicas} Ready with the new wiring, {len(stale)} stale",
            )

        self._wait_for(f"the pods of {ref} to be re-created", done)

    def _recreate_pod_by_pod(self, ref: EndpointRef, wiring: Wiring, expect: str | None) -> None:
        stale, _ = self._pod_counts(ref, wiring, expect)
        for i, name in enumerate(stale, 1):
            _, before = self._pod_counts(ref, wiring, expect)
            self.ctx.reporter.step(f"re-creating pod {ref.namespace}/{name} ({i}/{len(stale)})")
            if not self._evict(ref.namespace, name):
                continue

            def replaced(name: str = name, before: int = before) -> tuple[bool, str]:
                stale_now, fresh = self._pod_counts(ref, wiring, expect)
                return (
                    name not in stale_now and fresh >= before + 1,
                    f"{fresh} Ready pod(s) with the new wiring, waiting for {before + 1}",
                )

            self._wait_for(f"a Ready replacement for {name}", replaced)

    def _evict(self, namespace: str, name: str) -> bool:
        """Evict a pod (honouring PodDisruptionBudgets); False when it is already gone."""
        from kubernetes import client

        from hpkv.kube import is_status, kube_errors

        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
        evicted = False

        def attempt() -> tuple[bool, str]:
            nonlocal evicted
            with kube_errors(f"evict pod {namespace}/{name}"):
                try:
                    self.ctx.kube.core.create_namespaced_pod_eviction(name, namespace, body)
                except Exception as exc:
                    if is_status(exc, 404):
                        return True, ""
                    if is_status(exc, 429):
                        return False, "a PodDisruptionBudget allows no disruption now"
                    raise
            evicted = True
            return True, ""

        self._wait_for(f"the eviction of {namespace}/{name}", attempt)
        return evicted

    def _wait_for(
        self,
        what: str,
        probe: Callable[[], tuple[bool, str]],
        *,
        timeout: float | None = None,
    ) -> None:
        limit = self.ctx.options.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        with self.ctx.reporter.waiting(f"waiting for {what}"):
            while True:
                done, detail = probe()
                if done:
                    return
                if time.monotonic() >= deadline:
                    raise WaitTimeout(
                        f"{what}: not done within {int(limit)}s ({detail})",
                        fix="check the pods' events ('kubectl describe pod'), then rerun; a "
                        "rerun continues where this one stopped",
                    )
                time.sleep(poll_interval(2.0))

    # --- mode patch ----------------------------------------------------------------------------
    def _operator(self) -> dict[str, Any] | None:
        return self._read_deployment(topology.OPERATOR_NAMESPACE, topology.OPERATOR_DEPLOYMENT)

    def _plan_patch(
        self, ref: EndpointRef, wiring: Wiring, *, revert: bool, policy_stays: bool = False
    ) -> Action:
        """``--mode patch`` (or its revert) for one endpoint; ``policy_stays``: an admission
        policy keeps wiring the pods re-created by a revert."""
        deployment = self.deployment(ref)
        target = f"Deployment/{ref.namespace}/{ref.name}"
        state = self.patch_state(ref)
        if deployment is None:
            if revert:
                return Action(target, Verb.NONE, "no Deployment: nothing to revert")
            raise PreconditionFailed(
                f"Deployment {ref} does not exist: the operator has not rendered the endpoint",
                fix="wait until the endpoint's pods exist ('kubectl get deploy -n "
                f"{ref.namespace} {ref.name}'), then rerun",
            )
        template = deployment["spec"]["template"]
        as_pod = {"metadata": template.get("metadata") or {}, "spec": template["spec"]}
        live = inspect_pod(as_pod, ref.name, wiring)
        done = (
            not live.wired(wiring)
            if revert
            else (live.fingerprint == wiring.fingerprint(ref) and len(live.remote_urls) == 1)
        )
        if done and state is None:
            what = "carries no patch" if revert else "already carries the patch"
            return Action(target, Verb.NONE, f"the Deployment {what}")
        operator = self._operator()
        n = (state or {}).get("operatorReplicas") or (
            str(operator["spec"].get("replicas", 1)) if operator else None
        )
        m = (state or {}).get("modelReplicas") or str(deployment["spec"].get("replicas", 1))
        pause = f"pause the operator ({n} -> 0), " if n is not None else ""
        verb = "revert the JSON patch" if revert else "one JSON patch (env, volume, mount)"
        restore = f", restore the operator to {n}" if n is not None else ""
        summary = f"{pause}scale {ref} {m} -> 0, {verb}, scale back to {m}, wait Ready{restore}"
        if done:
            summary = f"finish an interrupted run: scale {ref} to {m}{restore}"
        container = template["spec"]["containers"][
            vllm_container_index(template["spec"]["containers"], ref.name)
        ]
        ops = patch_operations(deployment, wiring, ref, revert=revert)
        expect = wiring.fingerprint(ref) if not revert or policy_stays else None
        return Action(
            target,
            Verb.UPDATE,
            summary,
            before={
                "env": container.get("env") or [],
                "volumeMounts": container.get("volumeMounts") or [],
            },
            after={
                "env": _op_value(ops, "/env"),
                "volumeMounts": _op_value(ops, "/volumeMounts"),
            },
            run=lambda: self._patch_procedure(
                ref, wiring, revert=revert, patch=not done, expect=expect
            ),
        )

    def _scale(self, namespace: str, name: str, replicas: int) -> None:
        from hpkv.kube import kube_errors

        with kube_errors(f"scale Deployment {namespace}/{name} to {replicas}"):
            self.ctx.kube.apps.patch_namespaced_deployment_scale(
                name, namespace, {"spec": {"replicas": replicas}}, field_manager="hpkv"
            )

    def _json_patch(self, ref: EndpointRef, ops: list[dict[str, Any]], *, dry_run: bool) -> None:
        from hpkv.kube import kube_errors

        with kube_errors(f"{'dry-run ' if dry_run else ''}JSON-patch Deployment {ref}"):
            self.ctx.kube.apps.patch_namespaced_deployment(
                ref.name,
                ref.namespace,
                ops,
                dry_run="All" if dry_run else None,
                field_manager="hpkv",
                _content_type="application/json-patch+json",
            )

    def _save_state(self, ref: EndpointRef, data: dict[str, str]) -> None:
        from hpkv.kube import objects

        objects.apply(
            self.ctx.kube,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": self._state_name(ref),
                    "namespace": ref.namespace,
                    "labels": dict(MANAGED_LABELS),
                    "annotations": {ENDPOINT_ANNOTATION: str(ref)},
                },
                "data": data,
            },
        )

    def _wait_operator_stopped(self, operator: dict[str, Any]) -> None:
        from hpkv.kube import kube_errors

        labels = (operator["spec"].get("selector") or {}).get("matchLabels") or {}
        selector = ",".join(f"{k}={v}" for k, v in labels.items())

        def stopped() -> tuple[bool, str]:
            with kube_errors("list the operator's pods"):
                pods = self.ctx.kube.core.list_namespaced_pod(
                    topology.OPERATOR_NAMESPACE, label_selector=selector
                ).items
            return not pods, f"{len(pods)} operator pod(s) still running"

        if selector:
            self._wait_for("the operator to stop", stopped)

    def _patch_procedure(
        self, ref: EndpointRef, wiring: Wiring, *, revert: bool, patch: bool, expect: str | None
    ) -> None:
        """The published procedure, restoring the operator (and the model) whatever happens."""
        state = self.patch_state(ref) or {}
        deployment = self.deployment(ref)
        if deployment is None:
            raise PreconditionFailed(f"Deployment {ref} disappeared", fix="rerun when it exists")
        operator = self._operator()
        if "operatorReplicas" in state:
            operator_replicas: int | None = int(state["operatorReplicas"])
        else:
            operator_replicas = int(operator["spec"].get("replicas", 1)) if operator else None
        model_replicas = int(state.get("modelReplicas") or deployment["spec"].get("replicas", 1))
        if patch:  # let the API server judge the patch before anything is paused
            self._json_patch(
                ref, patch_operations(deployment, wiring, ref, revert=revert), dry_run=True
            )
        record = {"modelReplicas": str(model_replicas)}
        if operator_replicas is not None:
            record["operatorReplicas"] = str(operator_replicas)
        self._save_state(ref, record)
        failure: BaseException | None = None
        with _termination_interrupts():
            try:
                if patch:
                    if operator is not None:
                        self.ctx.reporter.step("pausing the operator (0 replicas)")
                        self._scale(topology.OPERATOR_NAMESPACE, topology.OPERATOR_DEPLOYMENT, 0)
                        self._wait_operator_stopped(operator)
                    self.ctx.reporter.step(f"scaling {ref} to 0")
                    self._scale(ref.namespace, ref.name, 0)
                    current = self.deployment(ref) or deployment
                    self.ctx.reporter.step(
                        f"{'reverting' if revert else 'applying'} the JSON patch"
                    )
                    self._json_patch(
                        ref, patch_operations(current, wiring, ref, revert=revert), dry_run=False
                    )
                    self._wait_admission(ref, expect)  # a just-deleted policy may still act
                self.ctx.reporter.step(f"scaling {ref} back to {model_replicas}")
                self._scale(ref.namespace, ref.name, model_replicas)
                if self.ctx.options.wait is not False and model_replicas > 0:
                    self._wait_pods(ref, wiring, expect)
            except BaseException as exc:
                failure = exc
                raise
            finally:
                self._restore(ref, operator_replicas, model_replicas, failure)

    def _restore(
        self,
        ref: EndpointRef,
        operator_replicas: int | None,
        model_replicas: int,
        failure: BaseException | None,
    ) -> None:
        """Put the model's and the operator's replica counts back; drop the state when done."""
        problems: list[str] = []

        def later() -> None:
            self.ctx.reporter.warn("restoring the operator first; hpkv stops right after")

        with _interrupts_deferred(later):
            targets = [(ref.namespace, ref.name, model_replicas)]
            if operator_replicas is not None:
                targets.append(
                    (topology.OPERATOR_NAMESPACE, topology.OPERATOR_DEPLOYMENT, operator_replicas)
                )
            for namespace, name, replicas in targets:
                try:
                    live = self._read_deployment(namespace, name)
                    if live is not None and live["spec"].get("replicas") != replicas:
                        self.ctx.reporter.step(
                            f"restoring {namespace}/{name} to {replicas} replica(s)"
                        )
                        self._scale(namespace, name, replicas)
                except HpkvError as exc:
                    problems.append(
                        f"'kubectl -n {namespace} scale deployment {name} --replicas={replicas}' "
                        f"({exc.message})"
                    )
            if not problems:
                from hpkv.kube import objects

                try:
                    objects.delete(
                        self.ctx.kube, "v1", "ConfigMap", self._state_name(ref), ref.namespace
                    )
                except HpkvError as exc:
                    problems.append(f"delete ConfigMap {self._state_name(ref)} ({exc.message})")
        if problems:
            cause = f" after: {failure}" if failure is not None else ""
            raise ApiError(
                f"could not restore replica counts{cause}",
                fix="run "
                + "; ".join(problems)
                + f", or rerun 'hpkv l2 apply --mode patch --endpoint {ref}'",
            ) from failure

    def _plan_restore(
        self, ref: EndpointRef, state: dict[str, str], *, expect: str | None
    ) -> Action:
        """An interrupted ``--mode patch`` run left the operator paused: put it back."""
        n = state.get("operatorReplicas")
        m = state.get("modelReplicas", "1")

        def run() -> None:
            try:  # pods created by the scale-up should get the wiring planned with it
                self._wait_admission(ref, expect)
            except HpkvError as exc:
                self.ctx.reporter.warn(f"restoring anyway: {exc.message}")
            self._restore(ref, int(n) if n is not None else None, int(m), None)

        return Action(
            f"ConfigMap/{ref.namespace}/{self._state_name(ref)}",
            Verb.UPDATE,
            f"an interrupted --mode patch run left state: restore {ref} to {m} and the operator "
            f"to {n} replica(s)",
            before=state,
            after=None,
            run=run,
        )

    # --- apply / remove ------------------------------------------------------------------------
    def apply(self, plan: Plan) -> ApplyResult:
        result = self.run_plan(plan)
        if self.ctx.options.wait is False and result.performed:
            result.notes.append("not waiting (--no-wait); check with 'hpkv l2 status'")
        result.checks = self._verify(self._planned, performed=bool(result.performed))
        return result

    def _verify(self, refs: Sequence[EndpointRef], *, performed: bool) -> list[Check]:
        checks: list[Check] = []
        for ref in refs:
            report = self.report(ref)
            checks += report.checks
            if performed and report.mechanism in ("admission-policy", "kyverno"):
                checks.append(self._admission_probe_check(ref))
        return checks

    def _admission_probe_check(self, ref: EndpointRef) -> Check:
        """Does the API server wire a new pod? (a server-side dry run: nothing is created)"""
        name = f"admission {ref}"
        wiring = self.wiring()
        pod = self._dry_run_pod(ref)
        if pod is None:
            return self.check(name, CheckState.OK, "no Deployment yet: pods are wired when created")
        wired = inspect_pod(pod, ref.name, wiring)
        problems = pod_findings(wired, wiring, ref, mechanism_present=True)
        bad = [f for f in problems if f.state is not CheckState.OK]
        if not bad:
            return self.check(
                name, CheckState.OK, "a dry-run pod from the Deployment's template is wired"
            )
        return self.check(
            name,
            CheckState.FAIL,
            "a dry-run pod from the Deployment's template is not wired: "
            + "; ".join(f.evidence for f in bad),
            f"check that the {POLICY_KIND} admission plugin (or Kyverno) is enabled",
        )

    def plan_remove(
        self,
        *,
        endpoints: Sequence[str] | None = None,
        mode: str | None = None,
        restart: str | None = None,
        delete_data: bool = False,
        **_: Any,
    ) -> Plan:
        """Delete the policies and/or revert the patch, then re-create the wired pods."""
        from hpkv.kube import objects

        if mode is not None:
            self._mode(mode)
        restart = self._restart_choice(restart)
        self._remove_mode = mode
        plan = Plan(stage=self.name)
        refs = self._planned = self.endpoints(endpoints)
        wiring = self.wiring()
        for ref in refs:
            state = self.patch_state(ref)
            objs = self.policy_objects(ref)
            stays = mode == "patch" and any(o is not None for o in objs.values())
            revert = (
                self._plan_patch(ref, wiring, revert=True, policy_stays=stays)
                if mode in (None, "patch")
                else None
            )
            keeps_patch = mode == "policy" and self._template_patched(ref, wiring)
            if mode in (None, "policy"):
                for kind, api_version in (
                    (BINDING_KIND, ADMISSION_API),
                    (POLICY_KIND, ADMISSION_API),
                    (KYVERNO_KIND, KYVERNO_API),
                ):
                    if objs[kind] is not None:
                        plan.add(self._plan_delete(api_version, kind, ref, "stop wiring new pods"))
            expect = wiring.fingerprint(ref) if keeps_patch or stays else None
            if revert is not None and revert.changes:
                plan.add(revert)  # it also finishes an interrupted run
                continue
            if state is not None:
                plan.add(self._plan_restore(ref, state, expect=expect))
            plan.add(self._plan_restart(ref, wiring, restart, expect=expect))
        if not endpoints and mode in (None, "policy"):
            for api_version, kind, name in self.orphaned_policies(refs):
                plan.add(
                    objects.plan_delete(
                        self.ctx.kube,
                        api_version,
                        kind,
                        name,
                        summary="delete (its endpoint no longer exists)",
                    )
                )
        if not delete_data:
            plan.kept.append(
                f"the cached KV data under {wiring.mount_path} on the Curvine PVC (stage curvine "
                "keeps it too unless --delete-data)"
            )
        return plan

    def _template_patched(self, ref: EndpointRef, wiring: Wiring) -> bool:
        deployment = self.deployment(ref)
        if deployment is None:
            return False
        template = deployment["spec"]["template"]
        as_pod = {"metadata": template.get("metadata") or {}, "spec": template["spec"]}
        return inspect_pod(as_pod, ref.name, wiring).wired(wiring)

    def remove(self, plan: Plan) -> ApplyResult:
        result = self.run_plan(plan)
        result.checks = [self._removed_check(ref) for ref in self._planned]
        return result

    def _removed_check(self, ref: EndpointRef) -> Check:
        """Confirm the removal: nothing wired any more (or just the part that was removed)."""
        wiring = self.wiring()
        name = f"l2 {ref}"
        patched = self._template_patched(ref, wiring)
        policy = any(o is not None for o in self.policy_objects(ref).values())
        pods = [inspect_pod(p, ref.name, wiring) for p in self.pods(ref)]
        wired = [p.name for p in pods if p.wired(wiring)]
        if self._remove_mode == "patch" and not patched:
            kept = "; the admission policy keeps wiring the pods" if policy else ""
            return self.check(name, CheckState.OK, f"the Deployment carries no --mode patch{kept}")
        if self._remove_mode == "policy" and not policy and patched:
            return self.check(
                name, CheckState.OK, "the policy is gone; the Deployment still carries --mode patch"
            )
        if not (wired or patched or policy):
            return self.check(
                name, CheckState.OK, "no pod is wired to the L2: the operator's rendering is back"
            )
        left = [
            what
            for what, present in (("the policy", policy), ("the --mode patch", patched))
            if present
        ]
        return self.check(
            name,
            CheckState.WARN,
            f"still wired: {', '.join(left) or 'no policy or patch'}; wired pods: "
            f"{', '.join(wired[:10]) or 'none'}",
            f"rerun 'hpkv l2 remove --endpoint {ref}'",
        )

    # --- runbook: deferral, leftovers and the offline plan --------------------------------------
    def require_endpoint_api(self) -> None:
        """The wiring targets the pods of InferenceEndpointConfigs, an API the operator installs."""
        if not topology.endpoint_api_served(self.ctx.kube):
            raise PlanDeferred(
                "operator",
                "it wires the pods of InferenceEndpointConfigs, and that API (the operator's CRD) "
                "is not served yet",
            )

    def orphaned_policies(self, refs: Sequence[EndpointRef]) -> list[tuple[str, str, str]]:
        """(apiVersion, kind, name) of hpkv's policy objects whose endpoint no longer exists."""
        from hpkv.kube import kube_errors

        current = {str(ref) for ref in refs}
        selector = ",".join(f"{k}={v}" for k, v in MANAGED_LABELS.items())
        found = []
        for api_version, kind in (
            (ADMISSION_API, BINDING_KIND),
            (ADMISSION_API, POLICY_KIND),
            (KYVERNO_API, KYVERNO_KIND),
        ):
            if not self.serves(api_version, kind):
                continue
            with kube_errors(f"list {kind} objects"):
                items = self.ctx.kube.resource(api_version, kind).get(label_selector=selector)
            for item in items.items:
                meta = item.to_dict()["metadata"]
                owner = (meta.get("annotations") or {}).get(ENDPOINT_ANNOTATION)
                if owner not in current:
                    found.append((api_version, kind, meta["name"]))
        return found

    def plan_offline(self, profile: ClusterProfile) -> Plan:
        """The wiring of the profile's endpoints after stages 2 and 3, with the mechanism the
        profile's Kubernetes version allows (no API call)."""
        from hpkv.kube.objects import comparable, describe

        plan = Plan(stage=self.name)
        refs = [EndpointRef(ns, name) for ns, name, _replicas in profile.endpoint_refs()]
        if not refs:
            plan.notes.append("no inference endpoint in the profile: nothing to wire")
            return plan
        config = self.config()
        mechanism = self._offline_mechanism(plan, profile)
        wiring = self.wiring()
        replicas = {(ns, name): n for ns, name, n in profile.endpoint_refs()}
        for ref in refs:
            if mechanism == "admission-policy":
                desired = [
                    policy_manifest(ref, wiring, config["failurePolicy"]),
                    binding_manifest(ref, wiring),
                ]
            else:
                desired = [kyverno_manifest(ref, wiring, config["failurePolicy"])]
            for obj in desired:
                summary = f"wire the pods of {ref} at admission"
                plan.add(Action(describe(obj), Verb.CREATE, summary, None, comparable(obj)))
            count = replicas[(ref.namespace, ref.name)]
            plan.add(
                Action(
                    f"pods {ref.namespace}/app={ref.name}",
                    Verb.UPDATE,
                    f"re-create {count} pod(s) with the current wiring (a rolling restart when a "
                    "surge pod fits, else pod by pod)",
                    after={"pods carry": wiring.fingerprint(ref)},
                )
            )
        return plan

    def _offline_mechanism(self, plan: Plan, profile: ClusterProfile) -> str:
        config = self.config()
        version = tuple(int(p) for p in str(profile.eks_version).split(".")[:2])
        admission = version >= (1, 36)  # MutatingAdmissionPolicy v1 is served from 1.36
        kyverno = any(r.get("name") == KYVERNO_RELEASE for r in profile.helm_releases)
        mechanism = choose_mechanism(
            admission_policy=admission, kyverno=kyverno, preference=config["mechanism"]
        )
        if mechanism:
            return mechanism
        if config["mechanism"] == "admission-policy":
            raise PreconditionFailed(
                f"l2.mechanism is admission-policy, but Kubernetes {profile.eks_version} serves "
                f"no {POLICY_KIND} ({ADMISSION_API}, Kubernetes 1.36+)",
                fix="set l2.mechanism to auto or kyverno",
            )
        install = self._plan_kyverno_install()
        if not config["installKyverno"]:
            install = Action(
                install.target,
                Verb.NONE,
                f"NEEDED: Kubernetes {profile.eks_version} serves no {POLICY_KIND} (1.36+) and "
                "Kyverno is not installed; set l2.installKyverno: true so 'hpkv up' installs it "
                "(without it 'hpkv up' stops at this stage)",
            )
        install.run = None
        plan.add(install)
        return "kyverno"
