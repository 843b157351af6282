"""``hpkv init``: discover the cluster and write a commented ``hpkv.yaml``.

Discovered (reads only): the AWS identity (STS GetCallerIdentity) and region, the HyperPod clusters
(SageMaker ListClusters), the EKS cluster behind the chosen one (DescribeCluster), a kubeconfig
context pointing at it (the same lookup every command uses), and the GPU nodes (SageMaker
ListClusterNodes, cross-checked with the Kubernetes nodes when they can be read). The CLI asks
only what this cannot settle: the region when none is configured, the cluster when there are
several, and the stage settings without a discoverable value.
"""

from __future__ import annotations

import datetime
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from hpkv.errors import HpkvError, UsageError

if TYPE_CHECKING:
    from hpkv.config import Settings
    from hpkv.context import RunContext

# Stage settings 'hpkv init' asks on a terminal when the cluster does not answer them:
# "section.key" -> (question, default). Add a line when a stage has a setting worth asking.
QUESTIONS: dict[str, tuple[str, Any]] = {
    "tieredStorage.memoryPercent": ("Share of instance memory for the L1 CPU tier, in %", 20),
}

GPU_LABEL = "nvidia.com/gpu"


@dataclass
class Account:
    region: str
    account: str
    caller: str
    clusters: list[dict[str, Any]]

    @property
    def cluster_names(self) -> list[str]:
        return [c["ClusterName"] for c in self.clusters]

    def default_cluster(self) -> str | None:
        """The cluster to use without asking: the only one, or the only one InService."""
        if len(self.clusters) == 1:
            return self.clusters[0]["ClusterName"]
        in_service = [c for c in self.clusters if c.get("ClusterStatus") == "InService"]
        return in_service[0]["ClusterName"] if len(in_service) == 1 else None


@dataclass
class ClusterFacts:
    name: str
    status: str
    node_recovery: str | None
    tiered_storage: dict[str, Any]
    eks_name: str | None
    eks_version: str | None
    node_types: dict[str, int]  # instance type -> count, from ListClusterNodes
    context: str | None = None
    kubeconfig: str | None = None
    kube_access: str = ""  # how hpkv reaches the Kubernetes API
    kube_gpu_nodes: int | None = None
    kube_gpus: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def gpu_types(self) -> dict[str, int]:
        return {t: n for t, n in self.node_types.items() if is_gpu_type(t)}

    @property
    def main_gpu_type(self) -> str | None:
        types = self.gpu_types
        return max(sorted(types), key=lambda t: types[t]) if types else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.name,
            "status": self.status,
            "nodeRecovery": self.node_recovery,
            "tieredStorage": self.tiered_storage,
            "eks": {"name": self.eks_name, "version": self.eks_version},
            "nodeTypes": self.node_types,
            "gpuNodes": sum(self.gpu_types.values()),
            "context": self.context,
            "kubernetesAccess": self.kube_access,
            "kubernetesGpuNodes": self.kube_gpu_nodes,
            "kubernetesGpus": self.kube_gpus,
            "notes": list(self.notes),
        }


def is_gpu_type(instance_type: str) -> bool:
    from hpkv.sizing.catalog import BUILTIN_INSTANCE_TYPES

    if instance_type in BUILTIN_INSTANCE_TYPES:
        return True
    return instance_type.removeprefix("ml.")[:1] in ("g", "p")  # ml.g5, ml.g6e, ml.p4d, ml.p5


def gpus_per_node(instance_type: str) -> int:
    from hpkv.sizing.catalog import BUILTIN_INSTANCE_TYPES

    known = BUILTIN_INSTANCE_TYPES.get(instance_type)
    return known.gpus if known else 1


def discover_account(ctx: RunContext) -> Account:
    """Region, identity and the region's HyperPod clusters."""
    from hpkv.aws import sagemaker

    region = ctx.aws.region
    identity = ctx.aws.caller_identity()
    clusters = sagemaker.list_clusters(ctx.aws)
    return Account(
        region=region,
        account=str(identity.get("Account", "")),
        caller=str(identity.get("Arn", "")),
        clusters=clusters,
    )


