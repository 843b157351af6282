"""Detectors that need only the HyperPod cluster, EKS and generic Kubernetes reads.

They inspect the namespaces hpkv cares about (``scope_namespaces``: every stage's own, the
operator's, Curvine's, kube-system and the namespaces of inference endpoints and LMCache pods).
Stage-specific detectors live in their stage module (``Stage.detectors()``); the helpers here
(pod problems, LMCache containers, log scanning) are meant for them too.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpkv import reads
from hpkv.concurrency import fan_out
from hpkv.health.redact import redact_text
from hpkv.kube import inspect
from hpkv.stages.base import Detector, Finding, Severity
from hpkv.topology import ROUTING_HTTPS

if TYPE_CHECKING:
    from hpkv.context import RunContext

PENDING_GRACE = datetime.timedelta(minutes=5)
LOG_SCAN_LINES = 2000
DEFAULT_ARCH = "amd64"
DEGRADED = re.compile(r"degraded mode", re.I)


def generic_detectors(ctx: RunContext) -> list[Detector]:
    def bind(fn: Callable[[RunContext, Detector], list[Finding]]) -> Callable[[Detector], Any]:
        return lambda detector: fn(ctx, detector)

    specs: list[tuple[str, str, str, Callable[[RunContext, Detector], list[Finding]]]] = [
        ("cluster.not-in-service", "HyperPod cluster not InService", "hyperpod-cluster",
         _not_in_service),
        ("pods.crash-looping", "Pods crash-looping", "kubernetes", _crash_looping),
        ("pods.wrong-architecture", "Pods crashing on nodes of an architecture their image "
         "lacks", "kubernetes", _wrong_architecture),
        ("pods.image-pull-backoff", "Images that cannot be pulled", "kubernetes", _image_pull),
        ("pvc.pending", "PersistentVolumeClaims stuck Pending", "kubernetes", _pvc_pending),
        ("lmcache.degraded-mode", "LMCache fell back to degraded mode (recompute)", "lmcache",
         _degraded_mode),
        ("lmcache.cachegen-with-fs-connector", "LMCACHE_REMOTE_SERDE=cachegen with the fs "
         "connector", "lmcache", _cachegen_fs),
        ("lmcache.pythonhashseed-unset", "LMCache pods with a shared cache but no "
         "PYTHONHASHSEED", "lmcache", _hash_seed_unset),
        ("lmcache.replica-mismatch", "Replicas differ in hash seed, chunk size, model or TP "
         "size", "lmcache", _replica_mismatch),
        ("routing.https-scheme", "Routing service called with https", "inference-operator",
         _routing_https),
    ]  # fmt: skip
    return [
        Detector.of(i, title, component, bind(fn), stage="cluster", requires_install=False)
        for i, title, component, fn in specs
    ]


# --- scope -----------------------------------------------------------------------------------------
def scope_namespaces(ctx: RunContext) -> list[str]:
    """Namespaces hpkv inspects: the sections' own plus those of endpoints and LMCache pods."""

    def load() -> list[str]:
        from hpkv.health.sections import namespaces, sections

        names = set(namespaces(ctx, sections(ctx)))
        names.update(endpoint_namespaces(ctx))
        return sorted(names)

    return ctx.memo("health:namespaces", load)


def endpoint_namespaces(ctx: RunContext) -> list[str]:
    """Namespaces of InferenceEndpointConfigs and of LMCache pods."""
    names = set(ctx.memo("kube:endpoint-namespaces", lambda: _endpoint_config_namespaces(ctx)))
    names.update(pod.metadata.namespace for pod, _c, _env in lmcache_containers(ctx))
    return sorted(names)


def _endpoint_config_namespaces(ctx: RunContext) -> list[str]:
    # One list call (no API discovery); a 404 means the operator's CRD is not installed.
    from hpkv import topology
    from hpkv.kube import is_status, kube_errors

    with kube_errors("list InferenceEndpointConfigs"):
        try:
            listed = ctx.kube.custom.list_cluster_custom_object(
                topology.INFERENCE_GROUP, topology.INFERENCE_VERSION, topology.ENDPOINT_PLURAL
            )
        except Exception as exc:
            if is_status(exc, 404):
                return []
            raise
    return sorted({item["metadata"]["namespace"] for item in listed.get("items", [])})


def scoped_pods(ctx: RunContext) -> list[Any]:
    wanted = set(scope_namespaces(ctx))
    return [p for p in reads.pods(ctx) if p.metadata.namespace in wanted]


