"""IRSA planned as Actions, for every stage that gives a Kubernetes service account an IAM role: the
cluster's IAM OIDC provider, and a role with its trust policy, managed and inline policies.

Planning only reads; each Action's ``run`` makes the writes (single idempotent IAM calls, so an
interrupted apply converges when rerun). A live trust policy that lacks a statement the service
account needs is drift: the plan carries the exact difference in its notes, and the fix (which
keeps statements for other principals) is planned only with ``fix_trust`` (``--yes``).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpkv.aws import iam
from hpkv.errors import PreconditionFailed
from hpkv.stages.base import Action, Detector, Finding, IamNeed, Severity, Verb

if TYPE_CHECKING:
    from hpkv.aws import AwsClients


_ROLES = "arn:{partition}:iam::{account}:role/*"
_OIDC_PROVIDERS = "arn:{partition}:iam::{account}:oidc-provider/*"
_POLICIES = "arn:{partition}:iam::*:policy/*"


def iam_needs(why: str) -> list[IamNeed]:
    """What planning and applying IRSA calls (this module and hpkv.aws.iam), for a stage's
    ``IAM_ACTIONS``."""
    return [
        IamNeed("iam:GetOpenIDConnectProvider", _OIDC_PROVIDERS, "the EKS OIDC provider (IRSA)"),
        IamNeed("iam:CreateOpenIDConnectProvider", _OIDC_PROVIDERS, "register the EKS issuer"),
        IamNeed("iam:TagOpenIDConnectProvider", _OIDC_PROVIDERS, "tag it on creation"),
        *(
            IamNeed(f"iam:{action}", _ROLES, why)
            for action in (
                "GetRole",
                "CreateRole",
                "TagRole",
                "UpdateAssumeRolePolicy",
                "ListAttachedRolePolicies",
                "AttachRolePolicy",
                "GetRolePolicy",
                "PutRolePolicy",
            )
        ),
        IamNeed("iam:PassRole", _ROLES, "give an add-on its IRSA role"),
        IamNeed("iam:GetPolicy", _POLICIES, "check a managed policy exists before attaching it"),
    ]


@dataclass(frozen=True)
class IrsaRole:
    """A role as a stage wants it.

    ``trust``: the statements it must contain (``None``: hpkv leaves the trust alone, e.g. a role
    the user chose). ``managed`` / ``inline``: the policies hpkv attaches and puts (empty: hpkv
    leaves the permissions alone). ``policy_fixes``: the fix to name when a managed policy is
    missing from the account, by ARN.
    """

    name: str
    title: str
    subject: str = ""
    trust: list[dict[str, Any]] | None = None
    managed: tuple[str, ...] = ()
    inline: tuple[str, dict[str, Any]] | None = None
    inline_purpose: str = ""
    description: str = ""
    tags: list[dict[str, str]] = field(default_factory=lambda: list(iam.MANAGED_TAGS))
    policy_fixes: dict[str, str] = field(default_factory=dict)

    @property
    def target(self) -> str:
        return f"iam role/{self.name}"

    @property
    def create_summary(self) -> str:
        return f"create the {self.title}" + (f" for {self.subject}" if self.subject else "")

    def trust_document(self) -> dict[str, Any]:
        return iam.policy_document(list(self.trust or []))


# --- OIDC provider --------------------------------------------------------------------------------
def plan_oidc_provider(
    aws: AwsClients, account: str, issuer: str, tags: list[dict[str, str]]
) -> Action:
    """Register the EKS cluster's OIDC issuer with IAM unless it is registered."""
    if iam.oidc_provider_exists(aws, iam.oidc_provider_arn(account, issuer)):
        return Action(oidc_provider_target(issuer), Verb.NONE, "exists")
    return oidc_provider_creation(aws, issuer, tags)


def oidc_provider_target(issuer: str) -> str:
    return f"iam oidc-provider/{iam.issuer_host(issuer)}"