def discover_cluster(ctx: RunContext, name: str) -> ClusterFacts:
    """The cluster's EKS orchestrator, nodes and a way to reach its Kubernetes API."""
    from hpkv.aws import eks, sagemaker

    cluster = sagemaker.describe_cluster(ctx.aws, name)
    eks_name = sagemaker.eks_cluster_name(cluster)
    facts = ClusterFacts(
        name=name,
        status=str(cluster.get("ClusterStatus", "unknown")),
        node_recovery=cluster.get("NodeRecovery"),
        tiered_storage=dict(cluster.get("TieredStorageConfig") or {}),
        eks_name=eks_name,
        eks_version=None,
        node_types=_node_types(ctx, name),
    )
    if eks_name is None:
        facts.notes.append(
            f"'{name}' is not orchestrated by EKS; hpkv supports EKS-orchestrated clusters only"
        )
        return facts
    facts.eks_version = eks.describe_cluster(ctx.aws, eks_name).get("version")
    _discover_kubernetes(ctx, facts)
    return facts


def _node_types(ctx: RunContext, name: str) -> dict[str, int]:
    from hpkv.aws import translate_errors

    with translate_errors(f"sagemaker:ListClusterNodes on '{name}'"):
        paginator = ctx.aws.sagemaker.get_paginator("list_cluster_nodes")
        counts: Counter[str] = Counter(
            node["InstanceType"]
            for page in paginator.paginate(ClusterName=name)
            for node in page.get("ClusterNodeSummaries", [])
        )
    return dict(sorted(counts.items()))


def _discover_kubernetes(ctx: RunContext, facts: ClusterFacts) -> None:
    """Find the context hpkv would use and count GPU nodes; tolerate no access (a note)."""
    from hpkv.config import Settings
    from hpkv.kube import KubeClients, kube_errors

    settings = Settings(data={**ctx.settings.data, "cluster": facts.name})
    kube = KubeClients(settings, aws=lambda: ctx.aws, reporter=ctx.reporter)
    try:
        kube.api_client  # noqa: B018 - resolves the context or EKS token auth
        if kube.token_auth:
            facts.kube_access = "EKS token from your AWS credentials (no kubeconfig context)"
            facts.notes.append(
                f"no kubeconfig context points at EKS cluster {facts.eks_name}; hpkv "
                "authenticates with your AWS credentials instead"
            )
        else:
            facts.context, facts.kubeconfig = kube.context_name, kube.kubeconfig_path
            facts.kube_access = f"kubeconfig context '{kube.context_name}'"
        with kube_errors("list the cluster's nodes"):
            nodes = kube.core.list_node().items
    except HpkvError as exc:
        facts.notes.append(f"could not read the Kubernetes nodes: {exc.one_line()}")
        return
    gpu_counts = [_gpus(n) for n in nodes]
    facts.kube_gpu_nodes = sum(1 for g in gpu_counts if g > 0)
    facts.kube_gpus = sum(gpu_counts)
    listed = sum(facts.gpu_types.values())
    if facts.kube_gpu_nodes != listed:
        facts.notes.append(
            f"Kubernetes shows {facts.kube_gpu_nodes} GPU node(s), ListClusterNodes {listed}: "
            "nodes may still be joining"
        )


def _gpus(node: Any) -> int:
    capacity = (node.status.capacity or {}) if node.status else {}
    try:
        return int(capacity.get(GPU_LABEL, 0))
    except (TypeError, ValueError):
        return 0


def configured_region(settings: Settings) -> str | None:
    """The region from flags/env/hpkv.yaml, else the AWS profile's or AWS_REGION (no API call)."""
    if settings.region:
        return settings.region
    import boto3
    import botocore.exceptions

    try:
        return boto3.Session(profile_name=settings.profile or None).region_name
    except botocore.exceptions.ProfileNotFound:
        raise UsageError(
            f"AWS profile '{settings.profile}' is not in your AWS config files",
            fix="pass an existing --profile (see 'aws configure list-profiles')",
        ) from None


