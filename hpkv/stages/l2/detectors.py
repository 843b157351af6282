"""Stage 4's detectors for ``hpkv diagnose``: what the per-endpoint wiring reports
(:meth:`hpkv.stages.l2.L2Stage.report`, :mod:`hpkv.stages.l2.pods`) and the workers' ``/metrics``
say is wrong. The reports are computed once per run (without exec probes) and shared.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpkv.stages.base import Detector, Finding, Severity
from hpkv.stages.l2.pods import choose_restart, consistency_findings
from hpkv.stages.l2.wiring import (
    PATCH_ORIGINAL_ANNOTATION,
    REMOTE_URL_ENV,
    vllm_container_index,
)

if TYPE_CHECKING:
    from hpkv.stages.l2 import EndpointReport, L2Stage

GENERIC_REPLICA_MISMATCH = "lmcache.replica-mismatch"
DEFAULT_METRICS_PORT = 8080  # the operator's modelMetrics.port default
# Below this many tokens looked up in LMCache, a zero L2 read count means too little traffic.
MIN_LOOKUP_TOKENS = 10_000


def detectors(stage: L2Stage) -> list[Detector]:
    def bind(fn: Callable[[L2Stage, Detector], list[Finding]]) -> Callable[[Detector], Any]:
        return lambda detector: fn(stage, detector)

    specs: list[tuple[str, str, str, Callable[[L2Stage, Detector], list[Finding]], tuple[str, ...]]] = [
        ("l2.remote-url", "Endpoint pods without the Curvine URL, or with it twice", "l2",
         _remote_url, ()),
        ("l2.stale-pods", "Pods created before the current L2 wiring", "l2", _stale_pods, ()),
        ("l2.patch-reverted", "The operator re-rendered away a --mode patch wiring", "l2",
         _patch_reverted, ()),
        ("l2.replica-mismatch", "Replicas differ in PYTHONHASHSEED, model, TP or chunk size",
         "lmcache", _replica_mismatch, (GENERIC_REPLICA_MISMATCH,)),
        ("l2.rollout-stuck", "GPU-bound rollout stuck on maxSurge", "l2", _rollout_stuck, ()),
        ("l2.hit-rate-zero", "L2 never hit while L0/L1 hit", "lmcache", _hit_rate_zero, ()),
    ]  # fmt: skip
    return [
        Detector.of(i, title, component, bind(fn), stage=stage.name, supersedes=supersedes)
        for i, title, component, fn, supersedes in specs
    ]


def _reports(stage: L2Stage) -> list[EndpointReport]:
    return stage.ctx.memo("l2:reports", lambda: stage.reports(probe=False))


def _pods(report: EndpointReport, names: list[str]) -> list[str]:
    return [f"Pod/{report.ref.namespace}/{name}" for name in names]


def _workload(report: EndpointReport) -> str:
    return f"Deployment/{report.ref.namespace}/{report.ref.name}"


def _shown(names: list[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (
        f" (+{len(names) - limit} more)" if len(names) > limit else ""
    )


# --- the env var --------------------------------------------------------------------------------
def _remote_url(stage: L2Stage, detector: Detector) -> list[Finding]:
    wiring = stage.wiring()
    findings = []
    for report in _reports(stage):
        ref = report.ref
        apply = f"'hpkv l2 apply --endpoint {ref}'"
        twice = [p for p in report.pods if len(p.remote_urls) > 1]
        if twice:
            values = ", ".join(twice[0].remote_urls)
            findings.append(
                detector.finding(
                    Severity.CRITICAL,
                    f"{ref}: {REMOTE_URL_ENV} appears more than once in {len(twice)} pod(s) "
                    f"({_shown([p.name for p in twice])}; e.g. {values}): which one LMCache "
                    "reads is ambiguous",
                    f"remove {REMOTE_URL_ENV} from the endpoint's worker.environmentVariables "
                    f"(the operator renders its own), then run {apply}",
                    [_workload(report), *_pods(report, [p.name for p in twice])],
                    title=f"{ref}: {REMOTE_URL_ENV} set twice",
                )
            )
        unwired = [p for p in report.pods if not p.wired(wiring)]
        if not unwired:
            continue
        current = wiring.fingerprint(ref)
        if report.mechanism:
            # Stale pods (created before the wiring) are l2.stale-pods; these were admitted
            # under the current wiring and still lack the URL.
            failed = [p for p in unwired if p.fingerprint == current]
            if failed:
                findings.append(
                    detector.finding(
                        Severity.CRITICAL,
                        f"{ref}: {len(failed)} pod(s) ({_shown([p.name for p in failed])}) carry "
                        f"the current wiring's fingerprint but not {REMOTE_URL_ENV}="
                        f"{wiring.remote_url} (they use "
                        f"{failed[0].remote_urls[-1] if failed[0].remote_urls else 'none'}): "
                        "they write to another backend than the shared L2",
                        f"check the endpoint's policy ('kubectl get mutatingadmissionpolicy "
                        f"hpkv-l2-{ref.namespace}-{ref.name} -o yaml') and re-create the pods "
                        f"with {apply}",
                        [_workload(report), *_pods(report, [p.name for p in failed])],
                        title=f"{ref}: pods without the Curvine URL",
                    )
                )
            continue
        current_url = unwired[0].remote_urls[-1] if unwired[0].remote_urls else "unset"
        findings.append(
            detector.finding(
                Severity.WARNING,
                f"{ref} is not wired to the Curvine L2: its {len(unwired)} pod(s) use "
                f"{REMOTE_URL_ENV}={current_url}, so they share no cache entries through the L2",
                f"wire it with {apply}",
                [_workload(report), *_pods(report, [p.name for p in unwired])],
                title=f"{ref}: pods without the Curvine URL",
            )
        )
    return findings


def _stale_pods(stage: L2Stage, detector: Detector) -> list[Finding]:
    findings = []
    for report in _reports(stage):
        if not report.stale or not report.mechanism:
            continue
        ref = report.ref
        findings.append(
            detector.finding(
                Severity.WARNING,
                f"{ref}: {len(report.stale)} pod(s) were created before the current L2 wiring "
                f"({_shown(report.stale)}) and run without it (or with an older one)",
                f"run 'hpkv l2 apply --endpoint {ref}' (re-creates them without a GPU deadlock), "
                f"or 'kubectl -n {ref.namespace} delete pod {' '.join(report.stale[:10])}'",
                [_workload(report), *_pods(report, report.stale)],
                title=f"{ref}: stale pods",
            )
        )
    return findings


def _patch_reverted(stage: L2Stage, detector: Detector) -> list[Finding]:
    findings = []
    for report in _reports(stage):
        deployment = report.deployment
        if deployment is None or report.patched:
            continue
        annotations = (deployment.get("metadata") or {}).get("annotations") or {}
        if PATCH_ORIGINAL_ANNOTATION not in annotations:
            continue
        ref = report.ref
        if report.mechanism in ("admission-policy", "kyverno"):
            continue  # the policy wires the pods whatever the template says
        findings.append(
            detector.finding(
                Severity.CRITICAL,
                f"Deployment {ref} carries {PATCH_ORIGINAL_ANNOTATION} from 'hpkv l2 apply "
                "--mode patch', but its pod template no longer has the wiring: the operator "
                "re-rendered it (endpoint edit, operator upgrade) and pods it creates start "
                "without the Curvine L2",
                f"wire it durably: 'hpkv l2 apply --mode policy --endpoint {ref}' (pods are "
                "wired at admission, whatever the operator renders)",
                [_workload(report)],
                title=f"{ref}: patch-mode wiring re-rendered away",
            )
        )
    return findings


# --- cache keys ---------------------------------------------------------------------------------
def _replica_mismatch(stage: L2Stage, detector: Detector) -> list[Finding]:
    wiring = stage.wiring()
    findings = []
    for report in _reports(stage):
        wired = [p for p in report.pods if p.wired(wiring)]
        differing = consistency_findings(wired) if len(wired) >= 2 else {}
        if not differing:
            continue
        ref = report.ref
        described = "; ".join(
            f"{part}: "
            + ", ".join(f"{value} on {'/'.join(names)}" for value, names in groups.items())
            for part, groups in differing.items()
        )
        findings.append(
            detector.finding(
                Severity.CRITICAL,
                f"{ref}: cache-key parts differ between replicas ({described}), so they write "
                "and look up different L2 keys and never hit each other's entries",
                f"make the replicas identical: re-create old pods ('hpkv l2 apply --endpoint "
                f"{ref}') or fix the differing args/env in the InferenceEndpointConfig",
                [_workload(report), *_pods(report, [p.name for p in report.pods])],
                title=f"{ref}: replicas compute different cache keys",
            )
        )
    return findings


# --- rollouts -----------------------------------------------------------------------------------
def _unschedulable(pod: dict[str, Any]) -> str | None:
    status = pod.get("status") or {}
    if status.get("phase") != "Pending":
        return None
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return " ".join(str(condition.get("message") or condition.get("reason")).split())
    return None


def _rollout_stuck(stage: L2Stage, detector: Detector) -> list[Finding]:
    from hpkv import reads

    findings = []
    for report in _reports(stage):
        deployment = report.deployment
        if deployment is None:
            continue
        spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
        replicas = int(spec.get("replicas") if spec.get("replicas") is not None else 1)
        updated = int(status.get("updatedReplicas") or 0)
        if updated >= replicas:
            continue
        pods = stage.pods(report.ref)
        waiting = [(p["metadata"]["name"], why) for p in pods if (why := _unschedulable(p))]
        if not waiting:
            continue
        plain = stage._plain
        choice, why = choose_restart(
            deployment, [plain(n) for n in reads.nodes(stage.ctx)],
            [plain(p) for p in reads.pods(stage.ctx)],
        )  # fmt: skip
        if choice != "pod-by-pod":
            continue
        ref = report.ref
        name, message = waiting[0]
        findings.append(
            detector.finding(
                Severity.CRITICAL,
                f"the rollout of Deployment {ref} is stuck: {updated} of {replicas} replicas "
                f"updated; surge pod {name} is Pending ({message[:200]}): {why}",
                f"free a GPU for it: 'kubectl -n {ref.namespace} scale deployment {ref.name} "
                f"--replicas=0', then back to {replicas} (a short outage), or allow one pod down "
                f"during the rollout ('kubectl -n {ref.namespace} patch deployment {ref.name} -p "
                '\'{"spec":{"strategy":{"rollingUpdate":{"maxUnavailable":1}}}}\'\'); hpkv\'s '
                "own restarts ('hpkv l2 apply') go pod by pod when no GPU is free",
                [_workload(report), *_pods(report, [n for n, _w in waiting])],
                title=f"{ref}: rollout stuck on maxSurge",
            )
        )
    return findings


# --- metrics ------------------------------------------------------------------------------------
def _metrics_port(report: EndpointReport) -> int:
    template = ((report.deployment or {}).get("spec") or {}).get("template") or {}
    containers = (template.get("spec") or {}).get("containers") or []
    if containers:
        vllm = containers[vllm_container_index(containers, report.ref.name)]
        for port in vllm.get("ports") or []:
            if port.get("containerPort"):
                return int(port["containerPort"])
    return DEFAULT_METRICS_PORT


def _hit_rate_zero(stage: L2Stage, detector: Detector) -> list[Finding]:
    from hpkv.bench.metrics import MetricsScraper

    wiring = stage.wiring()
    findings = []
    for report in _reports(stage):
        serving = [p.name for p in report.pods if p.wired(wiring) and p.ready]
        if len(serving) < 2:
            continue  # the L2 pays off across replicas; one replica reads it only after L1 misses
        scraper = MetricsScraper.through_cluster(
            stage.ctx.kube, report.ref.namespace, _metrics_port(report)
        )
        snapshots = [s for s in scraper.snapshot(serving).values() if s]
        total: dict[str, float] = {}
        for snap in snapshots:
            for key, value in snap.items():
                total[key] = total.get(key, 0.0) + value
        if "l2ReadRequests" not in total:
            continue  # LMCache metrics not exported (PROMETHEUS_MULTIPROC_DIR): nothing to judge
        l0 = total.get("l0Hits", 0.0)
        l1 = max(total.get("externalHits", 0.0), total.get("lmcacheHitTokens", 0.0))
        looked_up = total.get("lmcacheRequestedTokens", total.get("externalQueries", 0.0))
        if total["l2ReadRequests"] > 0 or (l0 <= 0 and l1 <= 0) or looked_up < MIN_LOOKUP_TOKENS:
            continue
        writes = total.get("l2WriteRequests", 0.0)
        if writes <= 0:
            cause = (
                "nothing was written to the L2 either: LMCache is not storing to the fs backend "
                "(check the wiring and 'lmcache.degraded-mode')"
            )
        else:
            cause = (
                f"{writes:.0f} chunk(s) were written and none read back: replicas compute "
                "different keys (PYTHONHASHSEED, model, chunk size; see l2.replica-mismatch) or "
                "no request repeats a prefix another replica stored"
            )
        ref = report.ref
        findings.append(
            detector.finding(
                Severity.WARNING,
                f"{ref}: {len(snapshots)} replica(s) report GPU prefix-cache (L0) hits "
                f"{l0:.0f} tokens and LMCache hits {l1:.0f} tokens of {looked_up:.0f} looked "
                f"up, but 0 L2 reads (lmcache:num_remote_read_requests); {cause}",
                f"send one prompt of 1,000+ tokens to two replicas in turn ('hpkv bench run "
                f"--endpoint {ref.name}' measures cross-pod hits) and compare "
                "lmcache:num_remote_write_requests / num_remote_read_requests on both",
                [_workload(report), *_pods(report, serving)],
                title=f"{ref}: the L2 is never hit",
            )
        )
    return findings
