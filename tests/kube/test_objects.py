"""hpkv.kube.objects against the real kube-apiserver: plan/apply/delete and zero-write convergence."""

from __future__ import annotations

import pytest

from hpkv.config import load_settings
from hpkv.kube import KubeClients
from hpkv.kube.objects import is_subset, plan_apply, plan_delete
from hpkv.stages.base import Verb
from tests.harness.kube import KubeHarness

pytestmark = pytest.mark.kube


@pytest.fixture
def clients(kube: KubeHarness, isolated_env) -> KubeClients:
    path = kube.write_kubeconfig(isolated_env / "kubeconfig")
    return KubeClients(load_settings(flags={"kubeconfig": str(path)}))


def _configmap(value: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "hpkv-demo", "namespace": "default", "labels": {"app": "hpkv"}},
        "data": {"key": value},
    }


def test_create_then_converged_then_update_then_delete(
    kube: KubeHarness, clients: KubeClients
) -> None:
    action = plan_apply(clients, _configmap("a"))
    assert action.verb is Verb.CREATE
    action.run()
    assert kube.get_object("v1", "ConfigMap", "hpkv-demo", "default")["data"] == {"key": "a"}

    mark = kube.audit_mark()
    again = plan_apply(clients, _configmap("a"))
    assert again.verb is Verb.NONE
    assert kube.writes_since(mark) == []

    changed = plan_apply(clients, _configmap("b"))
    assert changed.verb is Verb.UPDATE
    assert changed.before == {"metadata": {"labels": {"app": "hpkv"}}, "data": {"key": "a"}}
    assert "-  key: a" in changed.diff() and "+  key: b" in changed.diff()
    changed.run()
    assert kube.get_object("v1", "ConfigMap", "hpkv-demo", "default")["data"] == {"key": "b"}

    removal = plan_delete(clients, "v1", "ConfigMap", "hpkv-demo", "default")
    assert removal.verb is Verb.DELETE
    removal.run()
    assert kube.get_object("v1", "ConfigMap", "hpkv-demo", "default") is None
    assert plan_delete(clients, "v1", "ConfigMap", "hpkv-demo", "default").verb is Verb.NONE


@pytest.mark.parametrize(
    ("desired", "live", "expected"),
    [
        ({"a": 1}, {"a": 1, "b": 2}, True),
        ({"a": {"b": [1, 2]}}, {"a": {"b": [1, 2]}}, True),
        ({"a": [1]}, {"a": [1, 2]}, False),
        ({"a": [{"name": "x"}]}, {"a": [{"name": "x", "protocol": "TCP"}]}, True),
        ({"port": 80}, {"port": "80"}, True),
        ({"a": 1}, {}, False),
        ({"a": "x"}, {"a": "y"}, False),
    ],
)
def test_is_subset(desired: dict, live: dict, expected: bool) -> None:
    assert is_subset(desired, live) is expected
