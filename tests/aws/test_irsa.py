"""hpkv.aws.irsa: the OIDC provider and IRSA roles planned as Actions, run against the AWS
emulator (moto's IAM): plans only read, running them converges, and a converged role plans nothing."""

from __future__ import annotations

import json

import pytest

from hpkv.aws import AwsClients, iam, irsa
from hpkv.config import load_settings
from hpkv.errors import PreconditionFailed
from hpkv.stages.base import Action, Verb
from tests.harness.aws import AwsEmulator

pytestmark = pytest.mark.aws

ACCOUNT = "123456789012"
ISSUER = "https://oidc.eks.us-west-2.amazonaws.com/id/0123456789ABCDEF"
HOST = "oidc.eks.us-west-2.amazonaws.com/id/0123456789ABCDEF"
PROVIDER = f"arn:aws:iam::{ACCOUNT}:oidc-provider/{HOST}"
SUBJECT = "system:serviceaccount:kube-system:demo-sa"
FSX = "arn:aws:iam::aws:policy/AmazonFSxFullAccess"
INLINE = iam.policy_document(
    [{"Sid": "Read", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": "*"}]
)


@pytest.fixture
def clients(aws_env: AwsEmulator) -> AwsClients:
    return AwsClients(load_settings(flags={}))


def _role(**overrides: object) -> irsa.IrsaRole:
    fields: dict = {
        "name": "demo-role",
        "title": "demo role",
        "subject": SUBJECT,
        "trust": [iam.irsa_statement(PROVIDER, ISSUER, SUBJECT)],
        "managed": (FSX,),
        "inline": ("demo-inline", INLINE),
        "description": "a test role",
    }
    fields.update(overrides)
    return irsa.IrsaRole(**fields)


def _run(actions: list[Action]) -> None:
    for action in actions:
        if action.run is not None:
            action.run()


def _writes(aws: AwsEmulator, mark: int) -> list[str]:
    return [str(c) for c in aws.writes_since(mark)]


def _plan(clients: AwsClients, role: irsa.IrsaRole, *, split: bool = False) -> list[Action]:
    live = iam.get_role(clients, role.name)
    attached = iam.attached_policies(clients, role.name) if live else []
    notes: list[str] = []
    if split:
        return irsa.plan_role(
            clients, role, live, fix_trust=True, notes=notes
        ) + irsa.plan_permissions(clients, role, live, attached)
    return irsa.plan_role_with_permissions(
        clients, role, live, attached, fix_trust=True, notes=notes
    )


def _assert_converged(clients: AwsClients, aws: AwsEmulator, role: irsa.IrsaRole) -> None:
    """Both ways of planning find nothing to do, and planning wrote nothing."""
    mark = aws.mark()
    assert _plan(clients, role) == []
    assert _plan(clients, role, split=True) == []
    assert _writes(aws, mark) == []


def test_oidc_provider_is_registered_once(clients: AwsClients, aws_env: AwsEmulator) -> None:
    mark = aws_env.mark()
    action = irsa.plan_oidc_provider(clients, ACCOUNT, ISSUER, iam.MANAGED_TAGS)
    assert (action.target, action.verb) == (f"iam oidc-provider/{HOST}", Verb.CREATE)
    assert action.after == {"url": ISSUER, "clientIds": ["sts.amazonaws.com"]}
    assert _writes(aws_env, mark) == []  # planning only reads
    action.run()
    assert iam.oidc_provider_exists(clients, PROVIDER)
    tags = aws_env.client("iam").list_open_id_connect_provider_tags(
        OpenIDConnectProviderArn=PROVIDER
    )["Tags"]
    assert {"Key": "hpkv:managed-by", "Value": "hpkv"} in tags

    mark = aws_env.mark()
    again = irsa.plan_oidc_provider(clients, ACCOUNT, ISSUER, iam.MANAGED_TAGS)
    assert again.verb is Verb.NONE
    assert _writes(aws_env, mark) == []


def test_a_missing_role_is_created_in_one_action_then_plans_nothing(
    clients: AwsClients, aws_env: AwsEmulator
) -> None:
    role = _role()
    [action] = _plan(clients, role)
    assert (action.verb, action.summary) == (Verb.CREATE, f"create the demo role for {SUBJECT}")
    assert action.after["attach"] == [FSX] and "demo-inline" in action.after["inline"]
    action.run()

    live = iam.get_role(clients, "demo-role")
    assert live is not None and iam.is_managed_by_hpkv(live)
    assert iam.attached_policies(clients, "demo-role") == [FSX]
    assert iam.same_document(iam.inline_policy(clients, "demo-role", "demo-inline"), INLINE)
    assert irsa.trust_drift(live["AssumeRolePolicyDocument"], role.trust) is None

    _assert_converged(clients, aws_env, role)


def test_split_planning_makes_the_role_and_each_policy_a_step(
    clients: AwsClients, aws_env: AwsEmulator
) -> None:
    role = _role()
    actions = _plan(clients, role, split=True)
    assert [(a.verb, a.summary) for a in actions] == [
        (Verb.CREATE, f"create the demo role for {SUBJECT}"),
        (Verb.UPDATE, "attach AmazonFSxFullAccess"),
        (Verb.UPDATE, "put inline policy demo-inline"),
    ]
    _run(actions)
    _assert_converged(clients, aws_env, role)


def test_an_interrupted_create_converges_policy_by_policy(
    clients: AwsClients, aws_env: AwsEmulator
) -> None:
    role = _role()
    # An earlier run created the role and stopped before its policies.
    iam.create_role(clients, role.name, role.trust_document(), description="x", tags=role.tags)
    actions = _plan(clients, role)
    assert [a.summary for a in actions] == [
        "attach AmazonFSxFullAccess",
        "put inline policy demo-inline",
    ]
    _run(actions)
    changed = iam.policy_document(
        [{"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": "*"}]
    )
    iam.put_inline_policy(clients, role.name, "demo-inline", changed)
    [update] = _plan(clients, role)
    assert update.summary == "update inline policy demo-inline"
    assert iam.same_document(update.before, changed) and update.after == INLINE


def test_trust_drift_is_explained_and_fixed_only_when_asked(
    clients: AwsClients, aws_env: AwsEmulator
) -> None:
    role = _role(managed=(), inline=None)
    other = {
        "Effect": "Allow",
        "Principal": {"Service": "ec2.amazonaws.com"},
        "Action": "sts:AssumeRole",
    }
    wrong = iam.irsa_statement(PROVIDER, ISSUER, "system:serviceaccount:kube-system:someone-else")
    aws_env.client("iam").create_role(
        RoleName=role.name,
        AssumeRolePolicyDocument=json.dumps(iam.policy_document([other, wrong])),
    )
    live = iam.get_role(clients, role.name)

    notes: list[str] = []
    mark = aws_env.mark()
    [kept] = irsa.plan_role(clients, role, live, fix_trust=False, notes=notes)
    assert kept.verb is Verb.NONE and "trust policy drift NOT fixed" in kept.summary
    assert f"sts:AssumeRoleWithWebIdentity for {SUBJECT}" in kept.summary
    assert f'-          "{HOST}:sub": "system:serviceaccount:kube-system:someone-else"' in notes[0]
    assert f'+          "{HOST}:sub": "{SUBJECT}"' in notes[0]

    [fix] = irsa.plan_role(clients, role, live, fix_trust=True, notes=[])
    assert fix.verb is Verb.UPDATE
    assert _writes(aws_env, mark) == []
    fix.run()
    trust = iam.get_role(clients, role.name)["AssumeRolePolicyDocument"]
    # The statement for another principal is kept; ours is replaced.
    assert iam.same_document(trust, iam.policy_document([other, *role.trust]))
    assert (
        irsa.plan_role(clients, role, iam.get_role(clients, role.name), fix_trust=True, notes=[])
        == []
    )


def test_a_role_without_wanted_trust_keeps_its_own(clients: AwsClients) -> None:
    iam.create_role(clients, "users-role", {}, description="", tags=[])
    role = irsa.IrsaRole(name="users-role", title="their role", inline=("demo-inline", INLINE))
    live = iam.get_role(clients, "users-role")
    assert irsa.plan_role(clients, role, live, fix_trust=True, notes=[]) == []
    [put] = irsa.plan_permissions(clients, role, live, [])
    assert put.summary == "put inline policy demo-inline"


def test_a_missing_managed_policy_is_refused_while_planning(
    clients: AwsClients, aws_env: AwsEmulator
) -> None:
    missing = f"arn:aws:iam::{ACCOUNT}:policy/NotThere"
    role = _role(managed=(missing,), policy_fixes={missing: "create NotThere first"})
    mark = aws_env.mark()
    with pytest.raises(
        PreconditionFailed, match="NotThere for the demo role does not exist"
    ) as exc:
        _plan(clients, role)
    assert exc.value.fix == "create NotThere first"
    with pytest.raises(PreconditionFailed) as generic:
        _plan(clients, _role(managed=(missing,)), split=True)
    assert "AWS managed policies exist" in (generic.value.fix or "")
    assert _writes(aws_env, mark) == []


def test_trust_drift_ignores_order_sids_and_single_item_lists() -> None:
    statement = iam.irsa_statement(PROVIDER, ISSUER, SUBJECT)
    live = {
        "Statement": [
            {**statement, "Sid": "Mine", "Action": ["sts:AssumeRoleWithWebIdentity"]},
            {"Effect": "Allow", "Principal": {"Service": "x"}, "Action": "sts:AssumeRole"},
        ]
    }
    assert irsa.trust_drift(live, [statement]) is None
    assert irsa.trust_drift(json.dumps(live), [statement]) is None
