"""IAM access for IRSA: the cluster's OIDC provider, roles with trust policies, attached and inline
policies, and a canonical form of policy documents for comparing them.

Reads return ``None``/``False`` for absent resources; writes are single idempotent API calls.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from hpkv.aws import error_code, translate_errors

if TYPE_CHECKING:
    from hpkv.aws import AwsClients

STS_AUDIENCE = "sts.amazonaws.com"
MANAGED_BY_TAG = "hpkv:managed-by"
MANAGED_BY_VALUE = "hpkv"
# Tags on what hpkv creates, so that removal touches only that.
MANAGED_TAGS = [{"Key": MANAGED_BY_TAG, "Value": MANAGED_BY_VALUE}]


# --- documents ----------------------------------------------------------------------------------
def issuer_host(issuer: str) -> str:
    """``https://oidc.eks.R.amazonaws.com/id/X`` -> ``oidc.eks.R.amazonaws.com/id/X``."""
    return issuer.removeprefix("https://").rstrip("/")


def oidc_provider_arn(account: str, issuer: str) -> str:
    return f"arn:aws:iam::{account}:oidc-provider/{issuer_host(issuer)}"


def service_account_subject(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def irsa_statement(provider_arn: str, issuer: str, subject: str) -> dict[str, Any]:
    host = issuer_host(issuer)
    return {
        "Effect": "Allow",
        "Principal": {"Federated": provider_arn},
        "Action": "sts:AssumeRoleWithWebIdentity",
        "Condition": {
            "StringEquals": {f"{host}:sub": subject, f"{host}:aud": STS_AUDIENCE},
        },
    }


def service_statement(service: str) -> dict[str, Any]:
    return {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}


def policy_document(statements: list[dict[str, Any]]) -> dict[str, Any]:
    return {"Version": "2012-10-17", "Statement": statements}


def _as_sorted_list(value: Any) -> list[Any]:
    items = value if isinstance(value, list) else [value]
    return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))


def canonical_statement(statement: dict[str, Any]) -> dict[str, Any]:
    """A statement with Sid dropped and every list-or-string sorted, for comparisons."""
    result: dict[str, Any] = {}
    for key, value in statement.items():
        if key == "Sid":
            continue
        if key in ("Principal", "NotPrincipal") and isinstance(value, dict):
            result[key] = {k: _as_sorted_list(v) for k, v in sorted(value.items())}
        elif key in ("Action", "NotAction", "Resource", "NotResource"):
            result[key] = _as_sorted_list(value)
        elif key == "Condition" and isinstance(value, dict):
            result[key] = {
                op: {k: _as_sorted_list(v) for k, v in sorted(cond.items())}
                for op, cond in sorted(value.items())
            }
        else:
            result[key] = value
    return result


def statements(document: dict[str, Any] | str | None) -> list[dict[str, Any]]:
    if document is None:
        return []
    if isinstance(document, str):
        from urllib.parse import unquote

        text = document if document.lstrip().startswith("{") else unquote(document)
        document = json.loads(text)
    found = document.get("Statement") or []
    return [found] if isinstance(found, dict) else list(found)


def same_document(a: dict[str, Any] | str | None, b: dict[str, Any] | str | None) -> bool:
    """True when two policy documents grant the same statements (order, Sids, lists aside)."""

    def key(doc: Any) -> list[str]:
        return sorted(json.dumps(canonical_statement(s), sort_keys=True) for s in statements(doc))

    return key(a) == key(b)


def role_name(value: str) -> str:
    """A role name from a role name or ARN (``arn:aws:iam::1:role/path/Name`` -> ``Name``)."""
    return value.rsplit("/", 1)[-1] if value.startswith("arn:") else value


# --- OIDC provider ------------------------------------------------------------------------------
def oidc_provider_exists(aws: AwsClients, arn: str) -> bool:
    import botocore.exceptions

    with translate_errors("iam:GetOpenIDConnectProvider"):
        try:
            aws.iam.get_open_id_connect_provider(OpenIDConnectProviderArn=arn)
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) == "NoSuchEntity":
                return False
            raise
    return True


def create_oidc_provider(aws: AwsClients, issuer: str, tags: list[dict[str, str]]) -> str:
    """Register the issuer (client ID sts.amazonaws.com; IAM obtains the thumbprint itself)."""
    import botocore.exceptions

    with translate_errors("iam:CreateOpenIDConnectProvider"):
        try:
            return aws.iam.create_open_id_connect_provider(
                Url=issuer, ClientIDList=[STS_AUDIENCE], Tags=tags
            )["OpenIDConnectProviderArn"]
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) != "EntityAlreadyExists":
                raise
    account = aws.caller_identity()["Account"]
    return oidc_provider_arn(account, issuer)