def oidc_provider_creation(
    aws: AwsClients | None, issuer: str, tags: list[dict[str, str]]
) -> Action:
    """The CREATE action for the provider (``aws`` None: a plan that is only shown)."""
    return Action(
        oidc_provider_target(issuer),
        Verb.CREATE,
        f"register the EKS OIDC issuer for IRSA (client ID {iam.STS_AUDIENCE})",
        None,
        {"url": issuer, "clientIds": [iam.STS_AUDIENCE]},
        run=(lambda: iam.create_oidc_provider(aws, issuer, tags)) if aws is not None else None,
    )


# --- trust drift ----------------------------------------------------------------------------------
@dataclass
class TrustDrift:
    summary: str
    diff: str
    fixed: dict[str, Any]


def _principal_keys(statement: dict[str, Any]) -> set[tuple[str, str]]:
    principal = statement.get("Principal") or {}
    if not isinstance(principal, dict):
        return {("*", str(principal))}
    keys = set()
    for kind, value in principal.items():
        for item in value if isinstance(value, list) else [value]:
            keys.add((kind, str(item)))
    return keys


def trust_drift(
    live: dict[str, Any] | str | None, desired: list[dict[str, Any]]
) -> TrustDrift | None:
    """What ``live`` lacks of the ``desired`` statements, the fixed document and the exact diff.

    Statements for other principals are kept; those for the same principals are replaced.
    """
    live_statements = iam.statements(live)
    canonical_live = [iam.canonical_statement(s) for s in live_statements]
    missing = [s for s in desired if iam.canonical_statement(s) not in canonical_live]
    if not missing:
        return None
    ours = set().union(*(_principal_keys(s) for s in desired))
    kept = [s for s in live_statements if not (_principal_keys(s) & ours)]
    fixed = iam.policy_document(kept + desired)
    before = json.dumps(iam.policy_document(live_statements), indent=2, sort_keys=True)
    after = json.dumps(fixed, indent=2, sort_keys=True)
    diff = "\n".join(
        difflib.unified_diff(
            before.splitlines(),
            after.splitlines(),
            fromfile="trust policy (live)",
            tofile="trust policy (needed)",
            lineterm="",
        )
    )
    summary = "; ".join(_describe_statement(s) for s in missing)
    return TrustDrift(summary=f"lacks {summary}", diff=diff, fixed=fixed)


def trust_drift_finding(
    detector: Detector, role: str, title: str, drift: TrustDrift, fix: str
) -> Finding:
    """A role whose trust policy lacks what its service account needs, for ``hpkv diagnose``."""
    diff = " ".join(line for line in drift.diff.splitlines() if line[:1] in "+-")[:600]
    return detector.finding(
        Severity.WARNING,
        f"role {role} ({title}): the trust policy {drift.summary}, so the pods using it cannot "
        f"assume it (AccessDenied on sts:AssumeRoleWithWebIdentity); difference: {diff}",
        fix,
        [f"iam role/{role}"],
        title=f"trust policy drift on role {role}",
    )


def _describe_statement(statement: dict[str, Any]) -> str:
    principal = statement.get("Principal") or {}
    if "Service" in principal:
        return f"sts:AssumeRole for {principal['Service']}"
    conditions = (statement.get("Condition") or {}).get("StringEquals") or {}
    subject = next((v for k, v in conditions.items() if k.endswith(":sub")), "?")
    provider = str(principal.get("Federated", "?")).rsplit(":", 1)[-1]
    return f"sts:AssumeRoleWithWebIdentity for {subject} via {provider}"


