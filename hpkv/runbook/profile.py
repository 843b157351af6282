"""Cluster profiles: a HyperPod cluster described in a file, for planning with no API call.

``hpkv up --offline --dry-run`` plans every stage for the embedded example profile
(``example-profile.yaml``: cluster 'example', 2 x ml.g6e.4xlarge, EKS 1.33, nothing installed) or
for ``--cluster-profile FILE``. Stages read it through :meth:`Stage.plan_offline`; the
``describe_*`` methods return the same shapes the AWS APIs return, so a stage can feed them to the
code its live ``plan`` uses.
"""

from __future__ import annotations

import copy
import datetime
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpkv.errors import ConfigError

EXAMPLE_PROFILE = Path(__file__).with_name("example-profile.yaml")

_NAME = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": _NAME},
        "region": {"type": "string", "pattern": r"^[a-z]{2}(-gov|-iso[a-z]*)?-[a-z]+-\d$"},
        "account": {"type": "string", "pattern": r"^\d{12}$"},
        "status": {"type": "string"},
        "nodeRecovery": {"type": ["string", "null"], "enum": ["Automatic", "None", None]},
        "tieredStorage": {
            "type": ["object", "null"],
            "additionalProperties": False,
            "required": ["Mode"],
            "properties": {
                "Mode": {"enum": ["Enable", "Disable"]},
                "InstanceMemoryAllocationPercentage": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": 100,
                },
            },
        },
        "instanceGroups": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["instanceType", "count"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "instanceType": {"type": "string", "pattern": r"^ml\."},
                    "count": {"type": "integer", "minimum": 0},
                },
            },
        },
        "eks": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "version": {"type": "string", "pattern": r"^1\.\d+$"},
                "addons": {"type": "array", "items": {"type": "object"}},
            },
        },
        "kubernetes": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "helmReleases": {"type": "array", "items": {"type": "object"}},
                "storageClasses": {"type": "array", "items": {"type": "string"}},
                "namespaces": {"type": "array", "items": {"type": "string"}},
            },
        },
        "endpoints": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                    "namespace": {
                        "type": "string",
                        "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                    },
                    "replicas": {"type": "integer", "minimum": 1},
                },
            },
        },
    },
}


@dataclass
class ClusterProfile:
    """A HyperPod cluster as a file describes it (see ``example-profile.yaml``)."""

    name: str
    region: str
    account: str
    status: str
    node_recovery: str | None
    tiered_storage: dict[str, Any] | None
    instance_groups: list[dict[str, Any]]
    eks_name: str
    eks_version: str
    addons: list[dict[str, Any]] = field(default_factory=list)
    helm_releases: list[dict[str, Any]] = field(default_factory=list)
    storage_classes: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    # InferenceEndpointConfigs deployed once the operator runs: {name, namespace, replicas}
    endpoints: list[dict[str, Any]] = field(default_factory=list)
    source: str = "the embedded example profile"

    # --- API-shaped views -----------------------------------------------------------------------
    @property
    def arn(self) -> str:
        return f"arn:aws:sagemaker:{self.region}:{self.account}:cluster/{self.name.lower()}"

    @property
    def eks_arn(self) -> str:
        return f"arn:aws:eks:{self.region}:{self.account}:cluster/{self.eks_name}"

    @property
    def node_count(self) -> int:
        return sum(int(g["count"]) for g in self.instance_groups)

    def describe_hyperpod(self) -> dict[str, Any]:
        """What SageMaker DescribeCluster would return."""
        data: dict[str, Any] = {
            "ClusterArn": self.arn,
            "ClusterName": self.name,
            "ClusterStatus": self.status,
            "CreationTime": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
            "InstanceGroups": [
                {
                    "InstanceGroupName": g.get("name") or f"group-{i}",
                    "InstanceType": g["instanceType"],
                    "CurrentCount": g["count"],
                    "TargetCount": g["count"],
                }
                for i, g in enumerate(self.instance_groups, 1)
            ],
            "Orchestrator": {"Eks": {"ClusterArn": self.eks_arn}},
        }
        if self.node_recovery is not None:
            data["NodeRecovery"] = self.node_recovery
        if self.tiered_storage is not None:
            data["TieredStorageConfig"] = copy.deepcopy(self.tiered_storage)
        return data

    def describe_eks(self) -> dict[str, Any]:
        """What EKS DescribeCluster's ``cluster`` would contain (no endpoint: nothing is called)."""
        return {
            "name": self.eks_name,
            "arn": self.eks_arn,
            "version": self.eks_version,
            "status": "ACTIVE",
            "identity": {
                "oidc": {
                    "issuer": f"https://oidc.eks.{self.region}.amazonaws.com/id/EXAMPLE0123456789"
                }
            },
        }

    def cluster_nodes(self) -> list[dict[str, Any]]:
        """What SageMaker ListClusterNodes' ``ClusterNodeSummaries`` would contain."""
        nodes = []
        for i, group in enumerate(self.instance_groups, 1):
            for n in range(int(group["count"])):
                nodes.append(
                    {
                        "InstanceGroupName": group.get("name") or f"group-{i}",
                        "InstanceId": f"i-example{i:02d}{n:08d}",
                        "InstanceType": group["instanceType"],
                        "InstanceStatus": {"Status": "Running"},
                    }
                )
        return nodes

    def endpoint_refs(self) -> list[tuple[str, str, int]]:
        """(namespace, name, replicas) of each endpoint the profile lists."""
        return sorted(
            (str(e.get("namespace") or "default"), str(e["name"]), int(e.get("replicas") or 2))
            for e in self.endpoints
        )

    def summary(self) -> str:
        groups = ", ".join(f"{g['count']} x {g['instanceType']}" for g in self.instance_groups)
        return (
            f"HyperPod cluster '{self.name}' in {self.region} ({groups}; EKS {self.eks_name} "
            f"{self.eks_version})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "region": self.region,
            "source": self.source,
            "instanceGroups": copy.deepcopy(self.instance_groups),
            "eks": {"name": self.eks_name, "version": self.eks_version},
        }