# --- writing hpkv.yaml --------------------------------------------------------------------------
@dataclass
class InitAnswers:
    """What goes into hpkv.yaml besides the discovered facts."""

    profile: str | None = None
    kubeconfig: str | None = None
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)


def stage_sections() -> list[tuple[str, Any, dict[str, Any], dict[str, Any]]]:
    """(section, stage class, schema, defaults) for each registered stage with a config section."""
    import importlib

    from hpkv.config.schema import SECTION_MODULES
    from hpkv.stages import STAGES, stage_class

    by_module = {module: section for section, module in SECTION_MODULES.items()}
    found = []
    for name, module, _cls in STAGES:
        section = by_module.get(module)
        if section is None:
            continue
        mod = importlib.import_module(module)
        found.append((section, stage_class(name), mod.CONFIG_SCHEMA, mod.CONFIG_DEFAULTS))
    return found


def discovered_section_values(facts: ClusterFacts) -> dict[str, dict[str, Any]]:
    """Stage settings the cluster already answers (e.g. tiered storage enabled at 30%)."""
    values: dict[str, dict[str, Any]] = {}
    tiered = facts.tiered_storage
    percent = tiered.get("InstanceMemoryAllocationPercentage")
    if str(tiered.get("Mode", "")).lower() == "enable" and isinstance(percent, int):
        from hpkv.stages.tiered_storage import MAX_PERCENT, MIN_PERCENT

        if MIN_PERCENT <= percent <= MAX_PERCENT:
            values["tieredStorage"] = {"memoryPercent": percent}
    return values


def render_config(account: Account, facts: ClusterFacts, answers: InitAnswers) -> str:
    """The commented hpkv.yaml text. Every key has a comment saying what it is and its variable."""
    today = datetime.date.today().isoformat()
    others = [n for n in account.cluster_names if n != facts.name]
    groups = ", ".join(f"{n} x {t}" for t, n in facts.node_types.items()) or "no nodes listed"
    lines = [
        f"# hpkv.yaml, written by 'hpkv init' on {today} from what AWS and Kubernetes reported.",
        "# Precedence: command-line flags > HPKV_* environment variables > this file > defaults.",
        "# Check it with 'hpkv up --dry-run'; 'hpkv init --force' rewrites it.",
        "",
        "# HyperPod cluster hpkv operates on (--cluster, HPKV_CLUSTER).",
        f"# Found: {facts.status}, EKS cluster {facts.eks_name or 'none'}"
        + (f" (Kubernetes {facts.eks_version})" if facts.eks_version else "")
        + f", {groups}.",
    ]
    if others:
        lines.append(f"# Other HyperPod clusters in {account.region}: {', '.join(others)}.")
    lines += [
        _kv("cluster", facts.name),
        "",
        f"# AWS region of the cluster (--region, HPKV_REGION). Caller: {account.caller or '?'}.",
        _kv("region", account.region),
        "",
        "# AWS profile for credentials (--profile, HPKV_PROFILE); unset: the default chain.",
        _kv("profile", answers.profile) if answers.profile else "# profile: default",
        "",
        "# Kubeconfig file (--kubeconfig, HPKV_KUBECONFIG); unset: KUBECONFIG, then ~/.kube/config.",
        _kv("kubeconfig", answers.kubeconfig)
        if answers.kubeconfig
        else "# kubeconfig: ~/.kube/config",
        "",
        "# Kubeconfig context for the cluster's EKS API (--context, HPKV_CONTEXT); unset: the",
        "# context pointing at the EKS endpoint, else a token from your AWS credentials.",
    ]
    if facts.context:
        lines += [f"# Found: {facts.kube_access}.", _kv("context", facts.context)]
    else:
        reason = facts.kube_access or "no context points at the EKS cluster"
        lines += [f"# Found: {reason}.", "# context: my-eks-context"]
    lines += [
        "",
        "# Output format of every command: table, json or yaml (-o, HPKV_OUTPUT).",
        "# output: table",
        "",
        "# Limit for each wait: 900, 90s, 15m, 1h (--timeout, HPKV_TIMEOUT).",
        "# timeout: 30m",
        "",
        "# Path of the helm binary (HPKV_HELM); unset: helm on PATH.",
        "# helm: /usr/local/bin/helm",
    ]
    discovered = discovered_section_values(facts)
    for section, cls, schema, defaults in stage_sections():
        chosen = {**discovered.get(section, {}), **answers.sections.get(section, {})}
        values = {**defaults, **chosen}
        lines += ["", f"# Stage {cls.number}: {cls.title} ('hpkv {cls.name}', 'hpkv up')."]
        if not chosen:
            lines.append("# Defaults, documented here and not set: uncomment a key to change it.")
        section_lines = _section_lines(
            section, schema, values, [section], found=discovered.get(section), chosen=set(chosen)
        )
        lines += section_lines if chosen else [_commented(section_lines[0]), *section_lines[1:]]
    lines += ["", *_sizing_lines(facts)]
    return "\n".join(lines) + "\n"


