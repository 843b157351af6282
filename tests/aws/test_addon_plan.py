"""hpkv.aws.addon_plan: EKS add-ons planned as Actions and run against the AWS emulator, which
enforces EKS's add-on rules and status transitions (tests/harness/aws/extensions/eks.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from hpkv.aws import addon_plan, eks
from hpkv.config import load_settings
from hpkv.context import RunContext, RunOptions
from hpkv.errors import ConfigError, PreconditionFailed
from hpkv.stages.base import Verb
from tests.harness.aws import AwsEmulator

pytestmark = pytest.mark.aws

CLUSTER = "hpkv-eks"
EBS = "aws-ebs-csi-driver"
ROLE = "arn:aws:iam::123456789012:role/hpkv-hpkv-eks-ebs-csi"
ISSUE = {"code": "AccessDenied", "message": "not authorized: iam:PassRole", "resourceIds": ["sa"]}


@pytest.fixture
def eks_ext(aws_env: AwsEmulator) -> Any:
    ext = aws_env.extensions["eks"]
    ext.seed_cluster(CLUSTER, version="1.33")
    return ext


@pytest.fixture
def ctx(eks_ext: Any) -> RunContext:
    return RunContext(load_settings(flags={}), RunOptions(timeout=5))


def _wanted(**overrides: Any) -> addon_plan.AddonWanted:
    fields: dict[str, Any] = {
        "cluster": CLUSTER,
        "name": EBS,
        "kubernetes_version": "1.33",
        "version_policy": "default",
        "config_key": "curvine.ebsCsi.addonVersion",
        "settings": {"serviceAccountRoleArn": ROLE},
        "resolve_create": "NONE",
        "resolve_update": "PRESERVE",
    }
    fields.update(overrides)
    return addon_plan.AddonWanted(**fields)


def _plan(ctx: RunContext, wanted: addon_plan.AddonWanted) -> Any:
    return addon_plan.plan_addon(ctx, wanted, eks.describe_addon(ctx.aws, CLUSTER, wanted.name))


def _writes(aws: AwsEmulator, mark: int) -> list[str]:
    return [str(c) for c in aws.writes_since(mark)]


def test_create_takes_the_default_version_waits_and_then_plans_nothing(
    ctx: RunContext, aws_env: AwsEmulator, eks_ext: Any
) -> None:
    mark = aws_env.mark()
    action = _plan(ctx, _wanted())
    assert (action.target, action.verb) == (f"eks addon/{EBS}", Verb.CREATE)
    assert action.summary == "create v1.48.0-eksbuild.1 (default for Kubernetes 1.33)"
    assert action.after == {"addonVersion": "v1.48.0-eksbuild.1", "serviceAccountRoleArn": ROLE}
    assert _writes(aws_env, mark) == []  # planning only reads

    action.run()
    addon = eks_ext.addons[(CLUSTER, EBS)]
    assert addon.status == "ACTIVE"  # waited for
    [request] = addon.requests
    assert request["addonVersion"] == "v1.48.0-eksbuild.1"
    assert request["resolveConflicts"] == "NONE"
    assert request["tags"] == {"hpkv:managed-by": "hpkv"}

    mark = aws_env.mark()
    again = _plan(ctx, _wanted())
    assert again.verb is Verb.NONE
    assert again.summary == "v1.48.0-eksbuild.1 ACTIVE, configuration unchanged"
    assert _writes(aws_env, mark) == []


def test_default_keeps_an_installed_version_and_latest_upgrades_waiting_on_the_update_id(
    ctx: RunContext, aws_env: AwsEmulator, eks_ext: Any
) -> None:
    eks_ext.seed_addon(CLUSTER, EBS, "v1.47.0-eksbuild.2", service_account_role_arn=ROLE)
    assert _plan(ctx, _wanted()).verb is Verb.NONE

    eks_ext.transition_describes = 3
    action = _plan(ctx, _wanted(version_policy="latest"))
    assert action.verb is Verb.UPDATE
    assert action.summary == "update: version v1.47.0-eksbuild.2 -> v1.48.0-eksbuild.1 (latest)"
    mark = aws_env.mark()
    action.run()
    calls = [str(c) for c in aws_env.calls_since(mark)]
    assert calls[0] == "eks:UpdateAddon -> 200"
    # Waited on DescribeUpdate until Successful (3 InProgress answers), then on the add-on.
    first_describe = calls.index("eks:DescribeAddon -> 200")
    assert calls[1:first_describe] == ["eks:DescribeUpdate -> 200"] * (first_describe - 1)
    assert first_describe >= 5
    assert set(calls[first_describe:]) == {"eks:DescribeAddon -> 200"}
    addon = eks_ext.addons[(CLUSTER, EBS)]
    assert (addon.version, addon.status) == ("v1.48.0-eksbuild.1", "ACTIVE")
    assert addon.requests[-1]["resolveConflicts"] == "PRESERVE"
    assert "tags" not in addon.requests[-1]


def test_a_pinned_version_that_eks_does_not_offer_is_a_config_error(ctx: RunContext) -> None:
    with pytest.raises(
        ConfigError, match=r"curvine\.ebsCsi\.addonVersion: aws-ebs-csi-driver"
    ) as e:
        _plan(ctx, _wanted(version_policy="v9.9.9"))
    assert "v1.47.0-eksbuild.2, v1.48.0-eksbuild.1" in (e.value.fix or "")
    assert _plan(ctx, _wanted(version_policy="1.47.0")).summary == (
        "create v1.47.0-eksbuild.2 (newest build of v1.47.0)"
    )


def test_a_version_below_the_minimum_is_refused(ctx: RunContext) -> None:
    wanted = _wanted(minimum="v1.49.0-eksbuild.1", minimum_source="the test documents")
    with pytest.raises(PreconditionFailed) as refused:
        _plan(ctx, wanted)
    assert refused.value.message == (
        "aws-ebs-csi-driver v1.48.0-eksbuild.1 (default for Kubernetes 1.33) is below "
        "v1.49.0-eksbuild.1, the minimum the test documents"
    )
    assert "curvine.ebsCsi.addonVersion" in (refused.value.fix or "")


def test_configuration_keys_hpkv_does_not_manage_are_kept(ctx: RunContext, eks_ext: Any) -> None:
    name = "amazon-sagemaker-hyperpod-inference"
    users = {"jumpstartGatedModelDownloadRoleArn": "arn:aws:iam::123456789012:role/gated"}
    eks_ext.seed_addon(
        CLUSTER,
        name,
        "v1.3.0-eksbuild.1",
        configuration_values=json.dumps({"executionRoleArn": "old", **users}),
    )
    wanted = _wanted(name=name, settings={"configurationValues": {"executionRoleArn": "new"}})
    action = _plan(ctx, wanted)
    assert action.summary == "update: configurationValues"
    assert action.before["configurationValues"]["executionRoleArn"] == "old"
    action.run()
    live = json.loads(eks_ext.addons[(CLUSTER, name)].configuration_values)
    assert live == {"executionRoleArn": "new", **users}
    assert _plan(ctx, wanted).verb is Verb.NONE


def test_create_failed_is_recreated_with_preserve_and_degraded_is_repaired(
    ctx: RunContext, aws_env: AwsEmulator, eks_ext: Any
) -> None:
    eks_ext.seed_addon(CLUSTER, EBS, "v1.48.0-eksbuild.1", status="CREATE_FAILED", issues=[ISSUE])
    preserved: list[bool] = []
    eks_ext.on_deleted.append(lambda addon: preserved.append(addon.preserve))
    action = _plan(ctx, _wanted())
    assert action.summary == (
        "re-create (CREATE_FAILED: [AccessDenied] not authorized: iam:PassRole (resources: sa)): "
        "delete with --preserve, create v1.48.0-eksbuild.1"
    )
    mark = aws_env.mark()
    action.run()
    assert _writes(aws_env, mark) == ["eks:DeleteAddon -> 200", "eks:CreateAddon -> 200"]
    assert preserved == [True]
    assert eks_ext.addons[(CLUSTER, EBS)].status == "ACTIVE"

    addon = eks_ext.addons[(CLUSTER, EBS)]
    addon.status, addon.issues = "DEGRADED", [ISSUE]
    repair = _plan(ctx, _wanted())
    assert repair.verb is Verb.UPDATE
    assert repair.summary.startswith("update: repair (DEGRADED: [AccessDenied]")
    assert repair.summary.endswith("with resolve-conflicts PRESERVE")
    repair.run()
    assert addon.status == "ACTIVE"


def test_failures_name_the_remedy_and_the_issues_verbatim(ctx: RunContext, eks_ext: Any) -> None:
    eks_ext.fail_next(EBS, "CREATE_FAILED", [ISSUE])
    action = _plan(ctx, _wanted(remedy=lambda issues: f"remedy for {len(issues)} issue(s)"))
    with pytest.raises(eks.AddonWaitFailed) as failed:
        action.run()
    assert failed.value.issues == ["[AccessDenied] not authorized: iam:PassRole (resources: sa)"]
    assert failed.value.fix == "remedy for 1 issue(s)"

    eks_ext.addons.clear()
    eks_ext.fail_next(EBS, "CREATE_FAILED", [ISSUE])
    with pytest.raises(eks.AddonWaitFailed) as plain:
        _plan(ctx, _wanted()).run()
    assert plain.value.fix == "fix the cause shown, then rerun"

    addon = eks_ext.seed_addon(CLUSTER, EBS, "v1.47.0-eksbuild.2", service_account_role_arn=ROLE)
    eks_ext.fail_next(EBS, "UPDATE_FAILED", [ISSUE])
    update = _plan(ctx, _wanted(version_policy="latest", remedy=lambda issues: " | ".join(issues)))
    with pytest.raises(eks.UpdateFailed) as update_failed:
        update.run()
    assert "is Failed: [AccessDenied] not authorized" in update_failed.value.message
    # The remedy sees the update's errors and the add-on's health issues.
    assert update_failed.value.fix.count("[AccessDenied]") == 2
    assert addon.status == "UPDATE_FAILED"


def test_without_wait_a_change_returns_once_eks_accepted_it(
    ctx: RunContext, aws_env: AwsEmulator, eks_ext: Any
) -> None:
    eks_ext.transition_describes = 5
    action = _plan(ctx, replace(_wanted(), wait=False))
    mark = aws_env.mark()
    action.run()
    assert [str(c) for c in aws_env.calls_since(mark)] == ["eks:CreateAddon -> 200"]
    assert eks_ext.addons[(CLUSTER, EBS)].status == "CREATING"
