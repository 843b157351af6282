"""Stage 3's configuration section and everything pure: Helm values for the ``curvine`` and
``curvine-csi`` charts, the StorageClass/PVC objects, format-flag rules, sizes and names."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpkv.aws.eks import VERSION_POLICY_PATTERN
from hpkv.config import deep_merge
from hpkv.errors import ConfigError, NotFound, PreconditionFailed, UsageError
from hpkv.topology import (
    CURVINE_CSI_RELEASE,
    CURVINE_FS_PATH,
    CURVINE_NAMESPACE,
    CURVINE_PVC,
    CURVINE_RELEASE,
    CURVINE_STORAGE_CLASS,
)

CHART_REPO = "https://curvineio.github.io/helm-charts"
CHART_VERSION = "0.4.1"
RUNTIME_CHART = "curvine"
CSI_CHART = "curvine-csi"
# Charts before this cannot bootstrap a master on empty volumes without the format flags
# (curvine#953: "RocksDB directories not found" otherwise).
FORMAT_FREE_BOOTSTRAP_SINCE = (0, 3, 2, "alpha")
FORMAT_KEYS = ("formatMaster", "formatWorker", "formatJournal")

HYPERPOD_LABEL = "sagemaker.amazonaws.com/compute-type"
HYPERPOD_VALUE = "hyperpod"
GPU_RESOURCE = "nvidia.com/gpu"
EBS_PROVISIONER = "ebs.csi.aws.com"
EBS_STORAGE_CLASS = "hpkv-ebs-gp3"
CURVINE_PROVISIONER = "curvine"
CSI_NODE_LABEL = "app=curvine-csi-node"
MASTER_RPC_PORT = 8995
MASTER_WEB_PORT = 9000
WORKER_MOUNT_PATH = "/data/data1"
MANAGED_LABELS = {"app.kubernetes.io/managed-by": "hpkv", "app.kubernetes.io/part-of": "hpkv-l2"}
L2_SELECTOR = ",".join(f"{k}={v}" for k, v in MANAGED_LABELS.items())
GIB = 1024**3

_QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"
_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "chartRepo": {
            "type": "string",
            "minLength": 1,
            "description": "an https:// or oci:// chart repository, or a local directory holding "
            "<chart>-<version>.tgz files or <chart>/ directories",
        },
        "chartVersion": {
            "type": "string",
            "pattern": r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$",
            "description": "a chart version such as 0.4.1",
        },
        "csiChartVersion": {
            "type": "string",
            "pattern": r"^(\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?)?$",
            "description": "a chart version, or empty for chartVersion",
        },
        "namespace": {"type": "string", "pattern": _NAME, "description": "a namespace name"},
        "release": {"type": "string", "pattern": _NAME, "description": "a Helm release name"},
        "csiRelease": {"type": "string", "pattern": _NAME, "description": "a Helm release name"},
        "clusterDomain": {"type": "string", "minLength": 1},
        "imageTag": {"type": "string", "description": "a Curvine image tag, or empty"},
        "masterReplicas": {
            "type": "integer",
            "enum": [1, 3, 5, 7],
            "description": "an odd number of masters (1, 3, 5 or 7)",
        },
        "masterMetaSize": {"type": "string", "pattern": _QUANTITY, "description": "e.g. 10Gi"},
        "masterJournalSize": {"type": "string", "pattern": _QUANTITY, "description": "e.g. 20Gi"},
        "dataDir": {"type": "string", "pattern": "^/", "description": "an absolute host path"},
        "capacityReserve": {
            "type": "string",
            "pattern": r"^([0-9]+(\.[0-9]+)?%|[0-9]+(Ki|Mi|Gi|Ti))$",
            "description": "a share of the node disk (20%) or a size (200Gi) kept free",
        },
        "workerCapacity": {
            "type": "string",
            "pattern": r"^$|" + _QUANTITY,
            "description": "a size such as 500Gi, or empty to derive it from the node disk",
        },
        "tolerations": {"type": "array", "items": {"type": "object"}},
        "ebsStorageClassName": {
            "type": "string",
            "pattern": r"^$|" + _NAME,
            "description": "a StorageClass name, or empty to reuse or create one",
        },
        "storageClassName": {"type": "string", "pattern": _NAME},
        "pvcName": {"type": "string", "pattern": _NAME},
        "pvcSize": {"type": "string", "pattern": _QUANTITY, "description": "e.g. 100Gi"},
        "pvcNamespaces": {
            "type": "array",
            "items": {"type": "string", "pattern": _NAME, "description": "a namespace name"},
            "description": "namespaces for the L2 PVC besides those of the inference endpoints",
        },
        "eviction": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "ttl": {
                    "type": "string",
                    "pattern": r"^[0-9]+(ms|s|m|h|d)$",
                    "description": "a duration such as 24h or 7d",
                },
                "ttlAction": {"type": "string", "enum": ["none", "delete", "free"]},
                "quotaEviction": {"type": "boolean"},
                "highWatermark": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                "lowWatermark": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            },
        },
        "ebsCsi": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "roleName": {"type": "string", "pattern": r"^$|^[\w+=,.@-]{1,64}$"},
                "addonVersion": {
                    "type": "string",
                    # Empty is the same as "default" (hpkv.yaml files from before it existed).
                    "pattern": f"^$|{VERSION_POLICY_PATTERN}",
                    "description": "'default' (EKS's default for the cluster's Kubernetes "
                    "version; an installed version is kept), 'latest' or an aws-ebs-csi-driver "
                    "add-on version",
                },
            },
        },
        "csi": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "mountMode": {"type": "string", "enum": ["standalone", "embedded"]},
                "provisionerImage": {"type": "string", "minLength": 1},
                "registrarImage": {"type": "string", "minLength": 1},
            },
        },
        "extraValues": {"type": "object"},
        "csiExtraValues": {"type": "object"},
    },
}

CONFIG_DEFAULTS: dict[str, Any] = {
    "chartRepo": CHART_REPO,
    "chartVersion": CHART_VERSION,
    "csiChartVersion": "",
    "namespace": CURVINE_NAMESPACE,
    "release": CURVINE_RELEASE,
    "csiRelease": CURVINE_CSI_RELEASE,
    "clusterDomain": "cluster.local",
    "imageTag": "",
    "masterReplicas": 1,
    "masterMetaSize": "10Gi",
    "masterJournalSize": "20Gi",
    "dataDir": "/opt/dlami/nvme/curvine-data",
    "capacityReserve": "20%",
    "workerCapacity": "",
    "tolerations": [],
    "ebsStorageClassName": "",
    "storageClassName": CURVINE_STORAGE_CLASS,
    "pvcName": CURVINE_PVC,
    "pvcSize": "100Gi",
    "pvcNamespaces": [],
    "eviction": {
        "ttl": "24h",
        "ttlAction": "delete",
        "quotaEviction": True,
        "highWatermark": 0.8,
        "lowWatermark": 0.6,
    },
    "ebsCsi": {"roleName": "", "addonVersion": "default"},
    "csi": {
        "mountMode": "standalone",
        "provisionerImage": "registry.k8s.io/sig-storage/csi-provisioner:v5.0.1",
        "registrarImage": "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.13.0",
    },
    "extraValues": {},
    "csiExtraValues": {},
}


# --- pure helpers ---------------------------------------------------------------------------------
_SUFFIX = {
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "": 1,
}


def parse_quantity(text: str) -> int:
    """A Kubernetes quantity ('1900Gi', '600G', '1024') in bytes."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?", str(text).strip())
    if not match:
        raise ValueError(f"not a quantity: {text!r}")
    return int(float(match.group(1)) * _SUFFIX[match.group(2) or ""])


