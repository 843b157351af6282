"""`hpkv diagnose --bundle`: contents, redaction of planted secrets everywhere, the size cap."""

from __future__ import annotations

import base64
import json
import os
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.harness.aws import HPKV_ACCESS_KEY, SECRET_KEY
from tests.harness.play import add_pod
from tests.harness.stack import CURVINE_NS, ENDPOINT, ENDPOINT_NS, OPERATOR_NS, Stack
from tests.health.conftest import ENDPOINT_NS as LIGHT_ENDPOINT_NS
from tests.health.conftest import WORKER_RS, Installation, validate, worker_container

pytestmark = [pytest.mark.kube, pytest.mark.aws]

HF_TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
DB_PASSWORD = "plain-words-but-secret-42"  # matches no pattern: only the Secret reveals it
AWS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SESSION_TOKEN = "IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLXdlc3QtMiJHMEUCIQD0example0token"
BEARER = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhZG1pbiJ9.c2lnbmF0dXJlLXBhcnQ"
EKS_TOKEN = "k8s-aws-v1.aHR0cHM6Ly9zdHMuYW1hem9uYXdzLmNvbS8_QWN0aW9uPUdldENhbGxlcklkZW50aXR5"
OPERATOR_ADDON = "amazon-sagemaker-hyperpod-inference"
EXECUTION_ROLE = "SageMakerHyperPodInference-demo"
DEBUG_POD = "llama-debug-0"
OPERATOR_POD = "hyperpod-inference-controller-manager-7f9b8c6d5-abcde"
ROUTER_POD = f"{ENDPOINT}-{ENDPOINT_NS}-router-6d9f8b7c5-x2x4z"


def _plant_secrets(stack: Stack) -> None:
    """Secrets in Kubernetes Secrets, pod env, ConfigMaps, the logs of the operator, router,
    worker, Curvine and CSI pods, an add-on's configuration, an IAM trust policy and the Curvine
    master's API."""
    kube = stack.kube
    for namespace, name, data in (
        (ENDPOINT_NS, "hf-token", {"token": HF_TOKEN}),
        (CURVINE_NS, "db", {"password": DB_PASSWORD}),
    ):
        kube.apply_object(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace},
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
            }
        )
    env = {
        "HF_TOKEN": HF_TOKEN,
        "AWS_ACCESS_KEY_ID": AWS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
        "DATABASE_URL": f"postgres://app:{DB_PASSWORD}@db:5432/cache",
        "NOTE": f"creds {AWS_KEY_ID} {DB_PASSWORD}",
    }
    add_pod(
        kube,
        ENDPOINT_NS,
        DEBUG_POD,
        node=stack.nodes[0],
        labels={"app": "llama-debug"},
        containers=[worker_container(env=env)],
    )
    kube.apply_object(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "settings",
                "namespace": ENDPOINT_NS,
                "annotations": {"example.com/auth": f"Authorization: Bearer {BEARER}"},
            },
            "data": {
                "app.env": f"HF_TOKEN={HF_TOKEN}\nDB={DB_PASSWORD}\n",
                "aws.ini": f"[default]\naws_session_token = {SESSION_TOKEN}\n",
            },
        }
    )
    worker = stack.worker_pods()[0]
    stack.log(
        ENDPOINT_NS, worker, ENDPOINT,
        f"INFO start\nDEBUG token {EKS_TOKEN}\nDEBUG sts X-Amz-Security-Token={SESSION_TOKEN}\n"
        f"DEBUG header Authorization: Bearer {BEARER}\nDEBUG connecting with {DB_PASSWORD}\n"
        f"DEBUG hf {HF_TOKEN} key {AWS_KEY_ID}/{AWS_SECRET}\n",
    )  # fmt: skip
    stack.log(ENDPOINT_NS, worker, ENDPOINT, f"crashed with {DB_PASSWORD}\n", previous=True)
    stack.log(ENDPOINT_NS, DEBUG_POD, "vllm", f"INFO debug shell\nexport HF_TOKEN={HF_TOKEN}\n")
    add_pod(
        kube,
        OPERATOR_NS,
        OPERATOR_POD,
        node=stack.nodes[0],
        owner=("ReplicaSet", OPERATOR_POD.rsplit("-", 1)[0]),
        containers=[{"name": "manager", "image": "example/operator:v3.2"}],
    )
    stack.log(OPERATOR_NS, OPERATOR_POD, "manager", f"INFO reconcile\nDEBUG bearer {BEARER}\n")
    stack.log(OPERATOR_NS, ROUTER_POD, "router", f"INFO route\nDEBUG creds {AWS_KEY_ID}\n")
    stack.log(CURVINE_NS, "curvine-master-0", "main", f"INFO master\nDEBUG {DB_PASSWORD}\n")
    stack.log(CURVINE_NS, "curvine-worker-0", "main", f"INFO worker\nDEBUG {SESSION_TOKEN}\n")
    csi = f"curvine-csi-node-{stack.nodes[0]}"
    stack.log(CURVINE_NS, csi, "main", f"INFO csi\nDEBUG {HF_TOKEN}\n")
    fsx = f"fsx-csi-node-{stack.nodes[0]}"
    stack.log("kube-system", fsx, "fsx-csi-node", f"INFO fsx\nDEBUG {AWS_SECRET}\n")
    operator = stack.aws.extensions["eks"].addons[("hpkv-eks", OPERATOR_ADDON)]
    config = json.loads(operator.configuration_values)
    operator.configuration_values = json.dumps(
        {**config, "huggingFaceToken": HF_TOKEN, "note": f"db {DB_PASSWORD}"}
    )
    iam = stack.aws.client("iam")
    trust = iam.get_role(RoleName=EXECUTION_ROLE)["Role"]["AssumeRolePolicyDocument"]
    trust["Statement"][0]["Condition"] = {"StringEquals": {"sts:ExternalId": DB_PASSWORD}}
    iam.update_assume_role_policy(RoleName=EXECUTION_ROLE, PolicyDocument=json.dumps(trust))
    stack.master.overview["cluster_id"] = f"curvine {DB_PASSWORD}"