def _kv(key: str, value: Any, indent: str = "") -> str:
    text = yaml.safe_dump({key: value}, default_flow_style=True, width=1000).strip()
    return indent + text.removeprefix("{").removesuffix("}")


def _env(path: list[str]) -> str:
    from hpkv.config.schema import _env_name

    return _env_name(path)


def _section_lines(
    section: str,
    schema: dict[str, Any],
    values: dict[str, Any],
    path: list[str],
    *,
    found: dict[str, Any] | None = None,
    chosen: set[str] | None = None,
    indent: str = "",
) -> list[str]:
    """The section's keys, each under its description; a key not in ``chosen`` (when given) is
    written commented out: documented with its default, not set, so later defaults still apply."""
    lines = [f"{indent}{section}:"]
    inner = indent + "  "
    props = schema.get("properties", {})
    for key, value in values.items():
        sub = props.get(key, {})
        description = sub.get("description") or key
        note = " (found on the cluster)" if found and key in found else ""
        lines.append(f"{inner}# {description}{note} ({_env([*path, key])})")
        if isinstance(value, dict) and value:
            block = _section_lines(key, sub, value, [*path, key], indent=inner)
        else:
            block = [_kv(key, value, inner)]
        if chosen is not None and key not in chosen:
            block = [_commented(line) for line in block]
        lines += block
    return lines


def _commented(line: str) -> str:
    """A YAML line turned into a comment at the same indentation (comments stay as they are)."""
    stripped = line.lstrip()
    if stripped.startswith("#"):
        return line
    return f"{line[: len(line) - len(stripped)]}# {stripped}"


def _sizing_lines(facts: ClusterFacts) -> list[str]:
    from hpkv.sizing.catalog import BUILTIN_INSTANCE_TYPES

    lines = ["# Defaults of 'hpkv plan' and 'hpkv simulate', from the cluster's GPU nodes."]
    gpu_type = facts.main_gpu_type
    if gpu_type is None:
        return [*lines, "# (no GPU nodes found; sizing keeps its defaults)"]
    count = facts.gpu_types[gpu_type]
    replicas = count * gpus_per_node(gpu_type)
    lines.append("sizing:")
    lines.append(
        f"  # GPU instance type of the inference nodes, found {count} x {gpu_type} "
        "(HPKV_SIZING__INSTANCE_TYPE)"
    )
    if gpu_type in BUILTIN_INSTANCE_TYPES:
        lines.append(_kv("instanceType", gpu_type, "  "))
    else:
        lines.append(
            f"  # not in hpkv's catalog: describe it under sizing.instanceTypes.{gpu_type}"
        )
        lines.append(f"  # instanceType: {gpu_type}")
    lines.append("  # vLLM replicas, one per GPU at tensor parallel 1 (HPKV_SIZING__REPLICAS)")
    lines.append(_kv("replicas", max(1, replicas), "  "))
    return lines
