"""`hpkv curvine status|apply|remove` against the real kube-apiserver, the real helm binary and the
AWS emulator, with a stand-in Curvine chart repository, a stub Curvine master and the controllers
played by tests/harness/curvine.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.harness.curvine import CurvineEnv, MasterStub
from tests.harness.play import add_nodes

pytestmark = [pytest.mark.kube, pytest.mark.aws, pytest.mark.helm]

MASTER_PVCS = {"meta-curvine-master-0", "journal-curvine-master-0"}


def _apply(curvine: CurvineEnv, *args: str, env: dict[str, str] | None = None) -> Any:
    return curvine.scenario.hpkv("curvine", "apply", "--cluster", "demo", *args, env=env)


def _status(curvine: CurvineEnv) -> tuple[int, dict[str, dict[str, str]], Any]:
    result = curvine.scenario.hpkv("curvine", "status", "--cluster", "demo", "-o", "json")
    assert result.exception is None, result
    payload = json.loads(result.stdout)
    return result.exit_code, {c["name"]: c for c in payload["checks"]}, result


def _revisions(curvine: CurvineEnv, release: str) -> list[int]:
    return [entry["revision"] for entry in curvine.history(release)]


def _pvcs(curvine: CurvineEnv, namespace: str) -> dict[str, Any]:
    _, body = curvine.kube.raw("GET", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims")
    return {p["metadata"]["name"]: p for p in json.loads(body)["items"]}


def test_apply_status_second_apply_remove(curvine: CurvineEnv) -> None:
    scenario = curvine.scenario
    mark = scenario.mark()
    result = _apply(curvine, "--yes")
    assert result.exit_code == 0, result
    assert "applied 10 change(s)" in result.stdout
    # apply returns once Curvine runs: the L2 wiring that follows mounts the cache through it.
    assert "1 master and 2 worker pod(s) Ready" in result.stdout
    assert curvine.kube.get_object("v1", "Pod", "curvine-master-0", "curvine") is not None
    assert "PVC curvine-pvc Bound in team-a" in result.stdout
    writes = scenario.writes_since(mark)
    assert "eks:CreateAddon -> 200" in writes
    assert "iam:CreateRole -> 200" in writes

    # EBS CSI: the add-on runs with an IRSA role that allows HyperPod volume attach.
    requests = curvine.eks.addon_requests
    assert [op for op, _ in requests] == ["CreateAddon"]
    role_arn = requests[0][1]["serviceAccountRoleArn"]
    assert role_arn == "arn:aws:iam::123456789012:role/hpkv-hpkv-eks-ebs-csi"
    iam = scenario.aws.client("iam")
    attached = iam.list_attached_role_policies(RoleName="hpkv-hpkv-eks-ebs-csi")
    assert [p["PolicyName"] for p in attached["AttachedPolicies"]] == ["AmazonEBSCSIDriverPolicy"]
    inline = iam.get_role_policy(
        RoleName="hpkv-hpkv-eks-ebs-csi", PolicyName="hpkv-hyperpod-volume-attach"
    )["PolicyDocument"]
    assert set(inline["Statement"][0]["Action"]) == {
        "sagemaker:AttachClusterNodeVolume",
        "sagemaker:DetachClusterNodeVolume",
        "eks:Describe*",
    }
    trust = iam.get_role(RoleName="hpkv-hpkv-eks-ebs-csi")["Role"]["AssumeRolePolicyDocument"]
    condition = trust["Statement"][0]["Condition"]["StringEquals"]
    assert "system:serviceaccount:kube-system:ebs-csi-controller-sa" in condition.values()

    # StorageClasses and the master on EBS.
    ebs = curvine.kube.get_object("storage.k8s.io/v1", "StorageClass", "hpkv-ebs-gp3")
    assert ebs["provisioner"] == "ebs.csi.aws.com"
    assert ebs["volumeBindingMode"] == "WaitForFirstConsumer"
    assert ebs["parameters"]["type"] == "gp3"
    l2 = curvine.kube.get_object("storage.k8s.io/v1", "StorageClass", "curvine-sc")
    assert l2["provisioner"] == "curvine"
    assert l2["parameters"] == {
        "master-addrs": "curvine-master-0.curvine-master.curvine.svc.cluster.local:8995",
        "fs-path": "/l2cache",
        "path-type": "DirectoryOrCreate",
    }

    # Helm: both releases at revision 1, values generated from hpkv.yaml and the nodes.
    assert _revisions(curvine, "curvine") == [1]
    assert _revisions(curvine, "curvine-csi") == [1]
    values = curvine.values(1)
    assert values["cluster"] == dict.fromkeys(
        ("formatJournal", "formatMaster", "formatWorker"), False
    )
    assert values["master"]["storage"]["meta"]["storageClass"] == "hpkv-ebs-gp3"
    assert values["worker"]["replicas"] == 2
    assert values["worker"]["nodeSelector"] == {"sagemaker.amazonaws.com/compute-type": "hyperpod"}
    data_dir = values["worker"]["storage"]["dataDirs"][0]
    # 1900Gi of node disk, 20% reserved.
    assert data_dir["hostPath"] == "/opt/dlami/nvme/curvine-data"
    assert data_dir["size"] == "1520Gi"
    assert values["configOverrides"]["master"]["enable_quota_eviction"] is True
    assert values["configOverrides"]["client"]["ttl_action"] == "delete"
    worker = curvine.kube.get_object("apps/v1", "StatefulSet", "curvine-worker", "curvine")
    assert worker["spec"]["replicas"] == 2
    csi = curvine.values(1, release="curvine-csi")
    assert csi["node"]["sidecars"]["nodeDriverRegistrar"]["image"].startswith("registry.k8s.io/")
    assert csi["controller"]["sidecars"]["provisioner"]["image"].startswith("registry.k8s.io/")
    node_plugin = curvine.kube.get_object("apps/v1", "DaemonSet", "curvine-csi-node", "curvine")
    assert node_plugin["spec"]["template"]["spec"]["containers"][0]["securityContext"] == {
        "privileged": True
    }

    # The L2 PVC in the endpoint's namespace, Bound.
    pvc = _pvcs(curvine, "team-a")["curvine-pvc"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["storageClassName"] == "curvine-sc"
    assert pvc["status"]["phase"] == "Bound"

    # status: everything OK.
    code, checks, result = _status(curvine)
    assert code == 0, result
    assert {name: c["state"] for name, c in checks.items()} == {
        "ebs-csi-addon": "ok",
        "ebs-csi-permissions": "ok",
        "releases": "ok",
        "master-storage-class": "ok",
        "master": "ok",
        "workers": "ok",
        "capacity": "ok",
        "csi-node": "ok",
        "kernel": "ok",
        "pvcs": "ok",
    }
    assert "live 2, lost 0, GPU nodes 2" in checks["workers"]["evidence"]
    assert "curvine 0.4.1 revision 1 deployed" in checks["releases"]["evidence"]

    # A second apply changes nothing: zero mutating calls, no helm upgrade.
    mark = scenario.mark()
    again = _apply(curvine, "--yes")
    assert again.exit_code == 0, again
    assert "curvine: nothing to do" in again.stdout
    assert scenario.writes_since(mark) == []
    assert _revisions(curvine, "curvine") == [1]
    assert _revisions(curvine, "curvine-csi") == [1]

    # remove: StorageClass and charts go; the L2 PVC (cached KV blocks), the master's EBS
    # volumes and the add-on stay unless a flag names them.
    removed = scenario.hpkv("curvine", "remove", "--cluster", "demo", "--yes")
    assert removed.exit_code == 0, removed
    assert "applied 3 change(s)" in removed.stdout
    assert "the master's metadata/journal volumes" in removed.stdout
    assert "L2 PVC team-a/curvine-pvc and its cached KV blocks (--delete-data" in removed.stdout
    assert "deleting them needs it back: 'hpkv curvine apply'" in " ".join(removed.stdout.split())
    assert "curvine-pvc" in _pvcs(curvine, "team-a")
    assert curvine.kube.get_object("storage.k8s.io/v1", "StorageClass", "curvine-sc") is None
    assert curvine.history("curvine") == []
    assert curvine.history("curvine-csi") == []
    assert set(_pvcs(curvine, "curvine")) == MASTER_PVCS
    assert curvine.eks.addons[("hpkv-eks", "aws-ebs-csi-driver")].status == "ACTIVE"

    mark = scenario.mark()
    twice = scenario.hpkv("curvine", "remove", "--cluster", "demo", "--yes")
    assert twice.exit_code == 0, twice
    assert "curvine: nothing to do" in twice.stdout
    assert scenario.writes_since(mark) == []


def test_dry_run_shows_the_values_diff_and_changes_nothing(curvine: CurvineEnv) -> None:
    assert _apply(curvine, "--yes").exit_code == 0
    env = {"HPKV_CURVINE__EVICTION__HIGH_WATERMARK": "0.9"}
    mark = curvine.scenario.mark()
    dry = _apply(curvine, "--dry-run", env=env)
    assert dry.exit_code == 0, dry
    assert "-    quota_eviction_high_rate: 0.8" in dry.stdout
    assert "+    quota_eviction_high_rate: 0.9" in dry.stdout
    assert "dry run: nothing was changed" in dry.stdout
    assert curvine.scenario.writes_since(mark) == []
    assert _revisions(curvine, "curvine") == [1]

    applied = _apply(curvine, "--yes", env=env)
    assert applied.exit_code == 0, applied
    assert "applied 1 change(s)" in applied.stdout
    assert _revisions(curvine, "curvine") == [1, 2]
    assert curvine.values(2)["configOverrides"]["master"]["quota_eviction_high_rate"] == 0.9
    assert _revisions(curvine, "curvine-csi") == [1]


def test_first_install_of_an_old_chart_formats_once_and_turns_the_flags_off(
    curvine: CurvineEnv,
) -> None:
    env = {"HPKV_CURVINE__CHART_VERSION": "0.3.1-alpha"}
    dry = _apply(curvine, "--dry-run", env=env)
    assert "format flags to bootstrap" in dry.stdout
    result = _apply(curvine, "--yes", env=env)
    assert result.exit_code == 0, result
    # Revision 1 starts the master with the flags on new, empty volumes; revision 2 turns them off.
    assert curvine.format_flags_by_revision() == {1: True, 2: False}
    assert "turn the format flags off" in result.stderr

    mark = curvine.scenario.mark()
    again = _apply(curvine, "--yes", env=env)
    assert again.exit_code == 0, again
    assert curvine.scenario.writes_since(mark) == []

    # The cluster exists now: a values change never sends the flags.
    env["HPKV_CURVINE__EVICTION__TTL"] = "12h"
    changed = _apply(curvine, "--yes", env=env)
    assert changed.exit_code == 0, changed
    assert curvine.format_flags_by_revision() == {1: True, 2: False, 3: False}


def test_format_flags_go_off_even_when_the_master_never_starts(curvine: CurvineEnv) -> None:
    curvine.player.stalled.add("curvine-master")
    env = {"HPKV_CURVINE__CHART_VERSION": "0.3.1-alpha", "HPKV_TIMEOUT": "2s"}
    result = _apply(curvine, "--yes", env=env)
    assert result.exit_code == 1, result
    assert "timed out after 2s waiting for Curvine master pods to start" in result.stderr
    assert "the format flags have been turned off" in result.stderr
    assert curvine.format_flags_by_revision() == {1: True, 2: False}


def test_apply_waits_for_curvine_to_run_unless_no_wait(curvine: CurvineEnv) -> None:
    curvine.player.stalled.add("curvine-worker")
    no_wait = _apply(curvine, "--yes", "--no-wait")
    assert no_wait.exit_code == 0, no_wait
    assert "not waiting for Curvine's pods or the PVCs (--no-wait)" in " ".join(
        no_wait.stdout.split()
    )
    assert "pod(s) Ready" not in no_wait.stdout

    # A change (here a values change) waits for the pods; the workers never start.
    env = {"HPKV_CURVINE__EVICTION__TTL": "12h", "HPKV_TIMEOUT": "2s"}
    result = _apply(curvine, "--yes", env=env)
    assert result.exit_code == 1, result
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "timed out after 2s waiting for Curvine worker pods to start: 0/2 worker" in last
    assert "rerun 'hpkv curvine apply' once they run" in last
    assert _revisions(curvine, "curvine") == [1, 2]

    # Nothing left to change: a rerun does not wait for pods (status reports them).
    again = _apply(curvine, "--yes", env=env)
    assert again.exit_code == 0, again
    assert "curvine: nothing to do" in again.stdout


def test_reinstall_over_kept_volumes_never_formats(curvine: CurvineEnv) -> None:
    env = {"HPKV_CURVINE__CHART_VERSION": "0.3.1-alpha"}
    assert _apply(curvine, "--yes").exit_code == 0
    removed = curvine.scenario.hpkv("curvine", "remove", "--cluster", "demo", "--yes")
    assert removed.exit_code == 0, removed
    assert set(_pvcs(curvine, "curvine")) == MASTER_PVCS

    # No release, but the master's volumes hold data: the old chart is installed without flags.
    result = _apply(curvine, "--yes", env=env)
    assert result.exit_code == 0, result
    assert curvine.format_flags_by_revision() == {1: False}


def test_rerun_after_a_crash_between_install_and_flag_reset_never_sends_the_flags(
    curvine: CurvineEnv,
) -> None:
    env = {"HPKV_CURVINE__CHART_VERSION": "0.3.1-alpha"}
    # What a run killed right after its first step leaves: revision 1 with the flags on.
    dry = _apply(curvine, "--dry-run", "-o", "json", env=env)
    plan = json.loads(dry.stdout)["plans"][0]
    [release] = [a for a in plan["actions"] if a["target"] == "helm release curvine/curvine"]
    first_values = dict(release["after"])
    first_values["cluster"] = dict.fromkeys(("formatMaster", "formatWorker", "formatJournal"), True)
    assert (
        _apply(curvine, "--yes", env={**env, "HPKV_CURVINE__CHART_VERSION": "0.4.1"}).exit_code == 0
    )
    curvine.helm("uninstall", "curvine", "-n", "curvine")
    curvine.helm(
        "install", "curvine", "curvine", "--repo", curvine.repo_url, "--version", "0.3.1-alpha",
        "-n", "curvine", "-f", "-", input=json.dumps(first_values),
    )  # fmt: skip
    assert curvine.format_flags_by_revision() == {1: True}

    code, checks, result = _status(curvine)
    assert code == 2, result
    assert checks["releases"]["state"] == "fail"
    assert "format flags left ON" in checks["releases"]["evidence"]

    rerun = _apply(curvine, "--yes", env=env)
    assert rerun.exit_code == 0, rerun
    assert "this apply turns them off" in rerun.stdout
    assert curvine.format_flags_by_revision() == {1: True, 2: False}
    code, checks, _ = _status(curvine)
    assert checks["releases"]["state"] == "ok"


def test_reformat_needs_confirmation_and_names_what_it_deletes(curvine: CurvineEnv) -> None:
    assert _apply(curvine, "--yes").exit_code == 0
    pods_before = _master_pod_uid(curvine)

    mark = curvine.scenario.mark()
    refused = _apply(curvine, "--reformat")
    assert refused.exit_code == 2, refused
    assert "REFORMAT: deletes all Curvine metadata and journal" in refused.stdout
    assert "journal-curvine-master-0" in refused.stdout
    assert "destructive" in refused.stdout
    assert refused.stderr.strip().count("\n") == 0
    assert "without confirmation" in refused.stderr
    assert curvine.scenario.writes_since(mark) == []
    assert _revisions(curvine, "curvine") == [1]

    declined = _apply(curvine, "--reformat", "--dry-run")
    assert declined.exit_code == 0
    assert _revisions(curvine, "curvine") == [1]

    done = _apply(curvine, "--reformat", "--yes")
    assert done.exit_code == 0, done
    assert curvine.format_flags_by_revision() == {1: False, 2: True, 3: False}
    assert _master_pod_uid(curvine) != pods_before


def test_reformat_without_an_installed_cluster_is_a_usage_error(curvine: CurvineEnv) -> None:
    result = _apply(curvine, "--reformat", "--yes")
    assert result.exit_code == 2, result
    assert "no Curvine release curvine/curvine to reformat" in result.stderr
    assert curvine.history("curvine") == []


def _master_pod_uid(curvine: CurvineEnv) -> str:
    def get() -> Any:
        return curvine.kube.get_object("v1", "Pod", "curvine-master-0", "curvine")

    curvine.kube.wait_until(lambda: get() is not None, what="the played master pod")
    return get()["metadata"]["uid"]


def test_status_ok_warning_and_critical_from_the_master_api(curvine: CurvineEnv) -> None:
    assert _apply(curvine, "--yes").exit_code == 0
    stub = curvine.stub

    stub.set_cluster(live=2)
    code, checks, result = _status(curvine)
    assert code == 0, result
    assert "Active" in checks["master"]["evidence"]
    assert "capacity 2.9 TiB" in checks["capacity"]["evidence"]
    assert any(path == "/api/overview" for path in stub.requests)

    stub.set_cluster(live=1, lost=1)
    code, checks, result = _status(curvine)
    assert code == 1, result
    assert checks["workers"]["state"] == "warn"
    assert "live 1, lost 1, GPU nodes 2" in checks["workers"]["evidence"]
    assert (
        "curvine-worker-1.curvine-worker.curvine.svc.cluster.local" in checks["workers"]["evidence"]
    )

    stub.set_cluster(live=2, used_ratio=0.93)
    code, checks, result = _status(curvine)
    assert code == 1, result
    assert checks["capacity"]["state"] == "warn"
    assert "93% full" in checks["capacity"]["evidence"]
    assert "high watermark 80%" in checks["capacity"]["evidence"]

    stub.set_cluster(live=2)
    node = curvine.scenario.node_names[1]
    add_nodes(curvine.kube, [node], kernel="6.1.112-124.190.amzn2023.x86_64")
    code, checks, result = _status(curvine)
    assert code == 1, result
    assert checks["kernel"]["state"] == "warn"
    assert node in checks["kernel"]["evidence"]
    assert curvine.scenario.node_names[0] not in checks["kernel"]["evidence"]

    stub.set_cluster(live=2, state="Standby")
    code, checks, result = _status(curvine)
    assert code == 2, result
    assert checks["master"]["state"] == "fail"
    assert "no Active master" in checks["master"]["evidence"]

    table = curvine.scenario.hpkv("curvine", "status", "--cluster", "demo")
    assert table.exit_code == 2
    assert "overall: CRITICAL" in table.stdout


def test_status_before_install_warns_and_names_the_fix(curvine: CurvineEnv) -> None:
    code, checks, result = _status(curvine)
    assert code == 1, result
    assert checks["ebs-csi-addon"]["state"] == "warn"
    assert "run 'hpkv curvine apply'" in checks["ebs-csi-addon"]["remediation"]
    assert checks["releases"]["state"] == "warn"
    assert "curvine not installed" in checks["releases"]["evidence"]
    assert "master" not in checks
    assert "csi-node" not in checks
    assert checks["pvcs"]["state"] == "warn"
    assert "team-a: missing" in checks["pvcs"]["evidence"]


def test_remove_delete_flags_delete_the_l2_pvcs_and_master_volumes_after_confirmation(
    curvine: CurvineEnv,
) -> None:
    assert _apply(curvine, "--yes").exit_code == 0
    flags = ("--delete-data", "--delete-volumes")
    refused = curvine.scenario.hpkv("curvine", "remove", "--cluster", "demo", *flags)
    assert refused.exit_code == 2
    assert "delete (destructive)" in refused.stdout
    assert set(_pvcs(curvine, "curvine")) == MASTER_PVCS
    assert "curvine-pvc" in _pvcs(curvine, "team-a")

    removed = curvine.scenario.hpkv("curvine", "remove", "--cluster", "demo", *flags, "--yes")
    assert removed.exit_code == 0, removed
    assert set(_pvcs(curvine, "curvine")) == set()
    assert "curvine-pvc" not in _pvcs(curvine, "team-a")


def test_remove_refuses_while_an_inference_pod_mounts_the_pvc(curvine: CurvineEnv) -> None:
    assert _apply(curvine, "--yes").exit_code == 0
    curvine.kube.apply_object(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "llama-a-0", "namespace": "team-a"},
            "spec": {
                "containers": [{"name": "vllm", "image": "vllm"}],
                "volumes": [{"name": "l2", "persistentVolumeClaim": {"claimName": "curvine-pvc"}}],
            },
        }
    )
    mark = curvine.scenario.mark()
    result = curvine.scenario.hpkv("curvine", "remove", "--cluster", "demo", "--yes")
    assert result.exit_code == 1, result
    assert "mounted by pod(s) llama-a-0" in result.stderr
    assert "hpkv l2 remove" in result.stderr
    assert curvine.scenario.writes_since(mark) == []


def test_an_existing_suitable_ebs_class_is_reused(curvine: CurvineEnv) -> None:
    curvine.kube.apply_object(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": "gp3",
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": "ebs.csi.aws.com",
            "volumeBindingMode": "WaitForFirstConsumer",
            "parameters": {"type": "gp3"},
        }
    )
    result = _apply(curvine, "--yes")
    assert result.exit_code == 0, result
    assert "reused for the master's metadata and journal" in result.stdout
    assert curvine.kube.get_object("storage.k8s.io/v1", "StorageClass", "hpkv-ebs-gp3") is None
    assert curvine.values(1)["master"]["storage"]["journal"]["storageClass"] == "gp3"


def test_an_addon_without_a_role_gets_the_irsa_role(curvine: CurvineEnv) -> None:
    curvine.eks.seed_addon("hpkv-eks", "aws-ebs-csi-driver", "v1.48.0-eksbuild.1")
    result = _apply(curvine, "--yes")
    assert result.exit_code == 0, result
    [(op, params)] = curvine.eks.addon_requests
    assert op == "UpdateAddon"
    assert params["serviceAccountRoleArn"].endswith(":role/hpkv-hpkv-eks-ebs-csi")
    assert curvine.eks.addons[("hpkv-eks", "aws-ebs-csi-driver")].status == "ACTIVE"


def test_changing_master_replicas_after_install_is_refused(curvine: CurvineEnv) -> None:
    assert _apply(curvine, "--yes").exit_code == 0
    mark = curvine.scenario.mark()
    result = _apply(curvine, "--yes", env={"HPKV_CURVINE__MASTER_REPLICAS": "3"})
    assert result.exit_code == 1, result
    assert "cannot change after install" in result.stderr
    assert "curvine.masterReplicas" in result.stderr
    assert curvine.scenario.writes_since(mark) == []


def test_no_gpu_nodes_is_a_precondition_failure(
    scenario: Any, curvine_chart_repo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario.hyperpod()
    scenario.nodes(1, gpus=0)
    monkeypatch.setenv("HPKV_HELM", curvine_chart_repo.helm)
    monkeypatch.setenv("HPKV_CURVINE__CHART_REPO", curvine_chart_repo.url)
    # PVC namespaces given, so the stage does not wait for the operator's endpoint API first
    (scenario.workdir / "hpkv.yaml").write_text("curvine:\n  pvcNamespaces: [team-a]\n")
    result = scenario.hpkv("curvine", "apply", "--cluster", "demo", "--yes")
    assert result.exit_code == 1, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "no HyperPod GPU nodes" in lines[0]
    assert "Fix:" in lines[0]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"HPKV_CURVINE__EVICTION__LOW_WATERMARK": "0.9"},
            "lowWatermark (0.9) must be below highWatermark (0.8)",
        ),
        ({"HPKV_CURVINE__MASTER_REPLICAS": "2"}, "HPKV_CURVINE__MASTER_REPLICAS is 2"),
        ({"HPKV_CURVINE__CAPACITY_RESERVE": "lots"}, "HPKV_CURVINE__CAPACITY_RESERVE is 'lots'"),
    ],
)
def test_bad_configuration_is_one_line_usage_error(
    scenario: Any, env: dict[str, str], message: str
) -> None:
    result = scenario.hpkv("curvine", "apply", "--cluster", "demo", "--yes", env=env)
    assert result.exit_code == 2, result
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr


def test_an_addon_with_the_users_own_role_keeps_it_and_gains_the_hyperpod_permissions(
    curvine: CurvineEnv,
) -> None:
    iam = curvine.scenario.aws.client("iam")
    role = iam.create_role(RoleName="team-ebs-csi", AssumeRolePolicyDocument="{}")["Role"]
    curvine.eks.seed_addon(
        "hpkv-eks", "aws-ebs-csi-driver", "v1.48.0-eksbuild.1", service_account_role_arn=role["Arn"]
    )
    result = _apply(curvine, "--yes")
    assert result.exit_code == 0, result
    assert curvine.eks.addon_requests == []
    inline = iam.get_role_policy(RoleName="team-ebs-csi", PolicyName="hpkv-hyperpod-volume-attach")
    assert "sagemaker:AttachClusterNodeVolume" in inline["PolicyDocument"]["Statement"][0]["Action"]
    roles = [r["RoleName"] for r in iam.list_roles()["Roles"]]
    assert "hpkv-hpkv-eks-ebs-csi" not in roles
    code, checks, status = _status(curvine)
    assert code == 0, status
    assert checks["ebs-csi-permissions"]["state"] == "ok"
    assert "team-ebs-csi" in checks["ebs-csi-permissions"]["evidence"]


def test_a_local_chart_directory_works_and_its_version_is_checked(curvine: CurvineEnv) -> None:
    directory = str(curvine.chart_directory)
    env = {"HPKV_CURVINE__CHART_REPO": directory}
    result = _apply(curvine, "--yes", env=env)
    assert result.exit_code == 0, result
    [entry] = curvine.history("curvine")
    assert entry["chart"] == "curvine-0.4.1"

    missing = _apply(curvine, "--dry-run", env={**env, "HPKV_CURVINE__CHART_VERSION": "0.9.9"})
    assert missing.exit_code == 1, missing
    assert "chart curvine-csi 0.9.9 not found in" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_status_finds_the_active_master_among_three(curvine: CurvineEnv) -> None:
    env = {"HPKV_CURVINE__MASTER_REPLICAS": "3"}
    assert _apply(curvine, "--yes", env=env).exit_code == 0
    sc = curvine.kube.get_object("storage.k8s.io/v1", "StorageClass", "curvine-sc")
    assert sc["parameters"]["master-addrs"].split(",") == [
        f"curvine-master-{i}.curvine-master.curvine.svc.cluster.local:8995" for i in range(3)
    ]
    standby, active = curvine.stub, MasterStub()
    try:
        standby.set_cluster(live=2, state="Standby")
        active.set_cluster(live=1, lost=1)
        active.overview["master_addr"] = "curvine-master-2.curvine-master.curvine.svc:8995"
        routes = {
            "curvine/services/curvine-master:9000": standby.url,
            "curvine/pods/curvine-master-0:9000": standby.url,
            "curvine/pods/curvine-master-1:9000": standby.url,
            "curvine/pods/curvine-master-2:9000": active.url,
        }
        result = curvine.scenario.hpkv(
            "curvine", "status", "--cluster", "demo", "-o", "json",
            env={**env, "HPKV_INCLUSTER_ROUTES": json.dumps(routes)},
        )  # fmt: skip
        checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
        assert checks["master"]["state"] == "ok", result
        assert "curvine-master-2" in checks["master"]["evidence"]
        assert "lost 1" in checks["workers"]["evidence"]
        assert "/api/workers" in active.requests
        assert "/api/workers" not in standby.requests
    finally:
        active.stop()


def test_ebs_csi_addon_version_is_chosen_as_eksctl_and_updates_wait_on_the_update_id(
    curvine: CurvineEnv,
) -> None:
    curvine.eks.seed_addon("hpkv-eks", "aws-ebs-csi-driver", "v1.47.0-eksbuild.2")
    env = {"HPKV_CURVINE__EBS_CSI__ADDON_VERSION": "v9.9.9"}
    mark = curvine.scenario.mark()
    unknown = _apply(curvine, "--yes", env=env)
    assert unknown.exit_code == 2, unknown
    lines = unknown.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "curvine.ebsCsi.addonVersion: aws-ebs-csi-driver v9.9.9 is not available" in lines[0]
    assert "v1.48.0-eksbuild.1" in lines[0]
    assert curvine.scenario.writes_since(mark) == []

    curvine.eks.transition_describes = 3
    aws_mark = curvine.scenario.aws.mark()
    result = _apply(curvine, "--yes", env={"HPKV_CURVINE__EBS_CSI__ADDON_VERSION": "latest"})
    assert result.exit_code == 0, result
    assert "version v1.47.0-eksbuild.2 -> v1.48.0-eksbuild.1 (latest)" in result.stdout
    [(op, params)] = curvine.eks.addon_requests
    assert op == "UpdateAddon"
    assert params["addonVersion"] == "v1.48.0-eksbuild.1"
    assert params["serviceAccountRoleArn"].endswith(":role/hpkv-hpkv-eks-ebs-csi")
    assert params["resolveConflicts"] == "PRESERVE"
    calls = [str(c) for c in curvine.scenario.aws.calls_since(aws_mark)]
    after = calls[calls.index("eks:UpdateAddon -> 200") + 1 :]
    # Waited on DescribeUpdate until Successful (3 InProgress answers), never a second update.
    assert after[:4] == ["eks:DescribeUpdate -> 200"] * 4
    assert calls.count("eks:UpdateAddon -> 200") == 1
    addon = curvine.eks.addons[("hpkv-eks", "aws-ebs-csi-driver")]
    assert (addon.version, addon.status) == ("v1.48.0-eksbuild.1", "ACTIVE")

    # 'default' (and the empty value of older hpkv.yaml files) keeps the installed version.
    mark = curvine.scenario.mark()
    for value in ("default", ""):
        again = _apply(curvine, "--yes", env={"HPKV_CURVINE__EBS_CSI__ADDON_VERSION": value})
        assert again.exit_code == 0, again
        assert "curvine: nothing to do" in again.stdout
    assert curvine.scenario.writes_since(mark) == []


def test_ebs_csi_role_trust_drift_is_shown_and_fixed_only_with_yes(curvine: CurvineEnv) -> None:
    assert _apply(curvine, "--yes").exit_code == 0
    iam = curvine.scenario.aws.client("iam")
    role = "hpkv-hpkv-eks-ebs-csi"
    trust = iam.get_role(RoleName=role)["Role"]["AssumeRolePolicyDocument"]
    [statement] = trust["Statement"]
    host = next(k for k in statement["Condition"]["StringEquals"] if k.endswith(":sub"))[:-4]
    wrong = "system:serviceaccount:kube-system:someone-else"
    statement["Condition"]["StringEquals"][f"{host}:sub"] = wrong
    other = {
        "Effect": "Allow",
        "Principal": {"Service": "ec2.amazonaws.com"},
        "Action": "sts:AssumeRole",
    }
    drifted = {"Version": "2012-10-17", "Statement": [statement, other]}
    iam.update_assume_role_policy(RoleName=role, PolicyDocument=json.dumps(drifted))

    mark = curvine.scenario.mark()
    dry = _apply(curvine, "--dry-run")
    assert dry.exit_code == 0, dry
    assert "trust policy drift NOT fixed" in dry.stdout
    assert f'-          "{host}:sub": "{wrong}"' in dry.stdout
    assert (
        f'+          "{host}:sub": "system:serviceaccount:kube-system:ebs-csi-controller-sa"'
        in (dry.stdout)
    )
    assert curvine.scenario.writes_since(mark) == []

    fixed = _apply(curvine, "--yes")
    assert fixed.exit_code == 0, fixed
    assert curvine.scenario.writes_since(mark) == ["iam:UpdateAssumeRolePolicy -> 200"]
    statements = iam.get_role(RoleName=role)["Role"]["AssumeRolePolicyDocument"]["Statement"]
    assert other in statements  # another principal's statement is kept
    subjects = [
        s["Condition"]["StringEquals"][f"{host}:sub"] for s in statements if "Condition" in s
    ]
    assert subjects == ["system:serviceaccount:kube-system:ebs-csi-controller-sa"]