def _members(path: Path) -> dict[str, str]:
    with tarfile.open(path) as archive:
        return {
            member.name.split("/", 1)[1]: archive.extractfile(member).read().decode()  # type: ignore[union-attr]
            for member in archive.getmembers()
            if member.isfile()
        }


def test_bundle_collects_every_stage_and_leaks_no_secret(stack: Stack, tmp_path: Path) -> None:
    stack.install()
    _plant_secrets(stack)
    target = tmp_path / "support.tar.gz"
    result = stack.scenario.hpkv(
        "diagnose", "--cluster", "demo", "-o", "json", "--bundle", str(target)
    )
    assert result.exit_code == 1, result  # WARNING: the planted ExternalId is trust drift
    document = json.loads(result.stdout)
    validate(document, "diagnose")
    assert document["bundle"]["path"] == str(target)
    assert document["bundle"]["bytes"] == target.stat().st_size
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert "collecting the support bundle" in result.stderr

    members = _members(target)
    planted = [
        HF_TOKEN, DB_PASSWORD, AWS_KEY_ID, AWS_SECRET, SESSION_TOKEN, BEARER, EKS_TOKEN,
        base64.b64encode(HF_TOKEN.encode()).decode(), SECRET_KEY, HPKV_ACCESS_KEY,
        stack.kube.tokens["hpkv"],
    ]  # fmt: skip
    for name, text in members.items():
        for secret in planted:
            assert secret not in text, f"{secret[:12]}... leaked into {name}"
            assert secret not in name

    summary = json.loads(members["summary.json"])
    assert summary["kind"] == "hpkv.diagnose"
    assert [f["id"] for f in summary["findings"]] == ["operator.irsa-trust-drift"]
    assert json.loads(members["manifest.json"])["files"] == sorted(
        set(members) - {"manifest.json"}, key=list(members).index
    )
    worker = stack.worker_pods()[0]
    for expected in (
        "hpkv.yaml",
        "aws/sagemaker-describe-cluster.json",
        "aws/eks-describe-cluster.json",
        "aws/eks-addons.json",
        "kubernetes/cluster/nodes.yaml",
        "kubernetes/aws-hyperpod/daemonsets.yaml",
        f"kubernetes/{OPERATOR_NS}/deployments.yaml",
        f"kubernetes/{ENDPOINT_NS}/pods.yaml",
        f"kubernetes/{ENDPOINT_NS}/configmaps.yaml",
        f"kubernetes/{ENDPOINT_NS}/inferenceendpointconfigs.yaml",
        f"kubernetes/{CURVINE_NS}/statefulsets.yaml",
        f"kubernetes/{CURVINE_NS}/persistentvolumeclaims.yaml",
        f"logs/{ENDPOINT_NS}/{worker}/{ENDPOINT}.log",
        f"logs/{ENDPOINT_NS}/{worker}/{ENDPOINT}.previous.log",
        f"logs/{OPERATOR_NS}/{OPERATOR_POD}/manager.log",
        f"logs/{OPERATOR_NS}/{ROUTER_POD}/router.log",
        f"logs/{CURVINE_NS}/curvine-master-0/main.log",
        f"logs/{CURVINE_NS}/curvine-worker-0/main.log",
        f"logs/{CURVINE_NS}/curvine-csi-node-{stack.nodes[0]}/main.log",
        f"logs/kube-system/fsx-csi-node-{stack.nodes[0]}/fsx-csi-node.log",
        "curvine/api-overview.json",
        "curvine/api-workers.json",
    ):
        assert expected in members, sorted(members)
    # The roles stages 2 and 3 create or use, with their trust policies.
    for role in (
        EXECUTION_ROLE, "HyperPodInference-demo-S3Csi", "HyperPodInference-demo-FsxCsi",
        "HyperPodInference-demo-Alb", "HyperPodInference-demo-Keda", "hpkv-hpkv-eks-ebs-csi",
    ):  # fmt: skip
        document = json.loads(members[f"aws/iam-roles/{role}.json"])
        assert document["AssumeRolePolicyDocument"]["Statement"], role
    execution = json.loads(members[f"aws/iam-roles/{EXECUTION_ROLE}.json"])
    condition = execution["AssumeRolePolicyDocument"]["Statement"][0]["Condition"]
    assert condition == {"StringEquals": {"sts:ExternalId": "<redacted>"}}
    addons = {a["addonName"]: a for a in json.loads(members["aws/eks-addons.json"])["addons"]}
    assert set(addons) >= {OPERATOR_ADDON, "aws-ebs-csi-driver", "cert-manager"}
    overview = json.loads(members["curvine/api-overview.json"])
    assert overview["master_state"] == "Active" and overview["cluster_id"] == "curvine <redacted>"
    workers = json.loads(members["curvine/api-workers.json"])
    assert len(workers["live_workers"]) == 2
    pods = yaml.safe_load(members[f"kubernetes/{ENDPOINT_NS}/pods.yaml"])
    debug = next(p for p in pods if p["metadata"]["name"] == DEBUG_POD)
    env = {e["name"]: e.get("value") for e in debug["spec"]["containers"][0]["env"]}
    assert env["HF_TOKEN"] == env["AWS_SECRET_ACCESS_KEY"] == "<redacted>"
    assert env["LMCACHE_REMOTE_URL"].startswith("fs://")  # ordinary values stay readable
    assert "managedFields" not in debug["metadata"]
    secrets = yaml.safe_load(members[f"kubernetes/{ENDPOINT_NS}/secrets.yaml"])
    assert secrets == [{"name": "hf-token", "type": "Opaque"}]
    log = members[f"logs/{ENDPOINT_NS}/{worker}/{ENDPOINT}.log"]
    assert "DEBUG connecting with <redacted>" in log and "INFO start" in log
    role_errors = [
        e for e in json.loads(members["manifest.json"])["errors"] if "IAM role" in e["what"]
    ]
    assert role_errors  # the seeded instance-group role does not exist in IAM: recorded