def human_bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"


def parse_version(version: str) -> tuple[int, int, int, str]:
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?", version)
    if not match:
        raise UsageError(
            f"chart version '{version}' is not a semantic version",
            fix="set curvine.chartVersion to a version such as 0.4.1",
        )
    major, minor, patch, pre = match.groups()
    return int(major), int(minor), int(patch), pre or ""


def _version_key(version: tuple[int, int, int, str]) -> tuple[int, int, int, int, str]:
    major, minor, patch, pre = version
    # A pre-release sorts before its release.
    return major, minor, patch, 0 if pre else 1, pre


def chart_needs_format_flags(version: str) -> bool:
    """True for chart versions whose master cannot bootstrap on empty volumes without format flags.

    ``0.0.0-*`` is the development ("latest") chart, which bootstraps by itself.
    """
    parsed = parse_version(version)
    if parsed[:3] == (0, 0, 0):
        return False
    return _version_key(parsed) < _version_key(FORMAT_FREE_BOOTSTRAP_SINCE)


def fullname(release: str, chart: str = RUNTIME_CHART) -> str:
    """The chart's object name prefix (the standard Helm ``fullname`` helper)."""
    name = release if chart in release else f"{release}-{chart}"
    return name[:63].rstrip("-")


def master_addrs(
    release: str, namespace: str, replicas: int, *, domain: str, port: int = MASTER_RPC_PORT
) -> str:
    """``host:port,...`` of every master pod through the headless master Service."""
    base = f"{fullname(release)}-master"
    return ",".join(
        f"{base}-{i}.{base}.{namespace}.svc.{domain}:{port}" for i in range(int(replicas))
    )


def dig(data: Any, *path: str, default: Any = None) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return default
        data = data[key]
    return data


def format_flags(values: dict[str, Any]) -> dict[str, bool]:
    cluster = values.get("cluster") or {}
    return {key: bool(cluster.get(key)) for key in FORMAT_KEYS}