def load_profile(path: str | Path | None = None) -> ClusterProfile:
    """The profile in ``path``, or the embedded example. Raises ConfigError naming the key."""
    import yaml

    example = yaml.safe_load(EXAMPLE_PROFILE.read_text(encoding="utf-8"))
    if path is None:
        return _from_mapping(example, source="the embedded example profile")
    where = f"cluster profile {path}"
    try:
        data = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"{where} does not exist",
            fix="pass an existing file to --cluster-profile, or omit it to use the example",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read {where}: {getattr(exc, 'strerror', None) or exc}",
            fix="check the path and its permissions",
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(
            f"{where} is not valid YAML{at}: {getattr(exc, 'problem', None) or 'invalid YAML'}",
            fix="fix the YAML syntax (check indentation and quoting)",
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where} must be a YAML mapping, found {type(data).__name__}",
            fix=f"start from {EXAMPLE_PROFILE.name} (keys name, region, instanceGroups, eks ...)",
        )
    _validate(data, where)
    merged = {**example, **data}
    # eks.name defaults to '<name>-eks' for a profile that names its own cluster
    example_eks = {k: v for k, v in example["eks"].items() if k != "name"}
    merged["eks"] = {**example_eks, **(data.get("eks") or {})}
    merged["kubernetes"] = {**example["kubernetes"], **(data.get("kubernetes") or {})}
    return _from_mapping(merged, source=str(path))


def _validate(data: dict[str, Any], where: str) -> None:
    import jsonschema

    validator = jsonschema.Draft202012Validator(SCHEMA)
    errors = sorted(validator.iter_errors(data), key=lambda e: (len(e.absolute_path), e.path))
    if not errors:
        return
    error = errors[0]
    key = ".".join(str(p) for p in error.absolute_path) or "top level"
    if error.validator == "additionalProperties":
        known = sorted(
            _schema_at(error.absolute_path).get("properties", {}) or SCHEMA["properties"]
        )
        raise ConfigError(
            f"{where}: {error.message}", fix=f"remove it; known keys here: {', '.join(known)}"
        )
    shown = error.instance if not isinstance(error.instance, (dict, list)) else ""
    detail = f" is {shown!r}" if shown != "" else ""
    problem = error.message
    if error.validator == "pattern":
        problem = f"not a valid {error.absolute_path[-1]}"
    raise ConfigError(
        f"{where}: {key}{detail}: {problem}",
        fix=f"correct {key} (see {EXAMPLE_PROFILE.name} in the hpkv package for the format)",
    )


def _schema_at(path: Any) -> dict[str, Any]:
    node: dict[str, Any] = SCHEMA
    for part in path:
        if isinstance(part, int):
            node = node.get("items", {})
        else:
            node = node.get("properties", {}).get(part, {})
    return node


def _from_mapping(data: dict[str, Any], *, source: str) -> ClusterProfile:
    eks = data.get("eks") or {}
    kubernetes = data.get("kubernetes") or {}
    return ClusterProfile(
        name=data["name"],
        region=data["region"],
        account=str(data["account"]),
        status=data.get("status") or "InService",
        node_recovery=data.get("nodeRecovery"),
        tiered_storage=data.get("tieredStorage"),
        instance_groups=[dict(g) for g in data["instanceGroups"]],
        eks_name=eks.get("name") or f"{data['name']}-eks",
        eks_version=str(eks.get("version")),
        addons=list(eks.get("addons") or []),
        helm_releases=list(kubernetes.get("helmReleases") or []),
        storage_classes=list(kubernetes.get("storageClasses") or []),
        namespaces=list(kubernetes.get("namespaces") or []),
        endpoints=[dict(e) for e in data.get("endpoints") or []],
        source=source,
    )
