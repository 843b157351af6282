"""The healthy clusters the status and diagnose tests break one piece at a time: ``stack`` has
every stage installed by hpkv itself (tests/harness/stack.py); ``installation`` is lighter, stage 1
plus pods standing in for the later stages (which read "not installed"), for the generic
detectors."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from hpkv.health import SCHEMA_DIR
from tests.harness.play import add_pod, ensure_namespace
from tests.harness.scenario import Scenario

OPERATOR_NS = "hyperpod-inference-system"
CURVINE_NS = "curvine"
ENDPOINT_NS = "inference"
WORKER_RS = "llama-5c6d7e8f9"
OPERATOR_RS = "hyperpod-inference-controller-manager-7f9b8c6d5"
L2_URL = "fs://localhost:0/mnt/curvine/l2cache/"


def worker_container(
    *, env: dict[str, str] | None = None, model: str = "meta-llama/Llama-3.1-8B", tp: str = "1"
) -> dict[str, Any]:
    values = {
        "LMCACHE_REMOTE_URL": L2_URL,
        "LMCACHE_REMOTE_SERDE": "naive",
        "LMCACHE_CHUNK_SIZE": "256",
        "PYTHONHASHSEED": "0",
        **(env or {}),
    }
    return {
        "name": "vllm",
        "image": "public.ecr.aws/example/vllm:0.11",
        "args": ["vllm", "serve", model, "--tensor-parallel-size", tp],
        "env": [{"name": k, "value": v} for k, v in values.items() if v is not None],
    }


@dataclass
class Installation:
    scenario: Scenario
    logs: Path
    nodes: list[str] = field(default_factory=list)

    @property
    def kube(self) -> Any:
        return self.scenario.kube

    def log(
        self, namespace: str, pod: str, container: str, text: str, *, previous: bool = False
    ) -> None:
        name = f"{container}.previous.log" if previous else f"{container}.log"
        path = self.logs / namespace / pod / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def worker(self, name: str, node: str, *, owner: str = WORKER_RS, **container: Any) -> None:
        add_pod(
            self.kube,
            ENDPOINT_NS,
            name,
            node=node,
            owner=("ReplicaSet", owner),
            containers=[worker_container(**container)],
            labels={"app": "llama"},
        )
        self.log(ENDPOINT_NS, name, "vllm", "INFO LMCache engine initialised\nINFO ready\n")

    def diagnose(self, *args: str) -> tuple[int, dict[str, Any]]:
        result = self.scenario.hpkv("diagnose", "--cluster", "demo", "-o", "json", *args)
        assert result.exception is None, result
        document = json.loads(result.stdout)
        validate(document, "diagnose")
        return result.exit_code, document


def run_json(scenario: Scenario, command: str, *args: str) -> tuple[int, dict[str, Any]]:
    """``hpkv status|diagnose --cluster demo -o json ...``: (exit code, schema-valid document)."""
    result = scenario.hpkv(command, "--cluster", "demo", "-o", "json", *args)
    assert result.exception is None, result
    document = json.loads(result.stdout)
    validate(document, command)
    return result.exit_code, document


def validate(document: dict[str, Any], name: str) -> None:
    schema = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    ).validate(document)


def findings(document: dict[str, Any], finding_id: str) -> list[dict[str, Any]]:
    return [f for f in document["findings"] if f["id"] == finding_id]


@pytest.fixture
def installation(
    scenario: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Installation:
    """Tiered storage on 2 nodes, an operator pod, a Curvine PVC and two LMCache workers."""
    logs = tmp_path / "pod-logs"
    logs.mkdir()
    monkeypatch.setenv("HPKV_POD_LOGS_DIR", str(logs))
    inst = Installation(scenario, logs)
    scenario.hyperpod(tiered_storage={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20})
    inst.nodes = scenario.nodes(2)
    scenario.ai_toolkit()
    add_pod(
        scenario.kube,
        OPERATOR_NS,
        f"{OPERATOR_RS}-abcde",
        node=inst.nodes[0],
        owner=("ReplicaSet", OPERATOR_RS),
        containers=[{"name": "manager", "image": "example/operator:v3.2"}],
    )
    ensure_namespace(scenario.kube, CURVINE_NS)
    scenario.kube.apply_object(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": "curvine-sc"},
            "provisioner": "curvine",
            "parameters": {"master-addrs": "curvine-master.curvine.svc.cluster.local:8995"},
        }
    )
    scenario.kube.apply_object(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "curvine-master", "namespace": CURVINE_NS},
            "spec": {"clusterIP": "None", "ports": [{"name": "rpc", "port": 8995}]},
        }
    )
    pvc(scenario, "curvine-pvc", "curvine-sc", phase="Bound")
    for i, node in enumerate(inst.nodes):
        inst.worker(f"{WORKER_RS}-w{i}", node)
    ensure_namespace(scenario.kube, ENDPOINT_NS)
    scenario.kube.apply_object(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "client", "namespace": ENDPOINT_NS},
            "data": {"ENDPOINT": "http://llama-routing-service.inference:443/invocations"},
        }
    )
    return inst


def pvc(
    scenario: Scenario,
    name: str,
    storage_class: str | None,
    *,
    phase: str = "Pending",
    namespace: str = CURVINE_NS,
) -> None:
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "10Gi"}},
    }
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    ensure_namespace(scenario.kube, namespace)
    scenario.kube.apply_object(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
    )
    scenario.kube.apply_object(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"phase": phase},
        },
        subresource="status",
    )