# --- roles --------------------------------------------------------------------------------------
def get_role(aws: AwsClients, name: str) -> dict[str, Any] | None:
    import botocore.exceptions

    with translate_errors(f"iam:GetRole {name}"):
        try:
            return aws.iam.get_role(RoleName=name)["Role"]
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) == "NoSuchEntity":
                return None
            raise


def create_role(
    aws: AwsClients,
    name: str,
    trust: dict[str, Any],
    *,
    description: str,
    tags: list[dict[str, str]],
) -> dict[str, Any]:
    """CreateRole; an existing role of that name (an interrupted earlier run) is returned as is."""
    import botocore.exceptions

    with translate_errors(f"iam:CreateRole {name}"):
        try:
            return aws.iam.create_role(
                RoleName=name,
                AssumeRolePolicyDocument=json.dumps(trust),
                Description=description,
                Tags=tags,
            )["Role"]
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) != "EntityAlreadyExists":
                raise
    role = get_role(aws, name)
    assert role is not None
    return role


def update_trust(aws: AwsClients, name: str, trust: dict[str, Any]) -> None:
    with translate_errors(f"iam:UpdateAssumeRolePolicy {name}"):
        aws.iam.update_assume_role_policy(RoleName=name, PolicyDocument=json.dumps(trust))


def attached_policies(aws: AwsClients, name: str) -> list[str]:
    with translate_errors(f"iam:ListAttachedRolePolicies {name}"):
        paginator = aws.iam.get_paginator("list_attached_role_policies")
        return [
            p["PolicyArn"]
            for page in paginator.paginate(RoleName=name)
            for p in page["AttachedPolicies"]
        ]


def attach_policy(aws: AwsClients, name: str, policy_arn: str) -> None:
    with translate_errors(f"iam:AttachRolePolicy {policy_arn} to {name}"):
        aws.iam.attach_role_policy(RoleName=name, PolicyArn=policy_arn)


def inline_policy(aws: AwsClients, name: str, policy_name: str) -> dict[str, Any] | None:
    import botocore.exceptions

    with translate_errors(f"iam:GetRolePolicy {policy_name} on {name}"):
        try:
            document = aws.iam.get_role_policy(RoleName=name, PolicyName=policy_name)[
                "PolicyDocument"
            ]
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) == "NoSuchEntity":
                return None
            raise
    return {"Statement": statements(document)} if isinstance(document, str) else document


def put_inline_policy(
    aws: AwsClients, name: str, policy_name: str, document: dict[str, Any]
) -> None:
    with translate_errors(f"iam:PutRolePolicy {policy_name} on {name}"):
        aws.iam.put_role_policy(
            RoleName=name, PolicyName=policy_name, PolicyDocument=json.dumps(document)
        )


def policy_exists(aws: AwsClients, arn: str) -> bool:
    import botocore.exceptions

    with translate_errors(f"iam:GetPolicy {arn}"):
        try:
            aws.iam.get_policy(PolicyArn=arn)
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) == "NoSuchEntity":
                return False
            raise
    return True


def is_managed_by_hpkv(role: dict[str, Any]) -> bool:
    tags = {t.get("Key"): t.get("Value") for t in role.get("Tags") or []}
    return tags.get(MANAGED_BY_TAG) == MANAGED_BY_VALUE


def role_tags(aws: AwsClients, name: str) -> list[dict[str, str]]:
    with translate_errors(f"iam:ListRoleTags {name}"):
        return aws.iam.list_role_tags(RoleName=name).get("Tags", [])


def delete_role(aws: AwsClients, name: str) -> bool:
    """Detach managed policies, delete inline policies, delete the role. False if already gone."""
    import botocore.exceptions

    if get_role(aws, name) is None:
        return False
    for arn in attached_policies(aws, name):
        with translate_errors(f"iam:DetachRolePolicy {arn} from {name}"):
            aws.iam.detach_role_policy(RoleName=name, PolicyArn=arn)
    with translate_errors(f"iam:ListRolePolicies {name}"):
        paginator = aws.iam.get_paginator("list_role_policies")
        inline = [p for page in paginator.paginate(RoleName=name) for p in page["PolicyNames"]]
    for policy_name in inline:
        with translate_errors(f"iam:DeleteRolePolicy {policy_name} on {name}"):
            aws.iam.delete_role_policy(RoleName=name, PolicyName=policy_name)
    with translate_errors(f"iam:DeleteRole {name}"):
        try:
            aws.iam.delete_role(RoleName=name)
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) != "NoSuchEntity":
                raise
    return True
