"""The emulator's SimulatePrincipalPolicy (moto lacks it): IAM's evaluation rules, through boto3."""

from __future__ import annotations

import json

import pytest

from tests.harness.aws import AwsEmulator

pytestmark = [pytest.mark.aws]

CLUSTER = "arn:aws:sagemaker:us-west-2:123456789012:cluster/demo0001"


def _decisions(aws: AwsEmulator, arn: str, actions: list[str], resource: str | None = None) -> dict:
    kwargs = {"PolicySourceArn": arn, "ActionNames": actions}
    if resource:
        kwargs["ResourceArns"] = [resource]
    response = aws.client("iam").simulate_principal_policy(**kwargs)
    return {r["EvalActionName"]: r["EvalDecision"] for r in response["EvaluationResults"]}


def test_allow_deny_and_wildcards(aws: AwsEmulator) -> None:
    arn = aws.extensions["iam"].seed_user(
        "alice",
        access_key_id=None,
        policies={
            "p": {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Action": "SageMaker:Describe*", "Resource": "*"},
                    {
                        "Effect": "Allow",
                        "Action": ["eks:*"],
                        "Resource": "arn:aws:eks:*:*:cluster/hpkv-?ks",
                    },
                    {"Effect": "Deny", "Action": "eks:DeleteAddon", "Resource": "*"},
                    {"Effect": "Allow", "NotAction": "iam:*", "Resource": "arn:aws:s3:::bucket"},
                ],
            }
        },
    )
    assert _decisions(aws, arn, ["sagemaker:DescribeCluster", "sagemaker:UpdateCluster"]) == {
        "sagemaker:DescribeCluster": "allowed",  # action names are case-insensitive
        "sagemaker:UpdateCluster": "implicitDeny",
    }
    eks = "arn:aws:eks:us-west-2:123456789012:cluster/hpkv-eks"
    assert _decisions(aws, arn, ["eks:CreateAddon", "eks:DeleteAddon"], eks) == {
        "eks:CreateAddon": "allowed",
        "eks:DeleteAddon": "explicitDeny",  # a Deny wins over any Allow
    }
    other = "arn:aws:eks:us-west-2:123456789012:cluster/other"
    assert _decisions(aws, arn, ["eks:CreateAddon"], other) == {"eks:CreateAddon": "implicitDeny"}
    # a statement scoped to a resource does not cover the unspecified resource "*"
    assert _decisions(aws, arn, ["eks:CreateAddon"]) == {"eks:CreateAddon": "implicitDeny"}
    bucket = "arn:aws:s3:::bucket"
    assert _decisions(aws, arn, ["s3:GetObject", "iam:GetRole"], bucket) == {
        "s3:GetObject": "allowed",
        "iam:GetRole": "implicitDeny",
    }


def test_managed_group_and_role_policies_and_conditions(aws: AwsEmulator) -> None:
    iam = aws.client("iam")
    document = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "sagemaker:UpdateCluster", "Resource": CLUSTER}
        ],
    }
    policy = iam.create_policy(PolicyName="update", PolicyDocument=json.dumps(document))
    user = aws.extensions["iam"].seed_user("bob", access_key_id=None)
    iam.create_group(GroupName="ops")
    iam.add_user_to_group(GroupName="ops", UserName="bob")
    iam.attach_group_policy(GroupName="ops", PolicyArn=policy["Policy"]["Arn"])
    response = iam.simulate_principal_policy(
        PolicySourceArn=user, ActionNames=["sagemaker:UpdateCluster"], ResourceArns=[CLUSTER]
    )
    [result] = response["EvaluationResults"]
    assert result["EvalDecision"] == "allowed"
    assert result["MatchedStatements"][0]["SourcePolicyId"] == "update"
    assert result["MatchedStatements"][0]["SourcePolicyType"] == "user-managed"

    conditional = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": "iam:PassRole",
                "Resource": "*",
                "Condition": {"StringEquals": {"iam:PassedToService": "eks.amazonaws.com"}},
            }
        ],
    }
    role = aws.extensions["iam"].seed_role("ops", policies={"pass": conditional}, path="/team/")
    response = iam.simulate_principal_policy(PolicySourceArn=role, ActionNames=["iam:PassRole"])
    [result] = response["EvaluationResults"]
    assert result["EvalDecision"] == "implicitDeny"
    assert result["MissingContextValues"] == ["iam:PassedToService"]


def test_pagination_and_unknown_principals(aws: AwsEmulator) -> None:
    arn = aws.extensions["iam"].seed_user("carol", access_key_id=None)
    paginator = aws.client("iam").get_paginator("simulate_principal_policy")
    actions = [f"sagemaker:Action{i}" for i in range(7)]
    pages = list(
        paginator.paginate(
            PolicySourceArn=arn, ActionNames=actions, PaginationConfig={"PageSize": 3}
        )
    )
    assert [len(p["EvaluationResults"]) for p in pages] == [3, 3, 1]
    iam = aws.client("iam")
    with pytest.raises(iam.exceptions.NoSuchEntityException):
        iam.simulate_principal_policy(
            PolicySourceArn="arn:aws:iam::123456789012:role/missing", ActionNames=["s3:GetObject"]
        )
