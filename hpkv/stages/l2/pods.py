"""Reading pods: what a pod's spec says about its L2 wiring, what is wrong with it, whether replicas
share cache keys, and how stale pods can be re-created without a GPU deadlock."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpkv.stages.base import CheckState
from hpkv.stages.l2.wiring import (
    CHUNK_SIZE_ENV,
    CONFIG_FILE_ENV,
    DEFAULT_CHUNK_SIZE,
    EXTRA_CONFIG_ENV,
    GPU_RESOURCE,
    HASH_SEED_ENV,
    REMOTE_URL_ENV,
    SERDE,
    SERDE_ENV,
    TMP_DIR_KEY,
    WIRING_ANNOTATION,
    Wiring,
    vllm_container_index,
)
from hpkv.topology import EndpointRef


# --- reading pods -------------------------------------------------------------------------------
def env_value(entry: dict[str, Any]) -> str:
    """An env entry's value as text; references are described, not resolved."""
    if "value" in entry:
        return str(entry.get("value") or "")
    source = entry.get("valueFrom") or {}
    for kind, ref in source.items():
        if isinstance(ref, dict):
            where = "/".join(str(ref[k]) for k in ("name", "key", "fieldPath") if ref.get(k))
            return f"<{kind} {where}>"
    return ""


def _flag(tokens: Sequence[str], *names: str) -> str | None:
    for i, token in enumerate(tokens):
        for name in names:
            if token == name and i + 1 < len(tokens):
                return tokens[i + 1]
            if token.startswith(name + "="):
                return token[len(name) + 1 :]
    return None


def vllm_model(command: Sequence[str], args: Sequence[str]) -> str:
    """The --model string vLLM is started with: it is part of every LMCache key."""
    tokens = [*command, *args]
    flag = _flag(tokens, "--model")
    if flag is not None:
        return flag
    if "serve" in tokens:
        after = tokens[tokens.index("serve") + 1 :]
        if after and not after[0].startswith("-"):
            return after[0]
    if args and not args[0].startswith("-"):
        return args[0]  # the operator passes the model location as the first argument
    return "(vLLM default)"


def cache_key_parts(container: dict[str, Any]) -> dict[str, str]:
    """What must be equal on every replica for them to share L2 files."""
    command = [str(t) for t in container.get("command") or []]
    args = [str(t) for t in container.get("args") or []]
    tokens = [*command, *args]
    env = {e.get("name"): env_value(e) for e in container.get("env") or [] if e.get("name")}
    chunk = env.get(CHUNK_SIZE_ENV)
    if chunk is None:
        chunk = (
            f"(from {env[CONFIG_FILE_ENV]})"
            if CONFIG_FILE_ENV in env
            else f"{DEFAULT_CHUNK_SIZE} (default)"
        )
    return {
        HASH_SEED_ENV: env.get(HASH_SEED_ENV, "(unset: random per process)"),
        "--model": vllm_model(command, args),
        "--tensor-parallel-size": _flag(tokens, "--tensor-parallel-size", "-tp") or "1",
        "--pipeline-parallel-size": _flag(tokens, "--pipeline-parallel-size", "-pp") or "1",
        "--kv-cache-dtype": _flag(tokens, "--kv-cache-dtype") or "auto",
        "--dtype": _flag(tokens, "--dtype") or "auto",
        "chunk size": chunk,
    }


@dataclass
class PodWiring:
    """What one pod's spec says about its L2 wiring (and, after probing, what it does)."""

    namespace: str
    name: str
    container: str
    phase: str
    ready: bool
    terminating: bool
    created: str
    fingerprint: str | None
    remote_urls: list[str]
    serdes: list[str]
    seeds: list[str]
    extra_config: str | None
    mount_volume: str | None
    claim_name: str | None
    key_parts: dict[str, str]
    probe: CheckState | None = None
    probe_evidence: str = ""
    log_state: CheckState | None = None
    log_evidence: str = ""

    def wired(self, wiring: Wiring) -> bool:
        return wiring.remote_url in self.remote_urls

    @property
    def tmp_dir(self) -> str | None:
        if not self.extra_config:
            return None
        try:
            data = json.loads(self.extra_config)
        except ValueError:
            return None
        value = data.get(TMP_DIR_KEY) if isinstance(data, dict) else None
        return str(value) if value is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "container": self.container,
            "phase": self.phase,
            "ready": self.ready,
            "terminating": self.terminating,
            "fingerprint": self.fingerprint,
            "remoteUrls": self.remote_urls,
            "mountVolume": self.mount_volume,
            "claimName": self.claim_name,
            "tmpDir": self.tmp_dir,
            "keyParts": self.key_parts,
            "probe": self.probe.value if self.probe else None,
            "logs": self.log_state.value if self.log_state else None,
        }