@dataclass(frozen=True)
class Failing:
    pod: Any
    problem: inspect.ContainerProblem
    node_arch: str


def failing_containers(ctx: RunContext) -> list[Failing]:
    """Container problems of every scoped pod, with the architecture of its node."""
    arch = {n.metadata.name: inspect.node_arch(n) for n in reads.nodes(ctx)}
    return [
        Failing(pod, problem, arch.get(pod.spec.node_name or "", ""))
        for pod in scoped_pods(ctx)
        for problem in inspect.container_problems(pod)
    ]


def is_wrong_arch(failing: Failing) -> bool:
    """An exec format error, or a crash loop on a non-amd64 node the pod was not built for."""
    if failing.problem.exec_format_error:
        return True
    arch = failing.node_arch
    return (
        failing.problem.crash_looping
        and bool(arch)
        and arch != DEFAULT_ARCH
        and arch not in inspect.pinned_arch(failing.pod)
    )


def pod_log(
    ctx: RunContext, pod: Any, container: str, *, previous: bool = False, tail_lines: int
) -> str:
    """A container's log tail through the pod-log seam; '' when there is none or it is unreadable."""
    from hpkv.errors import HpkvError
    from hpkv.kube import podlogs

    namespace, name = pod.metadata.namespace, pod.metadata.name
    try:
        text = podlogs.read_log(
            ctx.kube, namespace, name, container, previous=previous, tail_lines=tail_lines
        )
    except HpkvError:
        return ""
    return text or ""


def previous_log_tail(ctx: RunContext, pod: Any, container: str, lines: int = 5) -> str:
    """The last lines of a container's previous instance (redacted, one line), or ''."""
    text = pod_log(ctx, pod, container, previous=True, tail_lines=lines)
    tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return redact_text(" | ".join(tail))[:400]


# --- cluster -------------------------------------------------------------------------------------
def _not_in_service(ctx: RunContext, detector: Detector) -> list[Finding]:
    cluster = reads.hyperpod_cluster(ctx)
    status = cluster.get("ClusterStatus", "unknown")
    if status == "InService":
        return []
    name = cluster.get("ClusterName", ctx.settings.cluster)
    evidence = f"cluster '{name}' is {status}"
    if cluster.get("FailureMessage"):
        evidence += f": {cluster['FailureMessage']}"
    if status in ("Failed", "Deleting", "RollingBack"):
        severity = Severity.CRITICAL
        fix = (
            "see the cluster's events in the SageMaker console and the lifecycle-script logs in "
            f"CloudWatch (/aws/sagemaker/Clusters/{name}/...); UpdateCluster is refused until "
            "it is InService"
        )
    else:
        severity = Severity.WARNING
        fix = (
            "wait for InService (UpdateCluster is refused meanwhile); hpkv commands that change "
            "the cluster wait for it with --wait"
        )
    return [detector.finding(severity, evidence, fix, [f"sagemaker cluster/{name}"])]


# --- pods ----------------------------------------------------------------------------------------
def _crash_looping(ctx: RunContext, detector: Detector) -> list[Finding]:
    failing = [
        f for f in failing_containers(ctx) if f.problem.crash_looping and not is_wrong_arch(f)
    ]
    findings = []
    for workload, items in inspect.group_by(failing, lambda f: inspect.owner(f.pod)).items():
        pods = sorted({inspect.pod_key(f.pod) for f in items})
        first = items[0]
        details = "; ".join(f.problem.describe() for f in items[:3])
        tail = previous_log_tail(ctx, first.pod, first.problem.container)
        evidence = f"{workload}: {len(pods)} pod(s) crash-looping: {details}"
        if tail:
            evidence += f"; last log lines: {tail}"
        ns, name = first.pod.metadata.namespace, first.pod.metadata.name
        findings.append(
            detector.finding(
                Severity.CRITICAL,
                evidence,
                f"read why it exits: kubectl -n {ns} logs {name} -c {first.problem.container} "
                f"--previous; then kubectl -n {ns} describe pod {name}",
                [workload, *(f"Pod/{p}" for p in pods)],
                title=f"{workload} is crash-looping",
            )
        )
    return findings