def with_format_flags(values: dict[str, Any], on: bool) -> dict[str, Any]:
    return deep_merge(values, {"cluster": dict.fromkeys(FORMAT_KEYS, on)})


def _json_normal(values: dict[str, Any]) -> dict[str, Any]:
    """Values as Helm returns them (JSON types), so comparisons with live values are exact."""
    return json.loads(json.dumps(values))


def validate_config(cfg: dict[str, Any]) -> None:
    eviction = cfg["eviction"]
    if eviction["lowWatermark"] >= eviction["highWatermark"]:
        raise ConfigError(
            f"curvine.eviction.lowWatermark ({eviction['lowWatermark']}) must be below "
            f"highWatermark ({eviction['highWatermark']})",
            fix="use e.g. highWatermark 0.8 and lowWatermark 0.6",
        )
    for key in ("extraValues", "csiExtraValues"):
        if any(k in (cfg[key].get("cluster") or {}) for k in FORMAT_KEYS):
            raise ConfigError(
                f"curvine.{key} sets cluster.format*: those flags delete Curvine data",
                fix="remove them; use 'hpkv curvine apply --reformat' to reformat on purpose",
            )


def eviction_overrides(eviction: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``configOverrides`` sections (curvine-cluster.toml keys) for TTL and quota eviction."""
    return {
        "master": {
            "enable_quota_eviction": bool(eviction["quotaEviction"]),
            # delete, not free: an LMCache L2 has no UFS copy, and a freed inode would read as a
            # zero-length hit instead of a miss.
            "quota_eviction_mode": "delete",
            "quota_eviction_policy": "lru",
            "quota_eviction_high_rate": float(eviction["highWatermark"]),
            "quota_eviction_low_rate": float(eviction["lowWatermark"]),
        },
        "client": {
            "ttl_ms": str(eviction["ttl"]),
            "ttl_action": str(eviction["ttlAction"]),
        },
    }


def runtime_values(
    cfg: dict[str, Any], *, workers: int, worker_capacity_gi: int, master_class: str
) -> dict[str, Any]:
    """Values for the ``curvine`` chart (format flags always off; see ``with_format_flags``)."""
    selector = {HYPERPOD_LABEL: HYPERPOD_VALUE}
    tolerations = list(cfg.get("tolerations") or [])
    master_storage = {
        "storageClass": master_class,
        "hostPath": "",
    }
    generated: dict[str, Any] = {
        "global": {"clusterDomain": cfg["clusterDomain"]},
        "cluster": dict.fromkeys(FORMAT_KEYS, False),
        "master": {
            "replicas": int(cfg["masterReplicas"]),
            "nodeSelector": selector,
            "tolerations": tolerations,
            "storage": {
                "meta": {**master_storage, "size": cfg["masterMetaSize"]},
                "journal": {**master_storage, "size": cfg["masterJournalSize"]},
            },
        },
        "worker": {
            "replicas": int(workers),
            "nodeSelector": selector,
            "tolerations": tolerations,
            # One worker per GPU node: each owns that node's NVMe data dir.
            "antiAffinity": {"enabled": True, "type": "required"},
            "storage": {
                "dataDirs": [
                    {
                        "name": "data1",
                        "type": "SSD",
                        "enabled": True,
                        "size": f"{int(worker_capacity_gi)}Gi",
                        "storageClass": "",
                        "hostPath": cfg["dataDir"],
                        "mountPath": WORKER_MOUNT_PATH,
                    }
                ]
            },
        },
        "configOverrides": eviction_overrides(cfg["eviction"]),
    }
    if cfg.get("imageTag"):
        generated["image"] = {"tag": cfg["imageTag"]}
    return _json_normal(deep_merge(cfg.get("extraValues") or {}, generated))


def csi_values(cfg: dict[str, Any]) -> dict[str, Any]:
    """Values for the ``curvine-csi`` chart: registry.k8s.io sidecars, privileged plugins."""
    csi = cfg["csi"]
    privileged = {"securityContext": {"privileged": True}}
    generated = {
        "controller": {
            "container": privileged,
            "sidecars": {"provisioner": {"image": csi["provisionerImage"]}},
        },
        "node": {
            "mountMode": csi["mountMode"],
            "container": privileged,
            "sidecars": {"nodeDriverRegistrar": {"image": csi["registrarImage"]}},
        },
    }
    return _json_normal(deep_merge(cfg.get("csiExtraValues") or {}, generated))


def worker_capacity_gi(nodes: Iterable[GpuNode], *, reserve: str, explicit: str = "") -> int:
    """Each worker's cache size: the smallest GPU node disk minus the reserve, whole GiB."""
    if explicit:
        return max(1, parse_quantity(explicit) // GIB)
    nodes = list(nodes)
    unknown = [n.name for n in nodes if not n.disk_bytes]
    if unknown:
        raise PreconditionFailed(
            f"node {unknown[0]} reports no ephemeral-storage capacity to size the cache from",
            fix="set curvine.workerCapacity (e.g. 500Gi) in hpkv.yaml",
        )
    smallest = min(n.disk_bytes or 0 for n in nodes)
    if reserve.endswith("%"):
        reserved = smallest * float(reserve[:-1]) / 100
    else:
        reserved = parse_quantity(reserve)
    capacity = math.floor((smallest - reserved) / GIB)
    if capacity < 1:
        raise PreconditionFailed(
            f"the capacity reserve {reserve} leaves no room on a {human_bytes(smallest)} disk",
            fix="lower curvine.capacityReserve or set curvine.workerCapacity",
        )
    return capacity


def l2_storage_class(cfg: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": cfg["storageClassName"], "labels": dict(MANAGED_LABELS)},
        "provisioner": CURVINE_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "allowVolumeExpansion": True,
        "parameters": {
            "master-addrs": master_addrs(
                cfg["release"],
                cfg["namespace"],
                cfg["masterReplicas"],
                domain=cfg["clusterDomain"],
                port=int(dig(cfg, "extraValues", "master", "rpcPort", default=MASTER_RPC_PORT)),
            ),
            "fs-path": CURVINE_FS_PATH,
            "path-type": "DirectoryOrCreate",
        },
    }


def l2_pvc(cfg: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": cfg["pvcName"],
            "namespace": namespace,
            "labels": dict(MANAGED_LABELS),
        },
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": cfg["storageClassName"],
            "resources": {"requests": {"storage": cfg["pvcSize"]}},
        },
    }