def inspect_pod(pod: dict[str, Any], endpoint: str, wiring: Wiring) -> PodWiring:
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status") or {}
    containers = spec.get("containers") or []
    container = containers[vllm_container_index(containers, endpoint)] if containers else {}
    env = container.get("env") or []

    def values(name: str) -> list[str]:
        return [env_value(e) for e in env if e.get("name") == name]

    extras = values(EXTRA_CONFIG_ENV)
    mount = next(
        (m for m in container.get("volumeMounts") or [] if m.get("mountPath") == wiring.mount_path),
        None,
    )
    mount_volume = mount.get("name") if mount else None
    volume = next((v for v in spec.get("volumes") or [] if v.get("name") == mount_volume), None)
    claim = ((volume or {}).get("persistentVolumeClaim") or {}).get("claimName")
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return PodWiring(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        container=container.get("name", ""),
        phase=status.get("phase") or "Pending",
        ready=ready,
        terminating=bool(meta.get("deletionTimestamp")),
        created=str(meta.get("creationTimestamp") or ""),
        fingerprint=(meta.get("annotations") or {}).get(WIRING_ANNOTATION),
        remote_urls=values(REMOTE_URL_ENV),
        serdes=values(SERDE_ENV),
        seeds=values(HASH_SEED_ENV),
        extra_config=extras[-1] if extras else None,
        mount_volume=mount_volume,
        claim_name=claim,
        key_parts=cache_key_parts(container),
    )


@dataclass
class Finding:
    state: CheckState
    evidence: str
    remediation: str = ""


def pod_findings(
    pod: PodWiring, wiring: Wiring, ref: EndpointRef, *, mechanism_present: bool
) -> list[Finding]:
    """Everything wrong (or right) with one pod's wiring, worst first."""
    apply_fix = f"run 'hpkv l2 apply --endpoint {ref}' (re-creates stale pods)"
    findings: list[Finding] = []
    if len(pod.remote_urls) > 1:
        findings.append(
            Finding(
                CheckState.FAIL,
                f"{REMOTE_URL_ENV} appears {len(pod.remote_urls)} times "
                f"({', '.join(pod.remote_urls)}); which one LMCache sees is ambiguous",
                "remove LMCACHE_REMOTE_URL from the endpoint's worker.environmentVariables, then "
                + apply_fix,
            )
        )
    if not pod.wired(wiring):
        current = pod.remote_urls[-1] if pod.remote_urls else "unset"
        if mechanism_present:
            findings.append(
                Finding(
                    CheckState.WARN,
                    f"stale: created before the L2 wiring ({REMOTE_URL_ENV}={current})",
                    apply_fix,
                )
            )
        else:
            findings.append(
                Finding(
                    CheckState.WARN,
                    f"not wired to the L2 ({REMOTE_URL_ENV}={current})",
                    f"run 'hpkv l2 apply --endpoint {ref}'",
                )
            )
        return findings
    if pod.mount_volume is None:
        findings.append(
            Finding(
                CheckState.FAIL,
                f"no volume mounted at {wiring.mount_path}: LMCache writes into the container's "
                "own file system, not the shared L2",
                apply_fix,
            )
        )
    elif pod.claim_name != wiring.pvc_name:
        findings.append(
            Finding(
                CheckState.FAIL,
                f"{wiring.mount_path} is backed by "
                + (f"PVC {pod.claim_name}" if pod.claim_name else "a non-PVC volume")
                + f", not the Curvine PVC {wiring.pvc_name}",
                apply_fix,
            )
        )
    if any(s != SERDE for s in pod.serdes):
        findings.append(
            Finding(
                CheckState.FAIL,
                f"{SERDE_ENV}={','.join(pod.serdes)}: only naive works with the fs connector "
                "(cachegen has a zip-serialization bug)",
                apply_fix,
            )
        )
    if not pod.seeds:
        findings.append(
            Finding(
                CheckState.FAIL,
                f"{HASH_SEED_ENV} unset: vLLM seeds its prefix hashes randomly, so replicas never "
                "hit each other's L2 entries",
                apply_fix,
            )
        )
    elif len(pod.seeds) > 1:
        findings.append(
            Finding(CheckState.WARN, f"{HASH_SEED_ENV} appears {len(pod.seeds)} times", apply_fix)
        )
    tmp = pod.tmp_dir
    if tmp is None:
        findings.append(
            Finding(
                CheckState.WARN,
                f"no {TMP_DIR_KEY}: replicas writing the same chunk share one temp file",
                apply_fix,
            )
        )
    elif tmp.startswith("/"):
        findings.append(
            Finding(CheckState.FAIL, f"{TMP_DIR_KEY}={tmp} must be relative", apply_fix)
        )
    if mechanism_present and pod.fingerprint != wiring.fingerprint(ref):
        findings.append(
            Finding(
                CheckState.WARN,
                "stale: created before the current wiring"
                + (f" (wiring {pod.fingerprint})" if pod.fingerprint else ""),
                apply_fix,
            )
        )
    unreachable = "check that you may create pods/exec and read pods/log and that the node's "
    unreachable += "kubelet is reachable, or skip with --no-probe"
    if pod.probe is not None and pod.probe is not CheckState.OK:
        findings.append(
            Finding(
                pod.probe,
                pod.probe_evidence,
                unreachable
                if pod.probe is CheckState.UNKNOWN
                else "check the Curvine FUSE mount on the pod's node ('hpkv curvine status')",
            )
        )
    if pod.log_state is not None and pod.log_state is not CheckState.OK:
        findings.append(
            Finding(
                pod.log_state,
                pod.log_evidence,
                unreachable
                if pod.log_state is CheckState.UNKNOWN
                else "read the vLLM container log; fix LMCache's start-up error, then re-create "
                "the pod",
            )
        )
    findings.sort(key=lambda f: -f.state.severity)
    return findings


