"""`hpkv diagnose --iam`: the policy simulator asked for the caller and the EBS CSI driver's role;
what is missing, and a least-privilege policy that really fixes it."""

from __future__ import annotations

import json

import pytest

from hpkv.health import iam as preflight
from tests.harness.aws import Fault
from tests.harness.scenario import Scenario
from tests.health.conftest import validate

pytestmark = [pytest.mark.kube, pytest.mark.aws]

ACCOUNT = "123456789012"
CLUSTER_ARN = f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:cluster/demo0001"
EKS_ARN = f"arn:aws:eks:us-west-2:{ACCOUNT}:cluster/hpkv-eks"
STAGE_1 = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Action": ["sagemaker:DescribeCluster", "sagemaker:UpdateCluster"],
            "Resource": CLUSTER_ARN,
        },
        {"Effect": "Allow", "Action": "eks:DescribeCluster", "Resource": EKS_ARN},
        {"Effect": "Allow", "Action": "sts:GetCallerIdentity", "Resource": "*"},
    ],
}


def _iam(scenario: Scenario, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    result = scenario.hpkv("diagnose", "--iam", "--cluster", "demo", "-o", "json", *args, env=env)
    assert result.exception is None, result
    document = json.loads(result.stdout)
    validate(document, "diagnose")
    assert document["detectors"] == []  # --iam alone runs no detectors
    return result.exit_code, document["iam"]


def _principal(report: dict, name: str) -> dict:
    return next(p for p in report["principals"] if p["principal"] == name)


def test_missing_actions_and_a_policy_that_grants_exactly_them(scenario: Scenario) -> None:
    scenario.hyperpod()
    user = scenario.aws.extensions["iam"].seed_user("hpkv", policies={"stage1": STAGE_1})
    code, report = _iam(scenario)
    caller = _principal(report, "caller")
    assert caller["arn"] == caller["simulatedArn"] == user
    missing = {(m["stage"], m["action"]) for m in caller["missing"]}
    assert ("tiered-storage", "sagemaker:UpdateCluster") not in missing
    assert not any(stage in ("common", "tiered-storage") for stage, _a in missing)
    assert ("operator", "eks:CreateAddon") in missing
    assert ("diagnose", "iam:SimulatePrincipalPolicy") in missing
    assert code == 2 and report["state"] == "CRITICAL"
    policy = caller["policy"]
    statements = {s["Resource"]: s for s in policy["Statement"]}
    assert "eks:CreateAddon" in statements[EKS_ARN]["Action"]
    assert (
        statements[f"arn:aws:iam::{ACCOUNT}:user/hpkv"]["Action"] == "iam:SimulatePrincipalPolicy"
    )

    scenario.aws.client("iam").put_user_policy(
        UserName="hpkv", PolicyName="suggested", PolicyDocument=json.dumps(policy)
    )
    code, report = _iam(scenario)
    caller = _principal(report, "caller")
    assert caller["missing"] == [] and caller["policy"] is None
    assert caller["checked"] > 20
    assert code == 0


def test_stage_filter_checks_only_those_stages(scenario: Scenario) -> None:
    scenario.hyperpod()
    scenario.aws.extensions["iam"].seed_user("hpkv", policies={"stage1": STAGE_1})
    code, report = _iam(scenario, "--stage", "tiered-storage")
    assert _principal(report, "caller")["missing"] == []
    assert code == 0
    table = scenario.hpkv("diagnose", "--iam", "--cluster", "demo", "--stage", "tiered-storage")
    assert "IAM caller arn:aws:iam::123456789012:user/hpkv: all 4 actions allowed" in table.stdout


def test_explicit_deny_is_reported_and_not_papered_over(scenario: Scenario) -> None:
    scenario.hyperpod()
    deny = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "*", "Resource": "*"},
            {"Effect": "Deny", "Action": "sagemaker:UpdateCluster", "Resource": "*"},
        ],
    }
    scenario.aws.extensions["iam"].seed_user("hpkv", policies={"admin-but": deny})
    code, report = _iam(scenario)
    [missing] = _principal(report, "caller")["missing"]
    assert missing["action"] == "sagemaker:UpdateCluster"
    assert missing["decision"] == "explicitDeny"
    assert _principal(report, "caller")["policy"] is None
    assert code == 2
    table = scenario.hpkv("diagnose", "--iam", "--cluster", "demo")
    assert "an Allow cannot override it" in table.stdout


