"""Stage 3's pure logic: values hpkv generates (checked against the upstream Curvine chart values
and the newer keys the reference lists), format-flag rules, capacity, master addresses."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpkv.errors import ConfigError, NotFound, PreconditionFailed
from hpkv.stages.curvine import (
    CONFIG_DEFAULTS,
    ChartSource,
    GpuNode,
    chart_needs_format_flags,
    csi_values,
    eviction_overrides,
    fullname,
    is_kernel_6_or_later,
    l2_storage_class,
    master_addrs,
    parse_quantity,
    pick_ebs_class,
    runtime_values,
    validate_config,
    with_format_flags,
    worker_capacity_gi,
)
from tests.harness.curvine import CHART_SOURCES

GIB = 1024**3


def _cfg(**overrides: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(CONFIG_DEFAULTS)
    cfg.update(overrides)
    return cfg


def _runtime(cfg: dict[str, Any] | None = None) -> dict[str, Any]:
    return runtime_values(
        cfg or _cfg(), workers=3, worker_capacity_gi=1520, master_class="hpkv-ebs-gp3"
    )


# --- values against the upstream chart ------------------------------------------------------------
def _reference_keys(reference: str) -> set[str]:
    """Dotted keys from the reference's "Key values" table, braces expanded
    (``master.storage.meta.{storageClass,size}``, ``cluster.formatMaster`` / ``formatWorker``)."""
    table = reference.split("- **Key values**", 1)[1].split("- **Storage modes.**", 1)[0]
    keys: set[str] = set()
    for row in table.splitlines():
        row = row.strip()
        if not row.startswith("| `"):
            continue
        cell = row.split("|")[1]
        tokens = re.findall(r"`([^`]+)`", cell)
        parent = ""
        for token in tokens:
            if "." not in token and parent:
                token = f"{parent}.{token}"
            parent = token.rsplit(".", 1)[0]
            match = re.fullmatch(r"(.*)\.\{([^}]*)\}", token)
            if match:
                keys.update(f"{match.group(1)}.{leaf}" for leaf in match.group(2).split(","))
            else:
                keys.add(token.removesuffix("[]"))
    return keys


def _unknown_keys(values: Any, upstream: Any, allowed: set[str], path: str = "") -> list[str]:
    """Leaf paths of ``values`` that neither the upstream values nor ``allowed`` know."""
    if isinstance(values, dict):
        if isinstance(upstream, dict) and not upstream and path:
            return []  # a free-form map upstream ({}: nodeSelector, configOverrides.master ...)
        problems = []
        for key, value in values.items():
            child = f"{path}.{key}" if path else key
            known = isinstance(upstream, dict) and key in upstream
            if not known and child not in allowed:
                problems.append(child)
                continue
            problems += _unknown_keys(value, upstream.get(key) if known else None, allowed, child)
        return problems
    if isinstance(values, list) and values and isinstance(values[0], dict):
        template = upstream[0] if isinstance(upstream, list) and upstream else {}
        return [p for item in values for p in _unknown_keys(item, template, allowed, path + "[]")]
    return []


def test_runtime_values_use_only_keys_the_curvine_chart_has(shared_dir: Path) -> None:
    upstream = yaml.safe_load(
        (shared_dir / "upstream" / "curvine-helm" / "curvine-runtime.values.yaml").read_text()
    )
    reference = (shared_dir / "reference" / "curvine.md").read_text()
    allowed = _reference_keys(reference)
    assert "master.antiAffinity.type" in allowed  # the parser reads the table
    cfg = _cfg(imageTag="v0.4.1", tolerations=[{"operator": "Exists"}])
    values = _runtime(cfg)
    assert _unknown_keys(values, upstream, allowed) == []
    # configOverrides are free-form TOML: every key hpkv sets is one Curvine documents.
    for section, entries in values["configOverrides"].items():
        assert section in upstream["configOverrides"]
        for key in entries:
            assert f"`{key}`" in reference, f"[{section}] {key} is not a documented Curvine key"


def test_csi_values_use_only_keys_the_csi_chart_has(shared_dir: Path) -> None:
    upstream = yaml.safe_load(
        (shared_dir / "upstream" / "curvine-helm" / "curvine-csi.values.yaml").read_text()
    )
    values = csi_values(_cfg())
    assert _unknown_keys(values, upstream, set()) == []
    assert values["node"]["container"]["securityContext"]["privileged"] is True
    for image in (
        values["controller"]["sidecars"]["provisioner"]["image"],
        values["node"]["sidecars"]["nodeDriverRegistrar"]["image"],
    ):
        assert image.startswith("registry.k8s.io/sig-storage/")


def test_the_check_catches_a_key_the_chart_does_not_have(shared_dir: Path) -> None:
    upstream = yaml.safe_load(
        (shared_dir / "upstream" / "curvine-helm" / "curvine-runtime.values.yaml").read_text()
    )
    values = _runtime()
    values["worker"]["storage"]["dataDirs"][0]["capacity"] = "1Ti"
    values["master"]["persistence"] = {"size": "1Gi"}
    assert _unknown_keys(values, upstream, set()) == [
        "master.persistence",
        "worker.storage.dataDirs[].capacity",
    ]


def test_runtime_values_place_master_on_ebs_and_one_worker_per_gpu_node() -> None:
    values = _runtime()
    assert values["cluster"] == {
        "formatMaster": False,
        "formatWorker": False,
        "formatJournal": False,
    }
    assert values["master"]["storage"]["meta"]["storageClass"] == "hpkv-ebs-gp3"
    assert values["master"]["storage"]["journal"]["hostPath"] == ""
    assert values["worker"]["replicas"] == 3
    assert values["worker"]["antiAffinity"] == {"enabled": True, "type": "required"}
    assert values["worker"]["nodeSelector"] == {"sagemaker.amazonaws.com/compute-type": "hyperpod"}
    assert values["master"]["nodeSelector"] == values["worker"]["nodeSelector"]
    [data_dir] = values["worker"]["storage"]["dataDirs"]
    assert data_dir == {
        "name": "data1",
        "type": "SSD",
        "enabled": True,
        "size": "1520Gi",
        "storageClass": "",
        "hostPath": "/opt/dlami/nvme/curvine-data",
        "mountPath": "/data/data1",
    }
    assert "image" not in values


def test_extra_values_fill_in_but_never_override_what_hpkv_manages() -> None:
    cfg = _cfg(extraValues={"master": {"replicas": 5, "resources": {"limits": {"cpu": "8"}}}})
    values = _runtime(cfg)
    assert values["master"]["replicas"] == 1
    assert values["master"]["resources"] == {"limits": {"cpu": "8"}}


def test_format_flags_in_extra_values_are_rejected() -> None:
    with pytest.raises(ConfigError, match="delete Curvine data"):
        validate_config(_cfg(extraValues={"cluster": {"formatMaster": True}}))


def test_with_format_flags_sets_all_three_and_leaves_the_rest() -> None:
    values = _runtime()
    on = with_format_flags(values, True)
    assert on["cluster"] == dict.fromkeys(("formatMaster", "formatWorker", "formatJournal"), True)
    assert {k: v for k, v in on.items() if k != "cluster"} == {
        k: v for k, v in values.items() if k != "cluster"
    }
    assert values["cluster"]["formatMaster"] is False


def test_eviction_defaults_delete_kv_blocks_by_ttl_and_quota() -> None:
    overrides = eviction_overrides(CONFIG_DEFAULTS["eviction"])
    assert overrides["master"] == {
        "enable_quota_eviction": True,
        "quota_eviction_mode": "delete",
        "quota_eviction_policy": "lru",
        "quota_eviction_high_rate": 0.8,
        "quota_eviction_low_rate": 0.6,
    }
    assert overrides["client"] == {"ttl_ms": "24h", "ttl_action": "delete"}


# --- format flags ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("version", "needed"),
    [
        ("0.2.0", True),
        ("0.3.1-alpha", True),
        ("0.3.2-alpha", False),
        ("0.3.2", False),
        ("0.4.0-alpha", False),
        ("0.4.1", False),
        ("0.0.0-dev", False),
    ],
)
def test_chart_versions_that_need_format_flags(version: str, needed: bool) -> None:
    assert chart_needs_format_flags(version) is needed


# --- sizes and names ------------------------------------------------------------------------------
def _node(name: str, disk: str | None) -> GpuNode:
    return GpuNode(name, "5.10.0", parse_quantity(disk) if disk else None)


def test_worker_capacity_is_the_smallest_disk_minus_the_reserve() -> None:
    nodes = [_node("a", "1900Gi"), _node("b", "1000Gi")]
    assert worker_capacity_gi(nodes, reserve="20%") == 800
    assert worker_capacity_gi(nodes, reserve="100Gi") == 900
    assert worker_capacity_gi(nodes, reserve="20%", explicit="500Gi") == 500


def test_worker_capacity_refuses_a_reserve_that_leaves_nothing() -> None:
    with pytest.raises(PreconditionFailed, match="leaves no room"):
        worker_capacity_gi([_node("a", "100Gi")], reserve="200Gi")
    with pytest.raises(PreconditionFailed, match="no ephemeral-storage capacity") as info:
        worker_capacity_gi([_node("a", None)], reserve="20%")
    assert "curvine.workerCapacity" in (info.value.fix or "")


def test_parse_quantity() -> None:
    assert parse_quantity("1900Gi") == 1900 * GIB
    assert parse_quantity("600G") == 600 * 10**9
    assert parse_quantity("1") == 1
    with pytest.raises(ValueError):
        parse_quantity("lots")


def test_master_addrs_follow_release_namespace_and_replicas() -> None:
    assert (
        master_addrs("curvine", "curvine", 1, domain="cluster.local")
        == "curvine-master-0.curvine-master.curvine.svc.cluster.local:8995"
    )
    assert master_addrs("cache", "l2", 3, domain="cluster.local").split(",") == [
        f"cache-curvine-master-{i}.cache-curvine-master.l2.svc.cluster.local:8995" for i in range(3)
    ]
    assert fullname("my-curvine") == "my-curvine"


def test_l2_storage_class() -> None:
    sc = l2_storage_class(_cfg(masterReplicas=3, namespace="cache"))
    assert sc["provisioner"] == "curvine"
    assert sc["parameters"]["fs-path"] == "/l2cache"
    assert sc["parameters"]["path-type"] == "DirectoryOrCreate"
    assert sc["parameters"]["master-addrs"].count(",") == 2
    assert ".cache.svc.cluster.local:8995" in sc["parameters"]["master-addrs"]


def _sc(name: str, *, mode: str = "WaitForFirstConsumer", kind: str | None = "gp3", **meta: Any):
    return {
        "metadata": {"name": name, **meta},
        "provisioner": "ebs.csi.aws.com",
        "volumeBindingMode": mode,
        "parameters": {"type": kind} if kind else {},
    }


def test_pick_ebs_class_prefers_the_default_then_gp3() -> None:
    assert pick_ebs_class([]) is None
    assert pick_ebs_class([_sc("fast", mode="Immediate"), _sc("io", kind="io2")]) is None
    assert pick_ebs_class([_sc("zeta"), _sc("gp3"), _sc("alpha")]) == "gp3"
    assert pick_ebs_class([_sc("alpha", kind=None), _sc("beta")]) == "alpha"
    default = {"annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}
    assert pick_ebs_class([_sc("gp3"), _sc("ebs-sc", **default)]) == "ebs-sc"


def test_kernel_versions() -> None:
    assert is_kernel_6_or_later("6.1.112-124.190.amzn2023.x86_64")
    assert not is_kernel_6_or_later("5.10.238-231.953.amzn2.x86_64")
    assert not is_kernel_6_or_later("")


def test_chart_source(tmp_path: Path) -> None:
    assert ChartSource("https://curvineio.github.io/helm-charts/", "curvine", "0.4.1").locate() == (
        "curvine",
        "https://curvineio.github.io/helm-charts",
        "0.4.1",
    )
    assert ChartSource("oci://ghcr.io/curvineio/charts", "curvine", "0.4.1").locate() == (
        "oci://ghcr.io/curvineio/charts/curvine",
        None,
        "0.4.1",
    )
    (tmp_path / "curvine").mkdir()
    assert ChartSource(str(tmp_path), "curvine", "0.4.1").locate() == (
        str(tmp_path / "curvine"),
        None,
        None,
    )
    with pytest.raises(NotFound, match=r"curvine-csi-0\.4\.1\.tgz"):
        ChartSource(str(tmp_path), "curvine-csi", "0.4.1").locate()


# --- the stand-in chart renders what hpkv's values ask for -----------------------------------------
@pytest.mark.helm
def test_stand_in_chart_renders_the_generated_values(curvine_chart_repo: Any) -> None:
    values = with_format_flags(_runtime(), False)
    rendered = subprocess.run(
        [curvine_chart_repo.helm, "template", "curvine", str(CHART_SOURCES / "curvine"),
         "-n", "curvine", "-f", "-"],
        input=yaml.safe_dump(values), capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    objects = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(rendered) if o}
    worker = objects[("StatefulSet", "curvine-worker")]
    assert worker["spec"]["replicas"] == 3
    volumes = {v["name"]: v for v in worker["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data1"]["hostPath"]["path"] == "/opt/dlami/nvme/curvine-data"
    master = objects[("StatefulSet", "curvine-master")]
    classes = {t["metadata"]["name"]: t["spec"]["storageClassName"] for t in master["spec"]["volumeClaimTemplates"]}  # fmt: skip
    assert classes == {"meta": "hpkv-ebs-gp3", "journal": "hpkv-ebs-gp3"}
    toml = objects[("ConfigMap", "curvine-config")]["data"]["curvine-cluster.toml"]
    assert 'data_dir = ["[SSD:1520GB]/data/data1"]' in toml
    assert "enable_quota_eviction = true" in toml
    assert 'ttl_action = "delete"' in toml
    assert "format_master = false" in toml