def ebs_storage_class(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "hpkv"}},
        "provisioner": EBS_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": True,
        "parameters": {"type": "gp3", "encrypted": "true"},
    }


def is_suitable_ebs_class(sc: dict[str, Any]) -> bool:
    return (
        sc.get("provisioner") == EBS_PROVISIONER
        and sc.get("volumeBindingMode") == "WaitForFirstConsumer"
        and (sc.get("parameters") or {}).get("type", "gp3") == "gp3"
    )


def _is_default_class(sc: dict[str, Any]) -> bool:
    annotations = (sc.get("metadata") or {}).get("annotations") or {}
    return annotations.get("storageclass.kubernetes.io/is-default-class") == "true"


def pick_ebs_class(classes: Iterable[dict[str, Any]]) -> str | None:
    """The suitable class to reuse: the cluster default first, then ``gp3``, then by name."""
    suitable = [sc for sc in classes if is_suitable_ebs_class(sc)]
    if not suitable:
        return None
    suitable.sort(
        key=lambda sc: (
            not _is_default_class(sc),
            sc["metadata"]["name"] != "gp3",
            sc["metadata"]["name"],
        )
    )
    return suitable[0]["metadata"]["name"]


def is_kernel_6_or_later(kernel: str) -> bool:
    match = re.match(r"(\d+)\.", kernel or "")
    return bool(match) and int(match.group(1)) >= 6


def worker_count(value: Any) -> int:
    """/api/overview reports worker counts; some builds send lists."""
    if isinstance(value, list):
        return len(value)
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def shorten(names: list[str], limit: int = 8) -> str:
    return ", ".join(names[:limit]) + (
        f" (+{len(names) - limit} more)" if len(names) > limit else ""
    )


@dataclass(frozen=True)
class GpuNode:
    name: str
    kernel: str
    disk_bytes: int | None


@dataclass(frozen=True)
class ChartSource:
    """Where a chart comes from: an https/oci repository or a local directory."""

    repo: str
    name: str
    version: str

    @property
    def is_local(self) -> bool:
        return not re.match(r"^(https?|oci)://", self.repo)

    def locate(self) -> tuple[str, str | None, str | None]:
        """(chart reference, --repo, --version) for helm."""
        if self.repo.startswith("oci://"):
            return f"{self.repo.rstrip('/')}/{self.name}", None, self.version
        if not self.is_local:
            return self.name, self.repo.rstrip("/"), self.version
        base = Path(self.repo).expanduser()
        for candidate in (base / f"{self.name}-{self.version}.tgz", base / self.name):
            if candidate.exists():
                return str(candidate.resolve()), None, None
        raise NotFound(
            f"chart {self.name} {self.version} not found in {base} (looked for "
            f"{self.name}-{self.version}.tgz and {self.name}/)",
            fix="point curvine.chartRepo at a chart repository URL or a directory holding the chart",
        )

    def __str__(self) -> str:
        return f"{self.name} {self.version}"


def pod_ready(pod: Any) -> bool:
    for condition in (pod.status.conditions or []) if pod.status else []:
        if condition.type == "Ready":
            return condition.status == "True"
    return False