def test_size_cap_keeps_the_summary_and_drops_what_does_not_fit(
    installation: Installation, tmp_path: Path
) -> None:
    noise = os.urandom(600 * 1024).hex()  # incompressible
    installation.log(LIGHT_ENDPOINT_NS, f"{WORKER_RS}-w1", "vllm", noise, previous=True)
    target = tmp_path / "small.tgz"
    result = installation.scenario.hpkv(
        "diagnose", "--cluster", "demo", "--bundle", str(target), "--max-size", "256KiB",
        "--log-lines", "100000",
    )  # fmt: skip
    assert result.exit_code == 0, result
    assert target.stat().st_size <= 256 * 1024
    members = _members(target)
    assert "summary.json" in members and "manifest.json" in members
    skipped = json.loads(members["manifest.json"])["skipped"]
    assert {
        "name": f"logs/{LIGHT_ENDPOINT_NS}/{WORKER_RS}-w1/vllm.previous.log",
        "reason": "size cap",
    } in skipped
    assert "left out by the size cap" in result.stdout


def test_bundle_path_in_a_missing_directory_is_one_line(installation: Installation) -> None:
    result = installation.scenario.hpkv(
        "diagnose", "--cluster", "demo", "--bundle", "/nonexistent/dir/b.tar.gz"
    )
    assert result.exit_code == 3
    assert result.stderr.strip().splitlines() == [
        "hpkv: error: cannot write the bundle to /nonexistent/dir/b.tar.gz: /nonexistent/dir is "
        "not a directory. Fix: pass a path in an existing directory, e.g. --bundle "
        "./hpkv-bundle.tar.gz"
    ]
    bad_size = installation.scenario.hpkv(
        "diagnose", "--cluster", "demo", "--bundle", "x.tgz", "--max-size", "lots"
    )
    assert bad_size.exit_code == 3 and "invalid size 'lots'" in bad_size.stderr
