"""IAM: users, roles, groups and policies are moto's; this extension adds the policy simulator
(SimulatePrincipalPolicy), which moto lacks, evaluating the principal's policies as IAM does:

* identity policies of the principal: inline and attached managed policies of a user (and of its
  groups) or of a role, plus any ``PolicyInputList`` documents;
* per statement: ``Effect``, ``Action``/``NotAction`` (case-insensitive, ``*`` and ``?``
  wildcards), ``Resource``/``NotResource`` (case-sensitive wildcards, ``${aws:username}``);
* an explicit Deny wins over any Allow; without a matching Allow the decision is implicitDeny;
* conditions are not evaluated: a statement with a ``Condition`` does not apply, and its keys are
  reported in ``MissingContextValues`` (what the real simulator does when the context lacks them);
* results are paginated with ``MaxItems``/``Marker``.

After each reset it also seeds the AWS managed policies hpkv attaches (``SEEDED``), from moto's own
bundled copy of the AWS managed policy data: moto loads managed policies only when configured to,
and then all ~1,400 of them on every reset. Add names to ``SEEDED`` as stages need them.

Permission boundaries, SCPs and resource policies are not modelled. ``seed_user``/``seed_role``
set up principals for tests; ``seed_user`` can give a user the tool's fixed access key so
``sts:GetCallerIdentity`` from hpkv resolves to that user.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import dataclass
from functools import cache
from typing import Any

from tests.harness.aws.protocol import AwsError, ParsedRequest
from tests.harness.aws.server import HPKV_ACCESS_KEY, Extension

DEFAULT_MAX_ITEMS = 100

SEEDED = (
    "AmazonSageMakerHyperPodInferenceAccess",
    "AmazonSageMakerHyperPodGatedModelAccess",
    "AmazonFSxFullAccess",
    "AmazonEBSCSIDriverPolicy",
)


@cache
def _managed_policy_data() -> dict[str, Any]:
    from moto.iam.aws_managed_policies import aws_managed_policies_data

    data = json.loads(aws_managed_policies_data)
    return {name: data[name] for name in SEEDED if name in data}


@dataclass
class _Source:
    policy_id: str
    policy_type: str  # user | group | role | aws-managed | user-managed | none
    document: dict[str, Any]


def _wildcard(pattern: str, *, ignore_case: bool) -> re.Pattern[str]:
    regex = "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern)
    return re.compile(f"^{regex}$", re.IGNORECASE if ignore_case else 0)


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _document(text: str) -> dict[str, Any]:
    try:
        return json.loads(text)
    except ValueError:
        return json.loads(urllib.parse.unquote(text))


class IamExtension(Extension):
    service = "iam"

    # --- moto's state -----------------------------------------------------------------------------
    def _backend(self) -> Any:
        import moto.backends

        return moto.backends.get_backend("iam")[self.emulator.account_id]["aws"]

    def reset(self) -> None:
        from moto.iam.models import AWSManagedPolicy

        backend = self._backend()
        for name, data in _managed_policy_data().items():
            policy = AWSManagedPolicy.from_data(name, self.emulator.account_id, "us-east-1", data)
            backend.managed_policies[policy.arn] = policy

    # --- seeding (tests) ------------------------------------------------------------------------
    def seed_user(
        self,
        name: str,
        *,
        policies: dict[str, dict[str, Any]] | None = None,
        access_key_id: str | None = HPKV_ACCESS_KEY,
    ) -> str:
        """A user with inline policies; with ``access_key_id`` that key authenticates as it."""
        iam = self.emulator.client("iam")
        arn = iam.create_user(UserName=name)["User"]["Arn"]
        for policy_name, document in (policies or {}).items():
            iam.put_user_policy(
                UserName=name, PolicyName=policy_name, PolicyDocument=json.dumps(document)
            )
        if access_key_id:
            backend = self._backend()
            key = backend.create_access_key(name)
            del backend.access_keys[key.physical_resource_id]
            key.access_key_id = access_key_id
            backend.access_keys[key.physical_resource_id] = key
        return arn

    def seed_role(
        self,
        name: str,
        *,
        policies: dict[str, dict[str, Any]] | None = None,
        trust: dict[str, Any] | None = None,
        path: str = "/",
    ) -> str:
        iam = self.emulator.client("iam")
        trust = trust or {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": "ec2.amazonaws.com"},
                    "Action": "sts:AssumeRole",
                }
            ],
        }
        arn = iam.create_role(RoleName=name, Path=path, AssumeRolePolicyDocument=json.dumps(trust))[
            "Role"
        ]["Arn"]
        for policy_name, document in (policies or {}).items():
            iam.put_role_policy(
                RoleName=name, PolicyName=policy_name, PolicyDocument=json.dumps(document)
            )
        return arn

    # --- the simulator ----------------------------------------------------------------------------
    def op_SimulatePrincipalPolicy(self, request: ParsedRequest) -> dict[str, Any]:
        params = request.params
        arn = params["PolicySourceArn"]
        sources, username = self._sources(arn)
        for i, text in enumerate(params.get("PolicyInputList") or []):
            sources.append(_Source(f"PolicyInputList.{i + 1}", "none", _document(text)))
        resources = params.get("ResourceArns") or ["*"]
        results = [
            self._evaluate(action, resource, sources, username)
            for action in params["ActionNames"]
            for resource in resources
        ]
        start = int(params.get("Marker") or 0)
        size = int(params.get("MaxItems") or DEFAULT_MAX_ITEMS)
        page = results[start : start + size]
        truncated = start + size < len(results)
        response: dict[str, Any] = {"EvaluationResults": page, "IsTruncated": truncated}
        if truncated:
            response["Marker"] = str(start + size)
        return response

    def _sources(self, arn: str) -> tuple[list[_Source], str]:
        backend = self._backend()
        kind = arn.split(":", 5)[-1].split("/", 1)[0] if arn.count(":") >= 5 else ""
        if kind == "user":
            user = next((u for u in backend.users.values() if u.arn == arn), None)
            if user is None:
                raise AwsError("NoSuchEntity", f"The user with ARN {arn} cannot be found.", 404)
            sources = self._owned(user, "user")
            for group in backend.groups.values():
                if user in group.users:
                    sources += self._owned(group, "group")
            return sources, user.name
        if kind == "role":
            role = next((r for r in backend.roles.values() if r.arn == arn), None)
            if role is None:
                raise AwsError("NoSuchEntity", f"The role with ARN {arn} cannot be found.", 404)
            return self._owned(role, "role"), ""
        if kind == "group":
            group = next((g for g in backend.groups.values() if g.arn == arn), None)
            if group is None:
                raise AwsError("NoSuchEntity", f"The group with ARN {arn} cannot be found.", 404)
            return self._owned(group, "group"), ""
        raise AwsError(
            "InvalidInput", f"Invalid ARN: {arn} is not the ARN of a user, group or role."
        )

    @staticmethod
    def _owned(principal: Any, inline_type: str) -> list[_Source]:
        sources = [
            _Source(name, inline_type, _document(text)) for name, text in principal.policies.items()
        ]
        for policy in principal.managed_policies.values():
            version = next(v for v in policy.versions if v.is_default)
            managed_type = "aws-managed" if ":aws:policy/" in policy.arn else "user-managed"
            sources.append(_Source(policy.name, managed_type, _document(version.document)))
        return sources

    def _evaluate(
        self, action: str, resource: str, sources: list[_Source], username: str
    ) -> dict[str, Any]:
        allows: list[_Source] = []
        denies: list[_Source] = []
        missing_context: set[str] = set()
        for source in sources:
            statements = source.document.get("Statement", [])
            for statement in [statements] if isinstance(statements, dict) else statements:
                if not _applies(statement, action, resource, username):
                    continue
                if "Condition" in statement:
                    for keys in statement["Condition"].values():
                        missing_context.update(keys)
                    continue
                (denies if statement.get("Effect") == "Deny" else allows).append(source)
        if denies:
            decision, matched = "explicitDeny", denies
        elif allows:
            decision, matched = "allowed", allows
        else:
            decision, matched = "implicitDeny", []
        return {
            "EvalActionName": action,
            "EvalResourceName": resource,
            "EvalDecision": decision,
            "MatchedStatements": [
                {"SourcePolicyId": s.policy_id, "SourcePolicyType": s.policy_type} for s in matched
            ],
            "MissingContextValues": sorted(missing_context),
        }


def _applies(statement: dict[str, Any], action: str, resource: str, username: str) -> bool:
    if "Action" in statement:
        action_ok = any(
            _wildcard(p, ignore_case=True).match(action) for p in _as_list(statement["Action"])
        )
    else:
        action_ok = not any(
            _wildcard(p, ignore_case=True).match(action)
            for p in _as_list(statement.get("NotAction"))
        )
    if not action_ok:
        return False

    def resource_patterns(key: str) -> list[re.Pattern[str]]:
        return [
            _wildcard(p.replace("${aws:username}", username), ignore_case=False)
            for p in _as_list(statement.get(key))
        ]

    if "Resource" in statement:
        return any(p.match(resource) for p in resource_patterns("Resource"))
    if "NotResource" in statement:
        return not any(p.match(resource) for p in resource_patterns("NotResource"))
    return False