def test_an_assumed_role_is_simulated_as_its_role(scenario: Scenario) -> None:
    scenario.hyperpod()
    role = scenario.aws.extensions["iam"].seed_role(
        "operator", path="/hpkv/", policies={"all": {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": "*", "Resource": "*"}]}},
    )  # fmt: skip
    credentials = scenario.aws.client("sts").assume_role(RoleArn=role, RoleSessionName="oncall")[
        "Credentials"
    ]
    env = {
        "AWS_ACCESS_KEY_ID": credentials["AccessKeyId"],
        "AWS_SECRET_ACCESS_KEY": credentials["SecretAccessKey"],
        "AWS_SESSION_TOKEN": credentials["SessionToken"],
    }
    code, report = _iam(scenario, env=env)
    caller = _principal(report, "caller")
    assert caller["arn"] == f"arn:aws:sts::{ACCOUNT}:assumed-role/operator/oncall"
    assert caller["simulatedArn"] == role == f"arn:aws:iam::{ACCOUNT}:role/hpkv/operator"
    assert caller["missing"] == [] and code == 0


def test_ebs_csi_role_from_its_service_account(scenario: Scenario) -> None:
    scenario.hyperpod()
    scenario.aws.extensions["iam"].seed_user("hpkv", policies={"stage1": STAGE_1})
    partial = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": "sagemaker:DetachClusterNodeVolume",
                "Resource": CLUSTER_ARN,
            },
            {"Effect": "Allow", "Action": "eks:DescribeCluster", "Resource": "*"},
        ],
    }
    role = scenario.aws.extensions["iam"].seed_role("ebs-csi", policies={"partial": partial})
    scenario.kube.apply_object(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {
                "name": "ebs-csi-controller-sa",
                "namespace": "kube-system",
                "annotations": {"eks.amazonaws.com/role-arn": role},
            },
        }
    )
    _code, report = _iam(scenario, "--stage", "tiered-storage")
    ebs = _principal(report, "ebs-csi-driver")
    assert (
        ebs["arn"] == role
        and "annotation of ServiceAccount kube-system/ebs-csi-controller-sa" in ebs["note"]
    )
    missing = {m["action"]: m for m in ebs["missing"]}
    assert set(missing) == {"sagemaker:AttachClusterNodeVolume", "eks:Describe*"}
    assert missing["sagemaker:AttachClusterNodeVolume"]["resource"] == CLUSTER_ARN
    assert "eks:DescribeAddon" in missing["eks:Describe*"]["deniedActions"]
    assert "eks:DescribeCluster" not in missing["eks:Describe*"]["deniedActions"]
    statements = {s["Resource"]: s["Action"] for s in ebs["policy"]["Statement"]}
    assert statements == {CLUSTER_ARN: "sagemaker:AttachClusterNodeVolume", "*": "eks:Describe*"}


def test_without_the_ebs_csi_driver_it_says_so(scenario: Scenario) -> None:
    scenario.hyperpod()
    scenario.aws.extensions["iam"].seed_user("hpkv", policies={"stage1": STAGE_1})
    _code, report = _iam(scenario, "--stage", "tiered-storage")
    ebs = _principal(report, "ebs-csi-driver")
    assert ebs["arn"] == "" and ebs["note"].startswith("not checked: no ServiceAccount kube-system")


def test_a_caller_that_may_not_simulate_gets_unknown_and_the_fix(scenario: Scenario) -> None:
    scenario.hyperpod()
    scenario.aws.extensions["iam"].seed_user("hpkv", policies={"stage1": STAGE_1})
    scenario.aws.inject(Fault("iam", "SimulatePrincipalPolicy", kind="deny", times=-1))
    code, report = _iam(scenario, "--stage", "tiered-storage")
    error = _principal(report, "caller")["error"]
    assert "allow iam:SimulatePrincipalPolicy on arn:aws:iam::123456789012:user/hpkv" in error
    assert code == 3


def test_every_stage_has_an_action_list() -> None:
    groups = preflight.stage_actions()
    assert list(groups) == [
        "common",
        "tiered-storage",
        "operator",
        "curvine",
        "l2",
        "bench",
        "init",
        "diagnose",
    ]
    assert {n.action for n in groups["tiered-storage"]} == {
        "sagemaker:DescribeCluster",
        "sagemaker:UpdateCluster",
    }
    assert "iam:CreateOpenIDConnectProvider" in {n.action for n in groups["operator"]}
    assert len(preflight.expand("eks:Describe*")) > 5


# What S3 checks for operations whose IAM action is named differently.
S3_ACTIONS = {
    "HeadBucket": "s3:ListBucket",
    "ListObjectVersions": "s3:ListBucketVersions",
    "DeleteObjects": "s3:DeleteObject",
}
WAITER_OPERATIONS = {
    ("eks", "addon_active"): "DescribeAddon",
    ("eks", "addon_deleted"): "DescribeAddon",
}


def _called_actions() -> set[str]:
    """IAM actions of every AWS operation hpkv's code calls: client methods, paginators and
    waiters found in the source, checked against botocore's models."""
    import re
    from pathlib import Path

    import botocore.session
    from botocore import xform_name

    import hpkv

    session = botocore.session.get_session()
    services = ("sagemaker", "eks", "iam", "sts", "s3")
    operations = {
        svc: {xform_name(op): op for op in session.get_service_model(svc).operation_names}
        for svc in services
    }
    method = re.compile(r"\b(sagemaker|eks|iam|sts|s3)\.(\w+)\(")
    helper = re.compile(r"\b(sagemaker|eks|iam|sts|s3)\.get_(paginator|waiter)\(\s*\"(\w+)\"")
    actions: set[str] = set()
    for path in Path(hpkv.__file__).parent.rglob("*.py"):
        text = path.read_text()
        for svc, name in method.findall(text):
            if name in operations[svc]:
                actions.add(f"{svc}:{operations[svc][name]}")
        for svc, kind, name in helper.findall(text):
            op = (
                operations[svc].get(name) if kind == "paginator" else WAITER_OPERATIONS[(svc, name)]
            )
            actions.add(f"{svc}:{op}")
    return {S3_ACTIONS.get(a.split(":")[1], a) if a.startswith("s3:") else a for a in actions}


def test_every_aws_operation_the_code_calls_has_an_iam_need() -> None:
    """The preflight cannot miss an action: each one the code calls is in some group."""
    needed = {
        concrete
        for needs in preflight.stage_actions().values()
        for need in needs
        for concrete in preflight.expand(need.action)
    }
    called = _called_actions()
    assert len(called) > 30, called  # the scan finds the calls
    assert called - needed == set()
    # and the lists name no action the code never calls (PassRole/Tag* are implied by calls)
    implied = {"iam:PassRole", "iam:TagRole", "iam:TagOpenIDConnectProvider", "eks:TagResource"}
    implied |= {"s3:DeleteObjectVersion"}  # DeleteObjects with version ids
    stage_needs = {
        need.action
        for group, needs in preflight.stage_actions().items()
        if group not in ("common", "diagnose")
        for need in needs
    }
    assert stage_needs - called - implied == set()
