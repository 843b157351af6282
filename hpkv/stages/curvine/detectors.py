"""Stage 3's detectors for ``hpkv diagnose``, from the reads its status makes (Helm values, the
master's ``/api/overview``, GPU nodes, the EBS CSI add-on and role), shared within a run."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpkv import reads
from hpkv.errors import HpkvError
from hpkv.stages.base import Detector, Finding, Severity
from hpkv.stages.curvine.values import (
    CSI_CHART,
    CURVINE_FS_PATH,
    dig,
    fullname,
    human_bytes,
    is_kernel_6_or_later,
    shorten,
    worker_count,
)

if TYPE_CHECKING:
    from hpkv.stages.curvine.stage import CurvineStage

FULL_CRITICAL = 0.95  # used share at which writes start failing soon


def detectors(stage: CurvineStage) -> list[Detector]:
    def bind(fn: Callable[[CurvineStage, Detector], list[Finding]]) -> Callable[[Detector], Any]:
        return lambda detector: fn(stage, detector)

    specs: list[tuple[str, str, Callable[[CurvineStage, Detector], list[Finding]], tuple[str, ...]]] = [
        ("curvine.master-not-active", "Curvine master not Active", _master, ()),
        ("curvine.workers-lost", "Curvine workers lost or missing", _workers, ()),
        ("curvine.capacity-near-full", "Curvine cache capacity near full", _capacity, ()),
        ("curvine.eviction-off", "No eviction configured: the L2 fills up", _eviction, ()),
        ("curvine.fuse-kernel-6x", "HyperPod nodes run Linux 6.x, where Curvine FUSE is "
         "untested", _fuse_kernel, ()),
        ("curvine.csi-image-pull", "Curvine CSI images cannot be pulled", _csi_image_pull,
         ("pods.image-pull-backoff",)),
        ("curvine.ebs-csi-driver", "EBS CSI driver unhealthy or without HyperPod permissions",
         _ebs_csi, ()),
    ]  # fmt: skip
    return [
        Detector.of(i, title, "curvine", bind(fn), stage=stage.name, supersedes=supersedes)
        for i, title, fn, supersedes in specs
    ]


def _overview(stage: CurvineStage) -> tuple[str, dict[str, Any]]:
    return stage.overview(stage.live_values())


def _component_pods(stage: CurvineStage, component: str) -> list[Any]:
    return [
        pod
        for pod in reads.pods(stage.ctx)
        if pod.metadata.namespace == stage.namespace
        and (pod.metadata.labels or {}).get("app.kubernetes.io/component") == component
    ]


def _pod_problems(pods: list[Any]) -> str:
    from hpkv.kube import inspect

    described = []
    for pod in pods:
        problems = inspect.container_problems(pod)
        if problems:
            described += [p.describe() for p in problems[:2]]
        elif not inspect.pod_ready(pod):
            phase = pod.status.phase if pod.status else "unknown"
            described.append(f"{inspect.pod_key(pod)} is {phase}, not Ready")
    return "; ".join(described[:4])


# --- master, workers, capacity ------------------------------------------------------------------
def _master(stage: CurvineStage, detector: Detector) -> list[Finding]:
    logs = (
        f"read the master's log: 'kubectl -n {stage.namespace} logs {stage.master_base}-0' "
        "(Raft leader election, journal replay; a slow replay needs the chart's startupProbe)"
    )
    pods = _pod_problems(_component_pods(stage, "master"))
    try:
        where, overview = _overview(stage)
    except HpkvError as exc:
        evidence = f"the master API does not answer: {exc.message}"
        return [
            detector.finding(
                Severity.CRITICAL,
                evidence + (f"; master pods: {pods}" if pods else ""),
                f"check the master pods ('kubectl -n {stage.namespace} get pods -l "
                f"app.kubernetes.io/component=master'); {logs}",
                [f"StatefulSet/{stage.namespace}/{stage.master_base}"],
            )
        ]
    state = overview.get("master_state", "unknown")
    if state == "Active":
        return []
    return [
        detector.finding(
            Severity.CRITICAL,
            f"no Active master: {where} reports master_state={state}; PVCs cannot be "
            "provisioned and FUSE mounts stall while there is none"
            + (f"; master pods: {pods}" if pods else ""),
            logs,
            [f"StatefulSet/{stage.namespace}/{stage.master_base}"],
        )
    ]


def _workers(stage: CurvineStage, detector: Detector) -> list[Finding]:
    try:
        _where, overview = _overview(stage)
    except HpkvError:
        return []  # curvine.master-not-active says why
    live = worker_count(overview.get("live_workers"))
    lost = worker_count(overview.get("lost_workers"))
    nodes = stage._nodes_or_none() or []
    objects = [f"StatefulSet/{stage.namespace}/{fullname(stage.release)}-worker"]
    findings = []
    if lost:
        names: list[str] = []
        try:
            _w, workers = stage.master_api("api/workers", stage.live_values())
            names = [
                str((w.get("address") or {}).get("hostname") or "?")
                for w in workers.get("lost_workers") or []
            ]
        except HpkvError:
            pass
        problems = _pod_problems(_component_pods(stage, "worker"))
        findings.append(
            detector.finding(
                Severity.WARNING if live else Severity.CRITICAL,
                f"{lost} Curvine worker(s) lost{': ' + shorten(names) if names else ''} "
                f"({live} live): the KV blocks they cached are unreachable until they return"
                + (f"; worker pods: {problems}" if problems else ""),
                f"check the worker pods and their nodes ('kubectl -n {stage.namespace} get pods "
                "-l app.kubernetes.io/component=worker -o wide'); a worker is marked lost 10 min "
                "(worker_lost_interval) after its last heartbeat",
                objects,
            )
        )
    elif nodes and live < len(nodes):
        findings.append(
            detector.finding(
                Severity.WARNING,
                f"{live} live Curvine worker(s) for {len(nodes)} GPU nodes: the nodes without "
                "one add no cache capacity",
                f"check the worker StatefulSet ('kubectl -n {stage.namespace} get pods -l "
                "app.kubernetes.io/component=worker -o wide'); 'hpkv curvine apply' sizes it to "
                "the GPU nodes",
                objects,
            )
        )
    return findings


def _capacity(stage: CurvineStage, detector: Detector) -> list[Finding]:
    try:
        _where, overview = _overview(stage)
    except HpkvError:
        return []
    capacity = int(overview.get("capacity") or 0)
    available = int(overview.get("available") or 0)
    if capacity <= 0:
        return []
    used = 1 - available / capacity
    high = float(stage.cfg["eviction"]["highWatermark"])
    if used <= high:
        return []
    return [
        detector.finding(
            Severity.CRITICAL if used >= FULL_CRITICAL else Severity.WARNING,
            f"the Curvine cache is {used:.0%} full ({human_bytes(available)} free of "
            f"{human_bytes(capacity)}), above the eviction high watermark {high:.0%}: eviction "
            "is not keeping up or not configured, and LMCache writes to the L2 start failing",
            "check curvine.eviction in hpkv.yaml (quotaEviction, ttl; 'curvine.eviction-off') "
            "and the master's eviction_* metrics; delete old entries under "
            f"{CURVINE_FS_PATH} on a mounted pod if it stays full",
            [f"StatefulSet/{stage.namespace}/{fullname(stage.release)}-worker"],
        )
    ]


def _eviction(stage: CurvineStage, detector: Detector) -> list[Finding]:
    overrides = stage.live_values().get("configOverrides") or {}
    quota = bool(dig(overrides, "master", "enable_quota_eviction", default=False))
    ttl_action = str(dig(overrides, "client", "ttl_action", default="none") or "none")
    ttl = str(dig(overrides, "client", "ttl_ms", default="0") or "0")
    fix = (
        "set curvine.eviction in hpkv.yaml (hpkv's defaults: quotaEviction true, ttl 24h, "
        "ttlAction delete) and run 'hpkv curvine apply'"
    )
    release = [f"helm release {stage.namespace}/{stage.release}"]
    if ttl_action == "none" or ttl in ("0", "0ms", "0s"):
        return [
            detector.finding(
                Severity.WARNING,
                f"Curvine runs with ttl_action={ttl_action}, ttl_ms={ttl} "
                f"(enable_quota_eviction={str(quota).lower()}): with no TTL action the quota "
                "LRU does not evict either, so the L2 fills up and LMCache writes fail",
                fix,
                release,
            )
        ]
    if not quota:
        return [
            detector.finding(
                Severity.WARNING,
                f"quota eviction is off (enable_quota_eviction=false): only the TTL "
                f"({ttl}, {ttl_action}) frees space, so a busy cache fills up within it",
                fix,
                release,
            )
        ]
    return []


# --- nodes and CSI ------------------------------------------------------------------------------
def _fuse_kernel(stage: CurvineStage, detector: Detector) -> list[Finding]:
    from hpkv.kube import inspect
    from hpkv.stages.curvine.values import HYPERPOD_LABEL, HYPERPOD_VALUE

    newer = [
        (n.metadata.name, inspect.kernel_version(n))
        for n in reads.nodes(stage.ctx)
        if (n.metadata.labels or {}).get(HYPERPOD_LABEL) == HYPERPOD_VALUE
        and is_kernel_6_or_later(inspect.kernel_version(n))
    ]
    if not newer:
        return []
    shown = ", ".join(f"{name} ({kernel})" for name, kernel in newer[:10])
    more = f" and {len(newer) - 10} more" if len(newer) > 10 else ""
    return [
        detector.finding(
            Severity.WARNING,
            f"{len(newer)} HyperPod node(s) run a 6.x kernel: {shown}{more}. Curvine documents "
            "kernels 3.10 to 5.15 and its FUSE client is reported incompatible with 6.x "
            "(CurvineIO/curvine#35, #252: I/O errors on the mount)",
            "test the L2 mount under load before relying on it (cp and vi on the mount, "
            "'hpkv bench'); prefer an AMI with a 5.x kernel for nodes serving the L2",
            [f"Node/{name}" for name, _k in newer],
        )
    ]


def _csi_image_pull(stage: CurvineStage, detector: Detector) -> list[Finding]:
    from hpkv.kube import inspect

    prefix = fullname(stage.csi_release, CSI_CHART) + "-"
    failing = [
        (pod, problem)
        for pod in reads.pods(stage.ctx)
        if pod.metadata.namespace == stage.namespace and pod.metadata.name.startswith(prefix)
        for problem in inspect.container_problems(pod)
        if problem.image_pull
    ]
    findings = []
    keys = {"node-driver-registrar": "registrarImage", "provisioner": "provisionerImage"}
    for image, items in inspect.group_by(failing, lambda item: item[1].image).items():
        pods = sorted({inspect.pod_key(pod) for pod, _p in items})
        container = items[0][1].container
        key = next((v for k, v in keys.items() if k in container or k in image), "")
        retired = image.startswith("quay.io/k8scsi/")
        why = (
            "the quay.io/k8scsi CSI sidecar images are no longer published"
            if retired
            else "the image cannot be pulled"
        )
        setting = f"curvine.csi.{key}" if key else "curvine.csiExtraValues"
        findings.append(
            detector.finding(
                Severity.CRITICAL,
                f"{items[0][1].reason} for {image} (container {container}) in {len(pods)} "
                f"Curvine CSI pod(s) ({', '.join(pods[:5])}): {why}, so no node can mount "
                "the L2 and its PVCs are not provisioned",
                f"set {setting} to a pullable image (hpkv's default is registry.k8s.io/"
                "sig-storage/...) and run 'hpkv curvine apply'",
                [f"Pod/{p}" for p in pods],
                title=f"Curvine CSI image {image} cannot be pulled",
            )
        )
    return findings


def _ebs_csi(stage: CurvineStage, detector: Detector) -> list[Finding]:
    from hpkv.aws import addon_plan, ebs_csi, eks, iam
    from hpkv.aws.irsa import trust_drift, trust_drift_finding

    addon = reads.addon(stage.ctx, ebs_csi.ADDON_NAME)
    if addon is None:
        return []
    cluster = stage.eks_cluster["name"]
    findings = []
    if addon.get("status") in eks.FAILED:
        findings.append(
            addon_plan.failed_addon_finding(
                detector,
                cluster,
                addon,
                lambda _issues: (
                    "fix the cause in the health issues, then run 'hpkv curvine "
                    "apply' (it repairs or re-creates the add-on)"
                ),
            )
        )
    role_arn = addon.get("serviceAccountRoleArn")
    if not role_arn:
        return findings
    role = iam.role_name(role_arn)
    policy = reads.inline_policy(stage.ctx, role, ebs_csi.INLINE_POLICY_NAME)
    if policy is None or not iam.same_document(policy, ebs_csi.hyperpod_volume_policy()):
        findings.append(
            detector.finding(
                Severity.CRITICAL,
                f"the EBS CSI driver's role {role} lacks {', '.join(ebs_csi.HYPERPOD_ACTIONS)}: "
                "attaching the Curvine master's EBS volumes to HyperPod nodes fails with "
                "ValidationException and the master stays Pending",
                "run 'hpkv curvine apply' (puts the inline policy "
                f"{ebs_csi.INLINE_POLICY_NAME} on the role)",
                [f"iam role/{role}", f"eks addon/{ebs_csi.ADDON_NAME}"],
                title=f"role {role} lacks the HyperPod volume permissions",
            )
        )
    if role == stage.role_name:  # hpkv's own role: its trust is hpkv's to check
        live = reads.role(stage.ctx, role)
        issuer = eks.oidc_issuer(stage.eks_cluster)
        if live is not None and issuer:
            wanted = ebs_csi.hpkv_role(role, stage.account, issuer)
            drift = trust_drift(live.get("AssumeRolePolicyDocument"), wanted.trust or [])
            if drift is not None:
                findings.append(
                    trust_drift_finding(
                        detector,
                        role,
                        ebs_csi.ROLE_TITLE,
                        drift,
                        "review it with 'hpkv curvine apply --dry-run' and fix it with 'hpkv "
                        "curvine apply --yes'",
                    )
                )
    return findings