def _wrong_architecture(ctx: RunContext, detector: Detector) -> list[Finding]:
    failing = [f for f in failing_containers(ctx) if is_wrong_arch(f)]
    findings = []
    for workload, items in inspect.group_by(failing, lambda f: inspect.owner(f.pod)).items():
        arches = sorted({f.node_arch or "unknown" for f in items})
        pods = sorted({inspect.pod_key(f.pod) for f in items})
        details = "; ".join(
            f"{f.problem.describe()} on node {f.pod.spec.node_name} ({f.node_arch or '?'})"
            for f in items[:3]
        )
        findings.append(
            detector.finding(
                Severity.CRITICAL,
                f"{workload}: {details}",
                f"its image has no {'/'.join(arches)} build: keep it on {DEFAULT_ARCH} nodes "
                f"with a required nodeAffinity on {inspect.ARCH_LABEL} In [{DEFAULT_ARCH}] (the "
                "inference operator chart does this from v3.2), or use a multi-arch image",
                [workload, *(f"Pod/{p}" for p in pods)],
                title=f"{workload} crashes on {'/'.join(arches)} nodes",
            )
        )
    return findings


def _image_pull(ctx: RunContext, detector: Detector) -> list[Finding]:
    failing = [f for f in failing_containers(ctx) if f.problem.image_pull]
    findings = []
    for image, items in inspect.group_by(failing, lambda f: f.problem.image).items():
        pods = sorted({inspect.pod_key(f.pod) for f in items})
        first = items[0].problem
        message = " ".join(first.message.split())[:300]
        findings.append(
            detector.finding(
                Severity.CRITICAL,
                f"{first.reason} for image {image} in {len(pods)} pod(s) "
                f"({', '.join(pods[:5])}){': ' + message if message else ''}",
                image_pull_fix(image),
                [f"Pod/{p}" for p in pods],
                title=f"image {image} cannot be pulled",
            )
        )
    return findings


def image_pull_fix(image: str) -> str:
    if image.startswith("quay.io/k8scsi/"):
        name = image.split("/")[-1].split(":")[0]
        return (
            "the quay.io/k8scsi CSI sidecar images are no longer published: override them with "
            f"registry.k8s.io/sig-storage/{name} (e.g. csi-provisioner:v5.0.1, "
            "csi-node-driver-registrar:v2.13.0) in the CSI chart's values"
        )
    if ".dkr.ecr." in image:
        return (
            "check the tag exists in that ECR repository and region, and that the node role may "
            "pull from it (ecr:GetAuthorizationToken, ecr:BatchGetImage)"
        )
    return (
        "check the image name and tag, and that the nodes can reach the registry (kubectl "
        "describe pod shows the pull error); private registries need imagePullSecrets"
    )


# --- storage -------------------------------------------------------------------------------------
def _pvc_pending(ctx: RunContext, detector: Detector) -> list[Finding]:
    wanted = set(scope_namespaces(ctx))
    pending = [
        p
        for p in reads.pvcs(ctx)
        if p.metadata.namespace in wanted and (p.status.phase if p.status else None) == "Pending"
    ]
    if not pending:
        return []
    classes = {sc.metadata.name: sc for sc in reads.storage_classes(ctx)}
    now = datetime.datetime.now(datetime.UTC)
    findings = []
    for pvc in pending:
        reasons = pending_reasons(ctx, pvc, classes, now)
        if not reasons:
            continue
        key = f"{pvc.metadata.namespace}/{pvc.metadata.name}"
        sc = classes.get(pvc.spec.storage_class_name or "")
        curvine = sc is not None and sc.provisioner == "curvine"
        findings.append(
            detector.finding(
                Severity.CRITICAL,
                f"PersistentVolumeClaim {key} is Pending: " + "; ".join(reasons),
                (
                    "master-addrs must name every master pod's RPC port through the headless "
                    "Service (curvine-master-0.curvine-master.<ns>.svc.cluster.local:8995); "
                    "StorageClass parameters are immutable: 'hpkv curvine apply' re-creates "
                    "the class from hpkv.yaml, then delete and re-create the claim; "
                    if curvine
                    else "fix the StorageClass (name, provisioner and its parameters) or start "
                    "its provisioner; "
                )
                + f"kubectl -n {pvc.metadata.namespace} describe pvc "
                f"{pvc.metadata.name} shows the provisioner's events",
                [f"PersistentVolumeClaim/{key}"],
                title=f"PVC {key} stuck Pending",
            )
        )
    return findings


