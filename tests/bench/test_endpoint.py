"""Finding an endpoint's worker pods, port, routing service and image on the real kube-apiserver."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hpkv.bench.core import _cross_pod_order
from hpkv.bench.endpoint import PodInfo, discover
from hpkv.errors import NotFound, UsageError
from hpkv.kube import KubeClients
from tests.harness.bench import SERVING_IMAGE, install_endpoint_crd, play_endpoint
from tests.harness.kube import KubeHarness

pytestmark = [pytest.mark.kube]


@pytest.fixture
def clients(kube: KubeHarness, tmp_path: Path, shared_dir: Path) -> Iterator[KubeClients]:
    from hpkv.config import load_settings

    install_endpoint_crd(kube, shared_dir)
    kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
    yield KubeClients(load_settings(flags={"kubeconfig": str(kubeconfig)}, environ={}))


def test_discovery_of_a_played_endpoint(
    kube: KubeHarness, clients: KubeClients, shared_dir: Path, tmp_path: Path
) -> None:
    played = play_endpoint(kube, shared_dir, tmp_path / "logs", replicas=3, ready=2)
    try:
        info = discover(clients, "demo")
    finally:
        played.cluster.stop()
    assert info.ref == "default/demo"
    assert info.port == played.port
    assert [p.name for p in info.pods] == sorted(played.pods[:2])
    assert info.not_ready == [played.pods[2]]
    assert {p.ip for p in info.pods} == {"127.0.0.2", "127.0.0.3"}
    assert (
        info.router is not None
        and info.router.url == "http://demo-routing-service.default.svc.cluster.local:443"
    )
    assert info.image == SERVING_IMAGE and info.instance_type == "ml.g6e.4xlarge"
    env = info.environment()
    assert env["kvCache"] == {
        "l1": True,
        "l2": True,
        "l2Backend": "tieredstorage",
        "remoteUrl": "fs://localhost:0/mnt/curvine/l2cache/",
        "chunkSize": 256,
    }
    assert (env["replicas"], env["readyReplicas"], env["routingStrategy"]) == (3, 2, "roundrobin")
    assert discover(clients, "demo", "default", port=9000).port == 9000


def test_router_in_the_operator_namespace_and_no_router(
    kube: KubeHarness, clients: KubeClients, shared_dir: Path, tmp_path: Path
) -> None:
    played = play_endpoint(kube, shared_dir, tmp_path / "logs", router=False)
    try:
        assert discover(clients, "demo").router is None
        kube.apply_object(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": "hyperpod-inference-system"},
            }
        )
        kube.apply_object(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": "demo-default-routing-service",
                    "namespace": "hyperpod-inference-system",
                },
                "spec": {"ports": [{"port": 8081}]},
            }
        )
        router = discover(clients, "demo").router
    finally:
        played.cluster.stop()
    assert router is not None
    assert (
        router.url
        == "http://demo-default-routing-service.hyperpod-inference-system.svc.cluster.local:8081"
    )


def test_missing_and_ambiguous_endpoints(
    kube: KubeHarness, clients: KubeClients, shared_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(
        NotFound, match="no InferenceEndpointConfig named 'demo' \\(endpoints: none\\)"
    ):
        discover(clients, "demo")
    with pytest.raises(NotFound, match="InferenceEndpointConfig team/demo not found"):
        discover(clients, "demo", "team")
    first = play_endpoint(kube, shared_dir, tmp_path / "a", replicas=1)
    second = play_endpoint(kube, shared_dir, tmp_path / "b", namespace="team-b", replicas=1)
    try:
        with pytest.raises(UsageError, match=r"exists in several namespaces \(default, team-b\)"):
            discover(clients, "demo")
        assert discover(clients, "demo", "team-b").namespace == "team-b"
    finally:
        first.cluster.stop()
        second.cluster.stop()


def test_pod_b_is_on_another_node_when_possible() -> None:
    pods = [
        PodInfo("a", "10.0.0.1", "n1", True),
        PodInfo("b", "10.0.0.2", "n1", True),
        PodInfo("c", "10.0.0.3", "n2", True),
    ]
    assert [p.name for p in _cross_pod_order(pods, None, None)] == ["a", "c", "b"]
    assert [p.name for p in _cross_pod_order(pods, "b", "a")] == ["b", "a", "c"]
    with pytest.raises(UsageError, match="pod 'x' is not a ready worker pod"):
        _cross_pod_order(pods, "x", None)
