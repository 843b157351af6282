"""The EBS CSI driver as an EKS add-on, with an IRSA role that HyperPod nodes need.

On HyperPod, EBS volumes are attached through SageMaker (``sagemaker:AttachClusterNodeVolume`` /
``DetachClusterNodeVolume``) and the driver describes the EKS cluster; without these permissions an
attach fails with ValidationException. The role therefore carries the AWS managed
``AmazonEBSCSIDriverPolicy`` plus an inline policy with those actions.

Reads return ``None`` for absent resources; writes are single API calls the stage plans.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from hpkv.aws import error_code, translate_errors
from hpkv.errors import PreconditionFailed, WaitTimeout

if TYPE_CHECKING:
    from hpkv.aws import AwsClients

ADDON_NAME = "aws-ebs-csi-driver"
SERVICE_ACCOUNT_NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "ebs-csi-controller-sa"
MANAGED_POLICY_ARN = "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
INLINE_POLICY_NAME = "hpkv-hyperpod-volume-attach"
HYPERPOD_ACTIONS = (
    "sagemaker:AttachClusterNodeVolume",
    "sagemaker:DetachClusterNodeVolume",
    "eks:Describe*",
)
STS_AUDIENCE = "sts.amazonaws.com"
ROLE_TAG = {"Key": "hpkv:purpose", "Value": "ebs-csi-irsa"}


# --- documents --------------------------------------------------------------------------------
def issuer_host_path(issuer: str) -> str:
    return issuer.removeprefix("https://").rstrip("/")


def oidc_provider_arn(account: str, issuer: str) -> str:
    return f"arn:aws:iam::{account}:oidc-provider/{issuer_host_path(issuer)}"


def trust_policy(account: str, issuer: str) -> dict[str, Any]:
    host_path = issuer_host_path(issuer)
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Federated": oidc_provider_arn(account, issuer)},
                "Action": "sts:AssumeRoleWithWebIdentity",
                "Condition": {
                    "StringEquals": {
                        f"{host_path}:sub": f"system:serviceaccount:{SERVICE_ACCOUNT_NAMESPACE}:{SERVICE_ACCOUNT}",
                        f"{host_path}:aud": STS_AUDIENCE,
                    }
                },
            }
        ],
    }


def hyperpod_volume_policy() -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "HyperPodNodeVolumeAttach",
                "Effect": "Allow",
                "Action": list(HYPERPOD_ACTIONS),
                "Resource": "*",
            }
        ],
    }


def canonical_policy(document: Any) -> Any:
    """A policy document in a comparable form (parsed, one-element lists unwrapped, sorted)."""
    if isinstance(document, str):
        document = json.loads(unquote(document))
    return _canonical(document)


def _canonical(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _canonical(v) for k, v in sorted(node.items())}
    if isinstance(node, list):
        items = [_canonical(v) for v in node]
        if len(items) == 1:
            return items[0]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    return node


def same_policy(a: Any, b: Any) -> bool:
    return canonical_policy(a) == canonical_policy(b)


# --- IAM OIDC provider ------------------------------------------------------------------------
def find_oidc_provider(aws: AwsClients, account: str, issuer: str) -> str | None:
    wanted = oidc_provider_arn(account, issuer)
    with translate_errors("iam:ListOpenIDConnectProviders"):
        providers = aws.iam.list_open_id_connect_providers().get("OpenIDConnectProviderList", [])
    for provider in providers:
        if provider.get("Arn") == wanted:
            return wanted
    return None


def create_oidc_provider(aws: AwsClients, issuer: str) -> str:
    with translate_errors(f"iam:CreateOpenIDConnectProvider for {issuer}"):
        response = aws.iam.create_open_id_connect_provider(
            Url=issuer, ClientIDList=[STS_AUDIENCE], Tags=[ROLE_TAG]
        )
    return response["OpenIDConnectProviderArn"]


# --- IAM role ---------------------------------------------------------------------------------
def get_role(aws: AwsClients, name: str) -> dict[str, Any] | None:
    import botocore.exceptions

    with translate_errors(f"iam:GetRole on '{name}'"):
        try:
            return aws.iam.get_role(RoleName=name)["Role"]
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) == "NoSuchEntity":
                return None
            raise


def create_role(aws: AwsClients, name: str, trust: dict[str, Any], description: str) -> str:
    with translate_errors(f"iam:CreateRole '{name}'"):
        response = aws.iam.create_role(
            RoleName=name,
            AssumeRolePolicyDocument=json.dumps(trust),
            Description=description,
            Tags=[ROLE_TAG],
        )
    return response["Role"]["Arn"]


def update_trust(aws: AwsClients, name: str, trust: dict[str, Any]) -> None:
    with translate_errors(f"iam:UpdateAssumeRolePolicy on '{name}'"):
        aws.iam.update_assume_role_policy(RoleName=name, PolicyDocument=json.dumps(trust))


def attached_policy_arns(aws: AwsClients, role: str) -> list[str]:
    with translate_errors(f"iam:ListAttachedRolePolicies on '{role}'"):
        paginator = aws.iam.get_paginator("list_attached_role_policies")
        return [
            p["PolicyArn"]
            for page in paginator.paginate(RoleName=role)
            for p in page.get("AttachedPolicies", [])
        ]


def attach_policy(aws: AwsClients, role: str, policy_arn: str) -> None:
    with translate_errors(f"iam:AttachRolePolicy {policy_arn} to '{role}'"):
        aws.iam.attach_role_policy(RoleName=role, PolicyArn=policy_arn)


def inline_policy(aws: AwsClients, role: str, name: str) -> dict[str, Any] | None:
    import botocore.exceptions

    with translate_errors(f"iam:GetRolePolicy {name} on '{role}'"):
        try:
            document = aws.iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"]
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) == "NoSuchEntity":
                return None
            raise
    return canonical_policy(document)


def put_inline_policy(aws: AwsClients, role: str, name: str, document: dict[str, Any]) -> None:
    with translate_errors(f"iam:PutRolePolicy {name} on '{role}'"):
        aws.iam.put_role_policy(RoleName=role, PolicyName=name, PolicyDocument=json.dumps(document))


def role_name_from_arn(arn: str) -> str:
    return arn.rsplit("/", 1)[-1]


# --- EKS add-on -------------------------------------------------------------------------------
def describe_addon(aws: AwsClients, cluster: str) -> dict[str, Any] | None:
    import botocore.exceptions

    with translate_errors(f"eks:DescribeAddon {ADDON_NAME} on '{cluster}'"):
        try:
            return aws.eks.describe_addon(clusterName=cluster, addonName=ADDON_NAME)["addon"]
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) == "ResourceNotFoundException":
                return None
            raise


def create_addon(aws: AwsClients, cluster: str, role_arn: str, version: str | None) -> None:
    # NONE: fail rather than overwrite a self-managed driver's objects.
    _addon_request(aws, "CreateAddon", cluster, role_arn, version, resolve_conflicts="NONE")


def update_addon(aws: AwsClients, cluster: str, role_arn: str, version: str | None) -> None:
    # PRESERVE: keep configuration the user changed on the add-on's objects.
    _addon_request(aws, "UpdateAddon", cluster, role_arn, version, resolve_conflicts="PRESERVE")


def _addon_request(
    aws: AwsClients,
    operation: str,
    cluster: str,
    role_arn: str,
    version: str | None,
    *,
    resolve_conflicts: str,
) -> None:
    params: dict[str, Any] = {
        "clusterName": cluster,
        "addonName": ADDON_NAME,
        "serviceAccountRoleArn": role_arn,
        "resolveConflicts": resolve_conflicts,
    }
    if version:
        params["addonVersion"] = version
    method = {"CreateAddon": aws.eks.create_addon, "UpdateAddon": aws.eks.update_addon}[operation]
    with translate_errors(f"eks:{operation} {ADDON_NAME} on '{cluster}'"):
        method(**params)


def wait_addon_active(
    aws: AwsClients, cluster: str, *, timeout: float, delay: float
) -> dict[str, Any]:
    """Wait with botocore's ``addon_active`` waiter; its delay and attempts follow ``timeout``."""
    import math

    from botocore.exceptions import WaiterError

    delay = max(0.01, float(delay))
    attempts = max(1, math.ceil(timeout / delay))
    waiter = aws.eks.get_waiter("addon_active")
    try:
        with translate_errors(f"wait for add-on {ADDON_NAME} on '{cluster}'"):
            waiter.wait(
                clusterName=cluster,
                addonName=ADDON_NAME,
                WaiterConfig={"Delay": delay, "MaxAttempts": attempts},
            )
    except WaiterError as exc:
        addon = (exc.last_response or {}).get("addon") or {}
        status = addon.get("status", "unknown")
        if "Max attempts exceeded" in str(exc):
            raise WaitTimeout(
                f"EKS add-on {ADDON_NAME} was not ACTIVE within {int(timeout)}s (status {status})",
                fix="rerun later (EKS continues in the background) or raise --timeout",
            ) from None
        raise PreconditionFailed(
            f"EKS add-on {ADDON_NAME} is {status}: {health_summary(addon)}",
            fix="see the add-on's health issues in the EKS console, fix them, and rerun",
        ) from None
    found = describe_addon(aws, cluster)
    assert found is not None
    return found


def health_summary(addon: dict[str, Any]) -> str:
    issues = (addon.get("health") or {}).get("issues") or []
    if not issues:
        return "no health issues reported"
    return "; ".join(f"{i.get('code')}: {i.get('message')}" for i in issues[:3])