def pending_reasons(
    ctx: RunContext, pvc: Any, classes: dict[str, Any], now: datetime.datetime
) -> list[str]:
    """Why a Pending claim will not bind ([] while it is merely young or waits for a consumer)."""
    reasons: list[str] = []
    name = pvc.spec.storage_class_name
    sc = classes.get(name) if name else _default_class(classes)
    if name and sc is None:
        reasons.append(f"StorageClass '{name}' does not exist")
    elif not name and sc is None:
        reasons.append("it names no StorageClass and none is marked default")
    waits_for_consumer = sc is not None and sc.volume_binding_mode == "WaitForFirstConsumer"
    if sc is not None:
        reasons.extend(storage_class_problems(ctx, sc))
    warnings = [
        f"{e.reason}: {' '.join((e.message or '').split())[:300]}"
        for e in reads.events(ctx, pvc.metadata.namespace)
        if e.type == "Warning"
        and e.involved_object is not None
        and e.involved_object.kind == "PersistentVolumeClaim"
        and e.involved_object.name == pvc.metadata.name
    ]
    reasons.extend(warnings[-3:])
    created = pvc.metadata.creation_timestamp
    if not reasons and created is not None and now - created >= PENDING_GRACE:
        if waits_for_consumer and not _has_consumer(ctx, pvc):
            return []  # binds when a pod uses it: not a problem
        minutes = int((now - created).total_seconds() // 60)
        provisioner = sc.provisioner if sc is not None else "?"
        reasons.append(
            f"Pending for {minutes} minutes without events (is the {provisioner} provisioner "
            "running?)"
        )
    return reasons


def storage_class_problems(ctx: RunContext, sc: Any) -> list[str]:
    """Known mistakes in a StorageClass; today Curvine's ``master-addrs`` (with stage 3's
    knowledge of what it must name: the master pods' RPC port through the headless Service)."""
    from hpkv.stages.curvine.values import CURVINE_PROVISIONER

    if sc.provisioner != CURVINE_PROVISIONER:
        return []
    params = sc.parameters or {}
    addrs = params.get("master-addrs")
    if not addrs:
        return [f"StorageClass '{sc.metadata.name}' (curvine) has no master-addrs parameter"]
    services = {(s.metadata.namespace, s.metadata.name) for s in reads.services(ctx)}
    bad = [
        addr
        for addr in addrs.split(",")
        if (target := _service_of(addr.strip())) is not None and target not in services
    ]
    if bad:
        return [
            f"StorageClass '{sc.metadata.name}' master-addrs {', '.join(bad)} name(s) no "
            "existing Service"
        ]
    managed = (sc.metadata.labels or {}).get("app.kubernetes.io/managed-by") == "hpkv"
    return _curvine_master_problems(ctx, managed, [a.strip() for a in addrs.split(",")])


def _curvine_master_problems(ctx: RunContext, hpkv_class: bool, addrs: list[str]) -> list[str]:
    from hpkv.config import deep_merge
    from hpkv.stages.curvine.values import (
        CONFIG_DEFAULTS,
        MASTER_RPC_PORT,
        MASTER_WEB_PORT,
        dig,
        master_addrs,
    )

    cfg = deep_merge(CONFIG_DEFAULTS, ctx.settings.section("curvine"))
    rpc = int(dig(cfg, "extraValues", "master", "rpcPort", default=MASTER_RPC_PORT))
    problems = []
    pods = {(p.metadata.namespace, p.metadata.name): p for p in reads.pods(ctx)}
    for addr in addrs:
        host, _, port = addr.partition(":")
        if port and port != str(rpc):
            web = " (that is its web port)" if port == str(MASTER_WEB_PORT) else ""
            problems.append(
                f"master-addrs {addr}: port {port} is not the master's RPC port {rpc}{web}"
            )
        labels = host.split(".")
        if "svc" in labels and labels.index("svc") == 3:  # <pod>.<service>.<namespace>.svc...
            pod = pods.get((labels[2], labels[0]))
            if pod is None:
                problems.append(
                    f"master-addrs {addr}: master pod {labels[2]}/{labels[0]} does not exist"
                )
            elif not inspect.pod_ready(pod):
                problems.append(
                    f"master-addrs {addr}: master pod {labels[2]}/{labels[0]} is not Ready"
                )
    if hpkv_class:  # made by 'hpkv curvine apply': compare with what hpkv.yaml asks for now
        expected = master_addrs(
            cfg["release"],
            cfg["namespace"],
            cfg["masterReplicas"],
            domain=cfg["clusterDomain"],
            port=rpc,
        )
        if ",".join(addrs) != expected:
            problems.append(f"hpkv.yaml's curvine section expects master-addrs {expected}")
    return problems


def _service_of(address: str) -> tuple[str, str] | None:
    """(namespace, service) named by host[:port] in cluster DNS form, else None."""
    labels = address.split(":")[0].split(".")
    if "svc" not in labels or labels.index("svc") < 2:
        return None
    at = labels.index("svc")
    return labels[at - 1], labels[at - 2]


def _default_class(classes: dict[str, Any]) -> Any:
    for sc in classes.values():
        annotations = sc.metadata.annotations or {}
        if annotations.get("storageclass.kubernetes.io/is-default-class") == "true":
            return sc
    return None


def _has_consumer(ctx: RunContext, pvc: Any) -> bool:
    for pod in reads.pods(ctx):
        if pod.metadata.namespace != pvc.metadata.namespace:
            continue
        for volume in pod.spec.volumes or []:
            claim = volume.persistent_volume_claim
            if claim is not None and claim.claim_name == pvc.metadata.name:
                return True
    return False


# --- LMCache -------------------------------------------------------------------------------------
def lmcache_containers(ctx: RunContext) -> list[tuple[Any, Any, dict[str, str | None]]]:
    """(pod, container, literal env) of every container configured for LMCache (LMCACHE_* env)."""

    def load() -> list[tuple[Any, Any, dict[str, str | None]]]:
        found = []
        for pod in reads.pods(ctx):
            for container in pod.spec.containers:
                env = inspect.container_env(container)
                if any(name.startswith("LMCACHE_") for name in env):
                    found.append((pod, container, env))
        return found

    return ctx.memo("health:lmcache-containers", load)


def scan_logs(
    ctx: RunContext, targets: Iterable[tuple[Any, str]], pattern: re.Pattern[str]
) -> list[tuple[Any, str, str]]:
    """(pod, container, first matching line) for each target whose current log matches."""

    def scan(pod: Any, container: str) -> tuple[Any, str, str] | None:
        for line in pod_log(ctx, pod, container, tail_lines=LOG_SCAN_LINES).splitlines():
            if pattern.search(line):
                return pod, container, redact_text(line.strip())[:300]
        return None

    calls = [lambda p=pod, c=name: scan(p, c) for pod, name in targets]
    return [hit for hit in fan_out(calls) if hit is not None]


def _degraded_mode(ctx: RunContext, detector: Detector) -> list[Finding]:
    hits = scan_logs(ctx, [(pod, c.name) for pod, c, _env in lmcache_containers(ctx)], DEGRADED)
    findings = []
    for workload, items in inspect.group_by(hits, lambda hit: inspect.owner(hit[0])).items():
        pod, container, line = items[0]
        findings.append(
            detector.finding(
                Severity.WARNING,
                f"{workload}: {len(items)} pod(s) log LMCache degraded mode; e.g. "
                f"{inspect.pod_key(pod)} container {container}: {line}",
                "LMCache failed to start its cache and vLLM recomputes every prefix: read the "
                f"lines before it (kubectl -n {pod.metadata.namespace} logs "
                f"{pod.metadata.name} -c {container}); with the HyperPod L1 backend the "
                "ai-toolkit DaemonSet must be ready on the node ('hpkv tiered-storage status'), "
                "with the fs L2 the Curvine volume must be mounted",
                [workload, *(f"Pod/{inspect.pod_key(hit[0])}" for hit in items)],
                title=f"{workload}: LMCache in degraded mode",
            )
        )
    return findings


def _cachegen_fs(ctx: RunContext, detector: Detector) -> list[Finding]:
    hits = [
        (pod, c)
        for pod, c, env in lmcache_containers(ctx)
        if (env.get("LMCACHE_REMOTE_SERDE") or "").lower() == "cachegen"
        and (env.get("LMCACHE_REMOTE_URL") or "").startswith("fs://")
    ]
    return [
        detector.finding(
            Severity.WARNING,
            f"{workload}: LMCACHE_REMOTE_SERDE=cachegen with LMCACHE_REMOTE_URL=fs://... in "
            f"{len(items)} pod(s); cachegen's serialization is broken under the fs connector",
            "set LMCACHE_REMOTE_SERDE=naive on these pods",
            [workload, *(f"Pod/{inspect.pod_key(pod)}" for pod, _c in items)],
        )
        for workload, items in inspect.group_by(hits, lambda hit: inspect.owner(hit[0])).items()
    ]


def _hash_seed_unset(ctx: RunContext, detector: Detector) -> list[Finding]:
    hits = [
        (pod, c)
        for pod, c, env in lmcache_containers(ctx)
        if env.get("LMCACHE_REMOTE_URL") and env.get("PYTHONHASHSEED", "random") == "random"
    ]
    return [
        detector.finding(
            Severity.WARNING,
            f"{workload}: {len(items)} pod(s) use a shared LMCache backend "
            "(LMCACHE_REMOTE_URL) without a fixed PYTHONHASHSEED, so each process hashes "
            "prefixes differently and no pod finds another's cache entries (0 cross-pod hits)",
            "set the same PYTHONHASHSEED (e.g. 0) on every pod that shares the cache",
            [workload, *(f"Pod/{inspect.pod_key(pod)}" for pod, _c in items)],
        )
        for workload, items in inspect.group_by(hits, lambda hit: inspect.owner(hit[0])).items()
    ]


REPLICA_FIELDS: dict[str, Callable[[Any, dict[str, str | None]], str | None]] = {
    "PYTHONHASHSEED": lambda c, env: env.get("PYTHONHASHSEED"),
    "LMCACHE_CHUNK_SIZE": lambda c, env: env.get("LMCACHE_CHUNK_SIZE"),
    "model": lambda c, env: vllm_arg(c, "--model", positional_after="serve"),
    "tensor-parallel-size": lambda c, env: vllm_arg(c, "--tensor-parallel-size", "-tp"),
}


def vllm_arg(container: Any, *names: str, positional_after: str | None = None) -> str | None:
    """A vLLM command-line value (``--name value`` or ``--name=value``), else None."""
    tokens = [*(container.command or []), *(container.args or [])]
    for i, token in enumerate(tokens):
        for name in names:
            if token == name and i + 1 < len(tokens):
                return tokens[i + 1]
            if token.startswith(name + "="):
                return token.split("=", 1)[1]
    if positional_after and positional_after in tokens:
        at = tokens.index(positional_after)
        if at + 1 < len(tokens) and not tokens[at + 1].startswith("-"):
            return tokens[at + 1]
    return None


def _replica_mismatch(ctx: RunContext, detector: Detector) -> list[Finding]:
    findings = []
    groups = inspect.group_by(lmcache_containers(ctx), lambda hit: inspect.owner(hit[0]))
    for workload, items in groups.items():
        differing = []
        for label, read in REPLICA_FIELDS.items():
            values = {inspect.pod_key(pod): read(c, env) for pod, c, env in items}
            if len(set(values.values())) > 1:
                shown = ", ".join(f"{pod}={value}" for pod, value in sorted(values.items())[:4])
                differing.append(f"{label} differs ({shown})")
        if differing:
            findings.append(
                detector.finding(
                    Severity.WARNING,
                    f"{workload}: " + "; ".join(differing) + "; replicas that differ here "
                    "write and look up different cache keys",
                    "roll every replica onto one pod template (kubectl rollout status; delete "
                    "stale pods left by a patch) so all share the same values",
                    [workload, *sorted(f"Pod/{inspect.pod_key(p)}" for p, _c, _e in items)],
                )
            )
    return findings


# --- routing -------------------------------------------------------------------------------------
def _routing_https(ctx: RunContext, detector: Detector) -> list[Finding]:
    hits: list[tuple[str, str]] = []
    for pod in reads.pods(ctx):
        for container in pod.spec.containers:
            texts = [
                *(f"env {e.name}={e.value}" for e in container.env or [] if e.value),
                *(f"arg {a}" for a in [*(container.command or []), *(container.args or [])]),
            ]
            for text in texts:
                if ROUTING_HTTPS.search(text):
                    hits.append(
                        (f"Pod/{inspect.pod_key(pod)}", f"container {container.name} {text}")
                    )
    for cm in reads.config_maps(ctx):
        for key, value in (cm.data or {}).items():
            match = ROUTING_HTTPS.search(value or "")
            if match:
                hits.append(
                    (
                        f"ConfigMap/{cm.metadata.namespace}/{cm.metadata.name}",
                        f"{key}: {match.group(0)}",
                    )
                )
    findings = []
    for obj, items in inspect.group_by(hits, lambda hit: hit[0]).items():
        shown = "; ".join(redact_text(text)[:200] for _o, text in items[:3])
        findings.append(
            detector.finding(
                Severity.WARNING,
                f"{obj}: {shown}; the routing service listens on 443 but speaks plain HTTP, so "
                "https:// fails with 'SSL: WRONG_VERSION_NUMBER'",
                "call it as http://<name>-routing-service.<namespace>:443 instead",
                [obj],
            )
        )
    return findings