# --- roles ----------------------------------------------------------------------------------------
def plan_role(
    aws: AwsClients,
    role: IrsaRole,
    live: dict[str, Any] | None,
    *,
    fix_trust: bool,
    notes: list[str],
) -> list[Action]:
    """The role and its trust: create it, or fix trust drift. [] when nothing needs doing.

    Drift is explained in ``notes``; without ``fix_trust`` the plan says it is NOT fixed.
    """
    if live is None:
        trust = role.trust_document()
        return [
            Action(
                role.target,
                Verb.CREATE,
                role.create_summary,
                None,
                trust,
                run=lambda: iam.create_role(
                    aws, role.name, trust, description=role.description, tags=role.tags
                ),
            )
        ]
    if role.trust is None:
        return []
    drift = trust_drift(live.get("AssumeRolePolicyDocument"), role.trust)
    if drift is None:
        return []
    notes.append(f"role {role.name}: the trust policy {drift.summary}. Difference:\n{drift.diff}")
    if not fix_trust:
        return [
            Action(
                role.target,
                Verb.NONE,
                f"trust policy drift NOT fixed ({drift.summary}); rerun with --yes to rewrite it",
            )
        ]
    return [
        Action(
            role.target,
            Verb.UPDATE,
            f"rewrite the trust policy (drift: {drift.summary})",
            iam.policy_document(iam.statements(live["AssumeRolePolicyDocument"])),
            drift.fixed,
            run=lambda: iam.update_trust(aws, role.name, drift.fixed),
        )
    ]


def plan_permissions(
    aws: AwsClients, role: IrsaRole, live: dict[str, Any] | None, attached: list[str]
) -> list[Action]:
    """Attach the managed policies ``attached`` lacks and put the inline policy when it differs.
    [] when they are in place. ``live`` None: the role is created earlier in the same plan."""
    actions: list[Action] = []
    missing = [p for p in role.managed if p not in attached]
    if missing:
        require_policies(aws, role, missing)
        actions.append(
            Action(
                role.target,
                Verb.UPDATE,
                f"attach {', '.join(p.rsplit('/', 1)[-1] for p in missing)}",
                {"attached": attached},
                {"attached": attached + missing},
                run=lambda: [iam.attach_policy(aws, role.name, p) for p in missing],
            )
        )
    if role.inline is not None:
        name, document = role.inline
        current = iam.inline_policy(aws, role.name, name) if live is not None else None
        if current is None or not iam.same_document(current, document):
            purpose = f" ({role.inline_purpose})" if role.inline_purpose else ""
            actions.append(
                Action(
                    role.target,
                    Verb.UPDATE,
                    f"{'put' if current is None else 'update'} inline policy {name}{purpose}",
                    current,
                    document,
                    run=lambda: iam.put_inline_policy(aws, role.name, name, document),
                )
            )
    return actions


def plan_role_with_permissions(
    aws: AwsClients,
    role: IrsaRole,
    live: dict[str, Any] | None,
    attached: list[str],
    *,
    fix_trust: bool,
    notes: list[str],
) -> list[Action]:
    """:func:`plan_role` plus :func:`plan_permissions`, with a missing role created in ONE action
    (role, trust, managed and inline policies)."""
    if live is not None:
        return plan_role(aws, role, live, fix_trust=fix_trust, notes=notes) + plan_permissions(
            aws, role, live, attached
        )
    require_policies(aws, role, list(role.managed))
    return [role_creation(aws, role)]


def role_creation(aws: AwsClients | None, role: IrsaRole) -> Action:
    """ONE CREATE action for a missing role: role, trust, managed and inline policies (``aws``
    None: a plan that is only shown)."""
    trust = role.trust_document()
    desired = {
        "trust": trust,
        "attach": list(role.managed),
        **({"inline": {role.inline[0]: role.inline[1]}} if role.inline else {}),
    }

    def create() -> None:
        assert aws is not None
        iam.create_role(aws, role.name, trust, description=role.description, tags=role.tags)
        for arn in role.managed:
            iam.attach_policy(aws, role.name, arn)
        if role.inline is not None:
            iam.put_inline_policy(aws, role.name, *role.inline)

    run = create if aws is not None else None
    return Action(role.target, Verb.CREATE, role.create_summary, None, desired, run=run)


def require_policies(aws: AwsClients, role: IrsaRole, arns: list[str]) -> None:
    """Refuse, while planning, to attach a managed policy that does not exist."""
    for arn in arns:
        if iam.policy_exists(aws, arn):
            continue
        raise PreconditionFailed(
            f"IAM policy {arn} for the {role.title} does not exist in this account",
            fix=role.policy_fixes.get(arn)
            or "check the partition/region; AWS managed policies exist in every commercial region",
        )
