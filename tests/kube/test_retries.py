"""Kubernetes 429/5xx are retried (urllib3 Retry on the kubernetes client); a 409 is one clear line."""

from __future__ import annotations

import json

import pytest

from hpkv.config import load_settings
from hpkv.errors import PreconditionFailed
from hpkv.kube import KubeClients
from hpkv.kube.objects import apply
from tests.harness.kube_proxy import KubeFault, KubeProxy
from tests.harness.scenario import Scenario

pytestmark = [pytest.mark.kube, pytest.mark.aws]


def test_transient_errors_are_retried(scenario: Scenario, kube_proxy: KubeProxy) -> None:
    scenario.hyperpod(tiered_storage={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20})
    scenario.nodes(2)
    scenario.ai_toolkit()
    kube_proxy.inject(KubeFault(500, method="GET", path="/api/v1/nodes$", times=2))
    kube_proxy.inject(
        KubeFault(429, method="GET", path="/daemonsets/ai-toolkit$", times=1, retry_after=0)
    )
    result = scenario.hpkv("tiered-storage", "status", "--cluster", "demo", "-o", "json")
    assert result.exit_code == 0, result
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["ai-toolkit-daemonset"]["state"] == "ok"
    assert len(kube_proxy.injected) == 3, kube_proxy.injected


def test_persistent_server_errors_become_one_line(
    scenario: Scenario, kube_proxy: KubeProxy
) -> None:
    scenario.hyperpod(tiered_storage={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20})
    kube_proxy.inject(KubeFault(503, method="GET", path="/api/v1/nodes$", times=-1))
    result = scenario.hpkv("tiered-storage", "status", "--cluster", "demo", "-o", "json")
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["ai-toolkit-daemonset"]["state"] == "unknown"
    assert "kept failing" in checks["ai-toolkit-daemonset"]["evidence"]


def test_conflict_on_write_is_a_clear_error(scenario: Scenario, kube_proxy: KubeProxy) -> None:
    scenario.hyperpod()
    kube_proxy.inject(KubeFault(409, method="PATCH", path="/configmaps/", times=-1))
    clients = KubeClients(load_settings(flags={"kubeconfig": str(scenario.kubeconfig)}))
    obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x", "namespace": "default"},
    }
    with pytest.raises(PreconditionFailed) as info:
        apply(clients, obj)
    assert "conflict" in info.value.one_line()
