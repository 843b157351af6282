"""Stage 1: HyperPod Tiered Storage (the L1 CPU-memory tier), via SageMaker UpdateCluster.

Sharp edge handled here: UpdateCluster with ``TieredStorageConfig`` alone is rejected with a
ValidationException; at least one of ``NodeRecovery`` or ``InstanceGroups`` must be sent too. hpkv
reads the cluster's current ``NodeRecovery`` and sends it back unchanged (no side effect). It never
changes NodeRecovery and never sends InstanceGroups.

When enabled, HyperPod runs the ``ai-toolkit`` DaemonSet in ``aws-hyperpod`` on every node; LMCache
reaches it at ``sagemaker-hyperpod://<node-ip>:9200``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from hpkv import reads
from hpkv.aws import sagemaker
from hpkv.concurrency import fan_out
from hpkv.context import poll_interval
from hpkv.errors import HpkvError, PreconditionFailed, UsageError, WaitTimeout
from hpkv.stages.base import (
    Action,
    ApplyResult,
    Check,
    CheckSpec,
    CheckState,
    Detector,
    Finding,
    IamNeed,
    Plan,
    Severity,
    Stage,
    Verb,
)

if TYPE_CHECKING:
    from hpkv.runbook.profile import ClusterProfile

MIN_PERCENT = 20
MAX_PERCENT = 100
DEFAULT_PERCENT = 20
DAEMONSET_NAMESPACE = "aws-hyperpod"
DAEMONSET_NAME = "ai-toolkit"
HYPERPOD_NODE_LABEL = "sagemaker.amazonaws.com/compute-type"
HYPERPOD_NODE_VALUE = "hyperpod"

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "memoryPercent": {
            "type": "integer",
            "minimum": MIN_PERCENT,
            "maximum": MAX_PERCENT,
            "description": f"an integer percentage of instance memory, {MIN_PERCENT}..{MAX_PERCENT}",
        },
    },
}
CONFIG_DEFAULTS: dict[str, Any] = {"memoryPercent": DEFAULT_PERCENT}

CLUSTER_ARN = "{cluster_arn}"
IAM_ACTIONS: list[IamNeed] = [
    IamNeed("sagemaker:DescribeCluster", CLUSTER_ARN, "read TieredStorageConfig and NodeRecovery"),
    IamNeed("sagemaker:UpdateCluster", CLUSTER_ARN, "enable or disable Tiered Storage"),
]


def validate_percent(value: int) -> int:
    if not MIN_PERCENT <= value <= MAX_PERCENT:
        raise UsageError(
            f"--memory-percent {value} is outside the valid range {MIN_PERCENT}..{MAX_PERCENT}",
            fix=f"pass an integer from {MIN_PERCENT} to {MAX_PERCENT} (start at {DEFAULT_PERCENT})",
        )
    return value


def desired_config(percent: int) -> dict[str, Any]:
    return {"Mode": "Enable", "InstanceMemoryAllocationPercentage": percent}


def current_config(cluster: dict[str, Any]) -> dict[str, Any]:
    config = cluster.get("TieredStorageConfig") or {}
    return {k: v for k, v in config.items() if v is not None}


def is_enabled(config: dict[str, Any]) -> bool:
    return str(config.get("Mode", "")).lower() == "enable"


class TieredStorageStage(Stage):
    name = "tiered-storage"
    title = "Tiered Storage (L1 CPU memory tier)"
    number = 1

    # --- reads -------------------------------------------------------------------------------
    def _cluster(self) -> dict[str, Any]:
        return reads.hyperpod_cluster(self.ctx)

    def configured_percent(self) -> int:
        return int(self.ctx.settings.section("tieredStorage").get("memoryPercent", DEFAULT_PERCENT))

    def status(self) -> list[Check]:
        return self.run_check_functions()

    def check_functions(self) -> list[CheckSpec]:
        # All run when tiered storage is off too: they say so, or verify that nothing is left.
        return [
            CheckSpec("cluster", lambda: [self._cluster_check(self._cluster())], False),
            CheckSpec(
                "tiered-storage",
                lambda: [self._config_check(current_config(self._cluster()))],
                False,
            ),
            CheckSpec("node-recovery", lambda: [self._node_recovery_check(self._cluster())], False),
            CheckSpec("ai-toolkit-daemonset", self._daemonset_checks, False),
        ]

    def installed(self) -> bool | None:
        return is_enabled(current_config(self._cluster()))

    def namespaces(self) -> list[str]:
        return [DAEMONSET_NAMESPACE]

    def _daemonset_checks(self) -> list[Check]:
        # DescribeCluster (is it enabled?) and the Kubernetes reads go out side by side.
        expected, report = fan_out(
            [lambda: is_enabled(current_config(self._cluster())), self._daemonset_report_or_error]
        )
        if isinstance(report, HpkvError):
            return [self._daemonset_unknown(report)]
        return [self._daemonset_check_from(report, expected=expected)]

    def _daemonset_report_or_error(self) -> dict[str, Any] | HpkvError:
        try:
            return self.daemonset_report()
        except HpkvError as exc:
            return exc

    def _cluster_check(self, cluster: dict[str, Any]) -> Check:
        status = cluster.get("ClusterStatus", "unknown")
        name = cluster.get("ClusterName", self.ctx.settings.cluster)
        if status == "InService":
            return self.check("cluster", CheckState.OK, f"{name} is InService")
        if status in ("Failed", "Deleting"):
            reason = cluster.get("FailureMessage") or "no failure message"
            return self.check(
                "cluster",
                CheckState.FAIL,
                f"{name} is {status}: {reason}",
                "see the cluster's events in the SageMaker console",
            )
        return self.check(
            "cluster",
            CheckState.WARN,
            f"{name} is {status}",
            "wait for InService (hpkv waits with --wait)",
        )

    def _config_check(self, config: dict[str, Any]) -> Check:
        if not is_enabled(config):
            mode = config.get("Mode", "not set")
            return self.check(
                "tiered-storage",
                CheckState.WARN,
                f"not installed (TieredStorageConfig.Mode={mode})",
                "run 'hpkv tiered-storage apply'",
            )
        percent = config.get("InstanceMemoryAllocationPercentage")
        wanted = self.configured_percent()
        if percent != wanted:
            return self.check(
                "tiered-storage",
                CheckState.WARN,
                f"enabled with {percent}% of instance memory; hpkv.yaml asks for {wanted}%",
                "run 'hpkv tiered-storage apply' to converge, or change tieredStorage.memoryPercent",
            )
        return self.check(
            "tiered-storage", CheckState.OK, f"enabled with {percent}% of instance memory"
        )

    def _node_recovery_check(self, cluster: dict[str, Any]) -> Check:
        value = cluster.get("NodeRecovery")
        if value is None:
            return self.check(
                "node-recovery",
                CheckState.WARN,
                "DescribeCluster reports no NodeRecovery; UpdateCluster needs it to change "
                "tiered storage",
                "set it once with 'aws sagemaker update-cluster --node-recovery Automatic'",
            )
        return self.check(
            "node-recovery", CheckState.OK, f"NodeRecovery={value} (sent back unchanged on update)"
        )

    def hyperpod_nodes(self) -> list[str]:
        return sorted(
            n.metadata.name
            for n in reads.nodes(self.ctx)
            if (n.metadata.labels or {}).get(HYPERPOD_NODE_LABEL) == HYPERPOD_NODE_VALUE
        )

    def _read_daemonset(self) -> Any:
        from hpkv.kube import is_status, kube_errors

        with kube_errors(f"read DaemonSet {DAEMONSET_NAMESPACE}/{DAEMONSET_NAME}"):
            try:
                return self.ctx.kube.apps.read_namespaced_daemon_set(
                    DAEMONSET_NAME, DAEMONSET_NAMESPACE
                )
            except Exception as exc:
                if is_status(exc, 404):
                    return None
                raise

    def _list_daemonset_pods(self) -> Any:
        from hpkv.kube import kube_errors

        with kube_errors(f"list the {DAEMONSET_NAME} pods"):
            return self.ctx.kube.core.list_namespaced_pod(
                DAEMONSET_NAMESPACE, label_selector=f"app={DAEMONSET_NAME}"
            )

    def daemonset_report(self) -> dict[str, Any]:
        """Desired/ready counts of the ai-toolkit DaemonSet and the HyperPod nodes lacking it.

        ``why`` says, per node lacking a ready pod, what is wrong there.
        """
        from hpkv.kube import inspect

        nodes, ds, pod_list = fan_out(
            [self.hyperpod_nodes, self._read_daemonset, self._list_daemonset_pods]
        )
        if ds is None:
            why = dict.fromkeys(nodes, f"no DaemonSet {DAEMONSET_NAMESPACE}/{DAEMONSET_NAME}")
            return {"present": False, "nodes": nodes, "missing": nodes, "why": why}
        pods, pods_version = pod_list.items, pod_list.metadata.resource_version
        by_node = {p.spec.node_name: p for p in pods if p.spec.node_name}
        ready_nodes = {node for node, pod in by_node.items() if inspect.pod_ready(pod)}
        missing = [n for n in nodes if n not in ready_nodes]
        status = ds.status
        return {
            "present": True,
            "desired": status.desired_number_scheduled or 0,
            "ready": status.number_ready or 0,
            "nodes": nodes,
            "missing": missing,
            "why": {n: _why_not_ready(by_node.get(n)) for n in missing},
            "pods_version": pods_version,
        }

    def _daemonset_unknown(self, error: HpkvError) -> Check:
        name = f"{DAEMONSET_NAME}-daemonset"
        return self.check(name, CheckState.UNKNOWN, error.one_line(), "check Kubernetes access")

    def _daemonset_check_from(self, report: dict[str, Any], *, expected: bool) -> Check:
        name = f"{DAEMONSET_NAME}-daemonset"
        nodes = report["nodes"]
        if not report["present"]:
            if not expected:
                return self.check(name, CheckState.OK, "absent (tiered storage not enabled)")
            return self.check(
                name,
                CheckState.FAIL,
                f"DaemonSet {DAEMONSET_NAMESPACE}/{DAEMONSET_NAME} not found; tiered storage is "
                "enabled",
                "wait a few minutes after enabling; if it stays missing, disable and re-enable "
                "tiered storage",
            )
        evidence = (
            f"desired {report['desired']}, ready {report['ready']}, HyperPod nodes {len(nodes)}"
        )
        missing = report["missing"]
        if missing:
            shown = ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
            return self.check(
                name,
                CheckState.WARN if len(missing) < len(nodes) else CheckState.FAIL,
                f"{evidence}; not ready on: {shown}",
                f"check pods with 'kubectl -n {DAEMONSET_NAMESPACE} get pods -l app={DAEMONSET_NAME} -o wide'",
            )
        if report["ready"] < len(nodes):
            return self.check(
                name,
                CheckState.WARN,
                f"{evidence}; the DaemonSet does not yet report every node ready",
                f"check 'kubectl -n {DAEMONSET_NAMESPACE} get ds {DAEMONSET_NAME}'",
            )
        if not nodes:
            return self.check(
                name,
                CheckState.WARN,
                f"{evidence}; no HyperPod nodes found",
                f"nodes need the label {HYPERPOD_NODE_LABEL}={HYPERPOD_NODE_VALUE}",
            )
        return self.check(name, CheckState.OK, f"{evidence}; ready on every HyperPod node")

    # --- diagnose ----------------------------------------------------------------------------
    def detectors(self) -> list[Detector]:
        return [
            Detector.of(
                "tiered-storage.node-recovery-missing",
                "UpdateCluster would fail with ValidationException (no NodeRecovery)",
                "hyperpod-cluster",
                self._detect_node_recovery_missing,
                stage=self.name,
                requires_install=False,
            ),
            Detector.of(
                "tiered-storage.ai-toolkit-not-on-every-node",
                "ai-toolkit DaemonSet not ready on every HyperPod node",
                "tiered-storage",
                self._detect_ai_toolkit_gaps,
                stage=self.name,
            ),
        ]

    def _detect_node_recovery_missing(self, detector: Detector) -> list[Finding]:
        cluster = self._cluster()
        if cluster.get("NodeRecovery") is not None:
            return []
        name = cluster.get("ClusterName", self.ctx.settings.cluster)
        return [
            detector.finding(
                Severity.WARNING,
                f"DescribeCluster of '{name}' reports no NodeRecovery; SageMaker rejects "
                "UpdateCluster with TieredStorageConfig unless NodeRecovery or InstanceGroups is "
                "sent too, so hpkv cannot enable, resize or disable Tiered Storage",
                f"set it once: aws sagemaker update-cluster --cluster-name {name} "
                "--node-recovery Automatic (hpkv then sends it back unchanged)",
                [f"sagemaker cluster/{name}"],
            )
        ]

    def _detect_ai_toolkit_gaps(self, detector: Detector) -> list[Finding]:
        report = self.daemonset_report()
        nodes, missing = report["nodes"], report["missing"]
        if not nodes or not missing:
            return []
        impact = (
            "LMCache on those nodes cannot reach sagemaker-hyperpod://<node-ip>:9200 and runs "
            "without the L1 tier"
        )
        if not report["present"]:
            return [
                detector.finding(
                    Severity.CRITICAL,
                    f"Tiered Storage is enabled but DaemonSet {DAEMONSET_NAMESPACE}/"
                    f"{DAEMONSET_NAME} does not exist ({len(nodes)} HyperPod nodes); {impact}",
                    "wait a few minutes after enabling; if it stays missing, run "
                    "'hpkv tiered-storage remove' then 'hpkv tiered-storage apply'",
                    [f"DaemonSet/{DAEMONSET_NAMESPACE}/{DAEMONSET_NAME}"],
                )
            ]
        shown = "; ".join(f"{node}: {report['why'][node]}" for node in missing[:10])
        more = f" (and {len(missing) - 10} more)" if len(missing) > 10 else ""
        return [
            detector.finding(
                Severity.CRITICAL if len(missing) == len(nodes) else Severity.WARNING,
                f"not ready on {len(missing)} of {len(nodes)} HyperPod nodes: {shown}{more}; "
                f"{impact}",
                f"inspect with 'kubectl -n {DAEMONSET_NAMESPACE} get pods -l app={DAEMONSET_NAME} "
                "-o wide' and 'kubectl describe' the failing pods; a node without a pod may be "
                "missing the HyperPod label or be cordoned",
                [f"Node/{node}" for node in missing],
            )
        ]

    # --- plan --------------------------------------------------------------------------------
    def _ready_cluster(self) -> dict[str, Any]:
        """DescribeCluster, insisting on InService (waiting for it only with an explicit --wait)."""
        cluster = self._cluster()
        status = cluster.get("ClusterStatus")
        if status == "InService":
            return cluster
        name = cluster.get("ClusterName")
        if self.ctx.options.wait is True and status not in ("Failed", "Deleting"):
            with self.ctx.reporter.waiting(
                f"waiting for cluster {name} to be InService ({status})"
            ):
                return sagemaker.wait_for_cluster(
                    self.ctx.aws, name, timeout=self.ctx.options.timeout, delay=poll_interval()
                )
        raise PreconditionFailed(
            f"cluster '{name}' is {status}, not InService",
            fix="rerun with --wait to wait for InService, or retry when the current operation ends"
            if status not in ("Failed", "Deleting")
            else "fix the cluster first (see the SageMaker console)",
        )

    def plan(self, *, memory_percent: int | None = None, **_: Any) -> Plan:
        percent = validate_percent(
            memory_percent if memory_percent is not None else self.configured_percent()
        )
        cluster = self._ready_cluster()
        return self._plan_config(cluster, desired_config(percent))

    def plan_remove(self, **_: Any) -> Plan:
        cluster = self._ready_cluster()
        return self._plan_config(cluster, {"Mode": "Disable"})

    def plan_offline(self, profile: ClusterProfile) -> Plan:
        """The live plan, computed from the profile's DescribeCluster answer (no API call)."""
        percent = validate_percent(self.configured_percent())
        plan = self._plan_config(profile.describe_hyperpod(), desired_config(percent))
        if plan.changes:
            plan.notes.append(
                f"then waits for {profile.name} to return to InService and for the "
                f"{DAEMONSET_NAME} DaemonSet to be ready on its {profile.node_count} node(s)"
            )
        return plan

    def _plan_config(self, cluster: dict[str, Any], desired: dict[str, Any]) -> Plan:
        name = cluster["ClusterName"]
        plan = Plan(stage=self.name)
        current = current_config(cluster)
        target = f"sagemaker cluster/{name} TieredStorageConfig"
        enabling = is_enabled(desired)
        if _same_config(current, desired):
            plan.add(
                Action(target, Verb.NONE, _describe(current) + " (unchanged)", current, desired)
            )
            return plan
        node_recovery = cluster.get("NodeRecovery")
        if node_recovery is None:
            raise PreconditionFailed(
                f"DescribeCluster reports no NodeRecovery for '{name}', and UpdateCluster rejects "
                "TieredStorageConfig without it",
                fix="set it once with 'aws sagemaker update-cluster --cluster-name "
                f"{name} --node-recovery Automatic', then rerun",
            )
        verb = Verb.UPDATE
        summary = (
            f"{_describe(current)} -> {_describe(desired)}; NodeRecovery={node_recovery} sent back "
            "unchanged"
        )
        if not enabling:
            summary += "; removes the L1 CPU tier (LMCache falls back to recompute on this tier)"
        plan.add(
            Action(
                target,
                verb,
                summary,
                before={**current, "NodeRecovery": node_recovery},
                after={**desired, "NodeRecovery": node_recovery},
                run=lambda: self._update(name, desired, node_recovery),
            )
        )
        return plan

    # --- writes ------------------------------------------------------------------------------
    def _update(self, name: str, desired: dict[str, Any], node_recovery: str) -> None:
        try:
            sagemaker.update_cluster(
                self.ctx.aws, name, TieredStorageConfig=desired, NodeRecovery=node_recovery
            )
        except PreconditionFailed:
            # botocore retries a call whose answer timed out; when the first attempt was applied,
            # the retry conflicts with it (the cluster is Updating) although the change is made
            if _same_config(current_config(self._cluster()), desired):
                return
            raise

    def apply(self, plan: Plan) -> ApplyResult:
        result = self.run_plan(plan)
        if self.ctx.options.wait is False:
            if result.performed:
                result.notes.append(
                    "not waiting (--no-wait); check with 'hpkv tiered-storage status'"
                )
            return result
        desired = next((a.after for a in plan.actions), None) or {}
        if result.performed:
            self._wait_converged(desired)
        expected = is_enabled(desired)
        result.checks.append(self._wait_daemonset(expected=expected))
        return result

    def remove(self, plan: Plan) -> ApplyResult:
        return self.apply(plan)

    def _wait_converged(self, desired: dict[str, Any]) -> None:
        name = self.ctx.require_cluster()
        condition = "ClusterStatus == 'InService' && TieredStorageConfig.Mode == '{}'".format(
            desired["Mode"]
        )
        if "InstanceMemoryAllocationPercentage" in desired:
            condition += (
                " && TieredStorageConfig.InstanceMemoryAllocationPercentage == `{}`".format(
                    int(desired["InstanceMemoryAllocationPercentage"])
                )
            )
        with self.ctx.reporter.waiting(f"waiting for cluster {name} to return to InService"):
            sagemaker.wait_for_cluster(
                self.ctx.aws,
                name,
                timeout=self.ctx.options.timeout,
                condition=condition,
                what="InService with the new tiered storage setting",
                delay=poll_interval(),
            )

    def _wait_daemonset(self, *, expected: bool) -> Check:
        deadline = time.monotonic() + self.ctx.options.timeout
        what = "ready on every HyperPod node" if expected else "gone"
        with self.ctx.reporter.waiting(f"waiting for DaemonSet {DAEMONSET_NAME} to be {what}"):
            while True:
                report = self.daemonset_report()
                check = self._daemonset_check_from(report, expected=expected)
                done = check.state is CheckState.OK
                if not expected:
                    done = not report["present"] or done
                if done:
                    return check
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WaitTimeout(
                        f"DaemonSet {DAEMONSET_NAMESPACE}/{DAEMONSET_NAME} was not {what} within "
                        f"{int(self.ctx.options.timeout)}s: {check.evidence}",
                        fix=check.remediation or "check the DaemonSet's pods and rerun",
                    )
                self._watch_daemonset(min(remaining, 30.0), report.get("pods_version"))

    def _watch_daemonset(self, seconds: float, resource_version: str | None) -> None:
        """Block until the DaemonSet or its pods change (a watch), or ``seconds`` pass."""
        from kubernetes import watch

        from hpkv.kube import kube_errors

        if resource_version is None:
            time.sleep(min(seconds, 5.0))
            return
        w = watch.Watch()
        with kube_errors("watch the ai-toolkit pods"):
            for _event in w.stream(
                self.ctx.kube.core.list_namespaced_pod,
                DAEMONSET_NAMESPACE,
                label_selector=f"app={DAEMONSET_NAME}",
                resource_version=resource_version,
                timeout_seconds=max(1, int(seconds)),
                _request_timeout=seconds + 5,
            ):
                w.stop()
                break


def _why_not_ready(pod: Any) -> str:
    from hpkv.kube import inspect

    if pod is None:
        return f"no {DAEMONSET_NAME} pod"
    problems = inspect.container_problems(pod)
    if problems:
        return "; ".join(p.describe() for p in problems)
    phase = pod.status.phase if pod.status else None
    return f"pod {pod.metadata.name} is {phase or 'unknown'}, not Ready"


def _same_config(current: dict[str, Any], desired: dict[str, Any]) -> bool:
    if not is_enabled(desired):
        return not is_enabled(current)
    return is_enabled(current) and current.get("InstanceMemoryAllocationPercentage") == desired.get(
        "InstanceMemoryAllocationPercentage"
    )


def _describe(config: dict[str, Any]) -> str:
    if not config:
        return "not configured"
    if is_enabled(config):
        return f"Enable at {config.get('InstanceMemoryAllocationPercentage')}%"
    return "Disable"
