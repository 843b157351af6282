"""The in-cluster launcher's manifests, and the pod-log seam it reads results through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpkv.bench import runner
from hpkv.bench.job import (
    JobSettings,
    barrier_for,
    configmap_manifest,
    job_manifest,
    service_manifest,
)
from hpkv.errors import NotFound
from hpkv.kube.podlogs import LOGS_DIR_ENV, PodLogs
from tests.harness.kube import KubeHarness

SETTINGS = JobSettings(
    namespace="team-a",
    run_id="20261129-101500-ab12",
    image="lmcache/vllm-openai:v0.3.7",
    node_selector={"node-group": "bench-clients"},
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    barrier_port=29777,
    timeout_s=900,
)


def test_configmap_carries_the_runner_and_the_spec() -> None:
    cm = configmap_manifest(SETTINGS, {"runId": SETTINGS.run_id, "pods": []})
    assert cm["metadata"]["name"] == "hpkv-bench-20261129-101500-ab12"
    assert cm["data"]["runner.py"] == Path(runner.__file__).read_text()
    assert json.loads(cm["data"]["spec.json"]) == {"runId": SETTINGS.run_id, "pods": []}
    assert cm["metadata"]["labels"]["hpkv.io/bench-run"] == SETTINGS.run_id


def test_single_client_job() -> None:
    job = job_manifest(SETTINGS, "cross-pod", 1)
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert job["metadata"]["name"] == "hpkv-bench-20261129-101500-ab12-cross-pod"
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 1, 1)
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"]) == (0, 900)
    assert spec["ttlSecondsAfterFinished"] > 0
    assert "subdomain" not in pod
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert pod["nodeSelector"] == {"node-group": "bench-clients"}
    assert pod["tolerations"] == SETTINGS.tolerations
    (container,) = pod["containers"]
    assert container["image"] == SETTINGS.image
    assert container["command"] == ["python3", "/opt/hpkv-bench/runner.py"]
    assert container["args"] == [
        "--spec",
        "/opt/hpkv-bench/spec.json",
        "--scenario",
        "cross-pod",
        "--clients",
        "1",
    ]
    assert pod["volumes"] == [
        {"name": "runner", "configMap": {"name": "hpkv-bench-20261129-101500-ab12"}}
    ]
    assert barrier_for(SETTINGS, "cross-pod", 1) is None


def test_several_clients_start_together_through_pod_zero() -> None:
    job = job_manifest(SETTINGS, "shared-prefix", 4)
    name = job["metadata"]["name"]
    assert len(name) <= 63
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (4, 4)
    assert job["spec"]["template"]["spec"]["subdomain"] == name
    service = service_manifest(SETTINGS, "shared-prefix")
    assert service["metadata"]["name"] == name
    assert (
        service["spec"]["clusterIP"] == "None"
        and service["spec"]["publishNotReadyAddresses"] is True
    )
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in service["spec"]["selector"].items())
    assert barrier_for(SETTINGS, "shared-prefix", 4) == {
        "host": f"{name}-0.{name}.team-a.svc.cluster.local",
        "port": 29777,
        "timeoutS": 900,
    }


def test_pod_logs_seam_reads_the_unified_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ns" / "pod-1").mkdir(parents=True)
    (tmp_path / "ns" / "pod-1" / "runner.log").write_text("runner only\n")
    monkeypatch.setenv(LOGS_DIR_ENV, str(tmp_path))
    logs = PodLogs(kube=None)  # type: ignore[arg-type]
    assert logs.read("ns", "pod-1", container="runner") == "runner only\n"
    with pytest.raises(NotFound, match="no log for container vllm of pod ns/pod-1"):
        logs.read("ns", "pod-1", container="vllm")


@pytest.mark.kube
def test_pod_logs_from_the_api_server(
    kube: KubeHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpkv.config import load_settings
    from hpkv.kube import KubeClients

    monkeypatch.delenv(LOGS_DIR_ENV, raising=False)
    kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
    clients = KubeClients(load_settings(flags={"kubeconfig": str(kubeconfig)}, environ={}))
    with pytest.raises(NotFound, match="no log for container runner of pod default/absent"):
        PodLogs(clients).read("default", "absent", container="runner")