def consistency_findings(pods: Sequence[PodWiring]) -> dict[str, dict[str, list[str]]]:
    """Cache-key parts that differ between replicas: part -> value -> pod names."""
    differing: dict[str, dict[str, list[str]]] = {}
    parts = list(dict.fromkeys(k for p in pods for k in p.key_parts))
    for part in parts:
        groups: dict[str, list[str]] = {}
        for pod in pods:
            groups.setdefault(pod.key_parts.get(part, "?"), []).append(pod.name)
        if len(groups) > 1:
            differing[part] = {value: sorted(groups[value]) for value in sorted(groups)}
    return differing


def probe_command(mount_path: str, token: str) -> list[str]:
    """A shell probe: write a file under the mount, read it back, delete it."""
    script = (
        'set -e; d="$1/.hpkv-probe"; mkdir -p "$d"; f="$d/$2"; '
        'printf %s "$2" > "$f"; cat "$f"; rm -f "$f"'
    )
    return ["sh", "-c", script, "hpkv-probe", mount_path, token]


# --- restart strategy ---------------------------------------------------------------------------
def _int_or_percent(value: Any, total: int, *, round_up: bool) -> int:
    if value is None:
        value = "25%"
    text = str(value)
    if text.endswith("%"):
        fraction = total * int(text[:-1]) / 100
        return int(-(-fraction // 1)) if round_up else int(fraction // 1)
    return int(text)


def gpus_per_pod(pod_spec: dict[str, Any]) -> float:
    total = 0.0
    for container in pod_spec.get("containers") or []:
        resources = container.get("resources") or {}
        value = (resources.get("requests") or {}).get(GPU_RESOURCE) or (
            resources.get("limits") or {}
        ).get(GPU_RESOURCE)
        total += float(value or 0)
    return total


def free_gpu_slots(
    nodes: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]], need: float
) -> int:
    """How many pods needing ``need`` GPUs each fit on Ready, schedulable nodes right now."""
    used: dict[str, float] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if node and phase not in ("Succeeded", "Failed"):
            used[node] = used.get(node, 0.0) + gpus_per_pod(pod.get("spec") or {})
    slots = 0
    for node in nodes:
        spec, status = node.get("spec") or {}, node.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        if spec.get("unschedulable") or not ready:
            continue
        capacity = float((status.get("allocatable") or {}).get(GPU_RESOURCE) or 0)
        free = capacity - used.get(node["metadata"]["name"], 0.0)
        slots += int(free // need) if need > 0 else 0
    return slots


def choose_restart(
    deployment: dict[str, Any], nodes: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]]
) -> tuple[str, str]:
    """('rollout' | 'pod-by-pod', why). A surge pod that cannot schedule stalls a rollout."""
    spec = deployment.get("spec") or {}
    replicas = int(spec.get("replicas") if spec.get("replicas") is not None else 1)
    strategy = spec.get("strategy") or {}
    if strategy.get("type") == "Recreate":
        return "rollout", "the Deployment's strategy is Recreate"
    need = gpus_per_pod((spec.get("template") or {}).get("spec") or {})
    if need <= 0:
        return "rollout", "the pods request no GPUs, so a surge pod can schedule"
    rolling = strategy.get("rollingUpdate") or {}
    unavailable = _int_or_percent(rolling.get("maxUnavailable"), replicas, round_up=False)
    if unavailable >= 1:
        return "rollout", f"maxUnavailable allows {unavailable} pod(s) down at a time"
    slots = free_gpu_slots(nodes, pods, need)
    if slots >= 1:
        return "rollout", f"{slots} free slot(s) of {need:g} GPU(s) for surge pods"
    return (
        "pod-by-pod",
        f"no free GPUs for a surge pod ({replicas} replica(s) use them all, maxUnavailable=0): "
        "a rollout would deadlock",
    )


def choose_mechanism(*, admission_policy: bool, kyverno: bool, preference: str = "auto") -> str:
    """The mutation mechanism: 'admission-policy', 'kyverno', or '' when neither can be used."""
    if preference == "admission-policy":
        return "admission-policy" if admission_policy else ""
    if preference == "kyverno":
        return "kyverno" if kyverno else ""
    if admission_policy:
        return "admission-policy"
    return "kyverno" if kyverno else ""
