"""EKS add-ons planned as Actions, for every stage that installs one.

The version is chosen as eksctl does (:func:`hpkv.aws.eks.choose_version`); the settings hpkv
manages (``serviceAccountRoleArn``, ``configurationValues``) are compared with DescribeAddon's
answer, and configuration keys hpkv does not manage are kept on update. A ``CREATE_FAILED`` add-on
is re-created (deleted with ``--preserve``, then created with the same settings); a ``DEGRADED`` or
``UPDATE_FAILED`` one without other differences is repaired with an update. Every change is waited
for: after CreateAddon on the add-on's status, after UpdateAddon on the update ID (DescribeUpdate),
which avoids reading a stale ACTIVE before EKS moves the add-on to UPDATING.

The caller reads the add-on and decides what to do while it is busy (``eks.BUSY``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpkv.aws import eks, iam
from hpkv.context import poll_interval
from hpkv.errors import PreconditionFailed
from hpkv.stages.base import Action, Detector, Finding, IamNeed, Severity, Verb

if TYPE_CHECKING:
    from hpkv.context import RunContext

REPAIRABLE = ("DEGRADED", "UPDATE_FAILED")
_EKS_CLUSTER = "{eks_cluster_arn}"
_ADDONS = "arn:{partition}:eks:{region}:{account}:addon/{eks_cluster}/*/*"


def iam_needs(why: str) -> list[IamNeed]:
    """What planning and applying an add-on calls (this module and hpkv.aws.eks), for a stage's
    ``IAM_ACTIONS``."""
    return [
        IamNeed("eks:DescribeAddon", _ADDONS, why),
        IamNeed("eks:DescribeAddonVersions", "*", f"{why}: choose the version as eksctl does"),
        IamNeed("eks:CreateAddon", _EKS_CLUSTER, why),
        IamNeed("eks:TagResource", _ADDONS, "tag the add-ons hpkv creates (hpkv:managed-by)"),
        IamNeed("eks:UpdateAddon", _ADDONS, why),
        IamNeed("eks:DescribeUpdate", _EKS_CLUSTER, "wait for an add-on update"),
        IamNeed("eks:DeleteAddon", _ADDONS, "re-create a CREATE_FAILED add-on (--preserve)"),
    ]


@dataclass(frozen=True)
class AddonWanted:
    """An add-on as a stage wants it.

    ``version_policy``: default | latest | a (partial) version, from the hpkv.yaml key
    ``config_key``. ``settings``: ``serviceAccountRoleArn`` and/or ``configurationValues`` (an
    object). ``remedy``: the fix to name for a failure, from its health issues. ``wait``: wait for
    each change to finish (False: return once EKS accepted it).
    """

    cluster: str
    name: str
    kubernetes_version: str
    version_policy: str
    config_key: str
    settings: dict[str, Any] = field(default_factory=dict)
    resolve_create: str = "OVERWRITE"
    resolve_update: str = "OVERWRITE"
    tags: dict[str, str] = field(default_factory=lambda: {iam.MANAGED_BY_TAG: iam.MANAGED_BY_VALUE})
    minimum: str | None = None
    minimum_source: str = "hpkv supports"
    remedy: Callable[[list[str]], str] | None = None
    wait: bool = True

    @property
    def target(self) -> str:
        return f"eks addon/{self.name}"


def parse_configuration(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def setting_differences(live: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """The settings hpkv manages that the live add-on lacks (other configuration keys are the
    user's and stay)."""
    from hpkv.kube.objects import is_subset

    differences = []
    if (
        "serviceAccountRoleArn" in settings
        and live.get("serviceAccountRoleArn") != settings["serviceAccountRoleArn"]
    ):
        differences.append("serviceAccountRoleArn")
    if "configurationValues" in settings:
        current = parse_configuration(live.get("configurationValues")) or {}
        if not is_subset(settings["configurationValues"], current):
            differences.append("configurationValues")
    return differences


# --- plan -----------------------------------------------------------------------------------------
def plan_addon(ctx: RunContext, wanted: AddonWanted, live: dict[str, Any] | None) -> Action:
    """Create, re-create, update, repair or leave the add-on (``live``: DescribeAddon's answer)."""
    versions = eks.addon_versions(ctx.aws, wanted.name, wanted.kubernetes_version)
    version, why = eks.choose_version(
        wanted.name,
        wanted.version_policy,
        versions,
        wanted.kubernetes_version,
        live.get("addonVersion") if live else None,
        config_key=wanted.config_key,
        minimum=wanted.minimum,
    )
    _check_minimum(wanted, version, why)
    request = _request(wanted, version)
    after = {"addonVersion": version, **wanted.settings}
    if live is None:
        return Action(
            wanted.target,
            Verb.CREATE,
            f"create {version} ({why})",
            None,
            after,
            run=lambda: _create(ctx, wanted, request),
        )
    before = {
        "addonVersion": live.get("addonVersion"),
        "status": live.get("status"),
        **{key: live.get(key) for key in ("serviceAccountRoleArn",) if key in wanted.settings},
        **(
            {"configurationValues": parse_configuration(live.get("configurationValues"))}
            if "configurationValues" in wanted.settings
            else {}
        ),
    }
    status = live.get("status")
    if status == "CREATE_FAILED":
        return Action(
            wanted.target,
            Verb.UPDATE,
            f"re-create (CREATE_FAILED: {eks.health_summary(live)}): delete with --preserve, "
            f"create {version}",
            before,
            after,
            run=lambda: _recreate(ctx, wanted, request),
        )
    differences = setting_differences(live, wanted.settings)
    if live.get("addonVersion") != version:
        differences.insert(0, f"version {live.get('addonVersion')} -> {version} ({why})")
    if not differences and status in REPAIRABLE:
        differences.append(
            f"repair ({status}: {eks.health_summary(live)}) with resolve-conflicts "
            f"{wanted.resolve_update}"
        )
    if not differences:
        return Action(wanted.target, Verb.NONE, f"{version} {status}, configuration unchanged")
    update = {k: v for k, v in request.items() if k != "tags"}
    update["resolveConflicts"] = wanted.resolve_update
    if "configurationValues" in wanted.settings:
        # Keep configuration keys hpkv does not manage (e.g. jumpstartGatedModelDownloadRoleArn).
        from hpkv.config import deep_merge

        current = parse_configuration(live.get("configurationValues"))
        merged = deep_merge(
            current if isinstance(current, dict) else {}, wanted.settings["configurationValues"]
        )
        update["configurationValues"] = json.dumps(merged, sort_keys=True)
    return Action(
        wanted.target,
        Verb.UPDATE,
        "update: " + "; ".join(differences),
        before,
        after,
        run=lambda: _update(ctx, wanted, update),
    )


def _check_minimum(wanted: AddonWanted, version: str, why: str) -> None:
    if wanted.minimum and eks.version_key(version) < eks.version_key(wanted.minimum):
        raise PreconditionFailed(
            f"{wanted.name} {version} ({why}) is below {wanted.minimum}, the minimum "
            f"{wanted.minimum_source}",
            fix=f"set {wanted.config_key} to 'latest' or to {wanted.minimum} or newer",
        )


def _request(wanted: AddonWanted, version: str) -> dict[str, Any]:
    request: dict[str, Any] = {
        "clusterName": wanted.cluster,
        "addonName": wanted.name,
        "addonVersion": version,
        "resolveConflicts": wanted.resolve_create,
        "tags": dict(wanted.tags),
    }
    if "serviceAccountRoleArn" in wanted.settings:
        request["serviceAccountRoleArn"] = wanted.settings["serviceAccountRoleArn"]
    if "configurationValues" in wanted.settings:
        request["configurationValues"] = json.dumps(
            wanted.settings["configurationValues"], sort_keys=True
        )
    return request


# --- writes and waits -----------------------------------------------------------------------------
def _create(ctx: RunContext, wanted: AddonWanted, request: dict[str, Any]) -> None:
    # None: it exists already (an interrupted earlier run created it); wait for that one.
    eks.create_addon(ctx.aws, **request)
    if wanted.wait:
        wait_for(ctx, wanted.cluster, wanted.name, remedy=wanted.remedy)


def _recreate(ctx: RunContext, wanted: AddonWanted, request: dict[str, Any]) -> None:
    eks.delete_addon(ctx.aws, wanted.cluster, wanted.name, preserve=True)
    # Always waited for: CreateAddon fails while the add-on still exists.
    wait_for(
        ctx, wanted.cluster, wanted.name, deleted=True, remedy=wanted.remedy, what="failed add-on"
    )
    _create(ctx, wanted, request)


def _update(ctx: RunContext, wanted: AddonWanted, request: dict[str, Any]) -> None:
    update = eks.update_addon(ctx.aws, **request)
    if not wanted.wait:
        return
    name = wanted.name
    with ctx.reporter.waiting(f"waiting for update {update['id']} of add-on {name}"):
        try:
            eks.wait_update(
                ctx.aws,
                wanted.cluster,
                name,
                update["id"],
                timeout=ctx.options.timeout,
                delay=poll_interval(10.0),
            )
        except eks.UpdateFailed as exc:
            if wanted.remedy is None:
                raise
            live = eks.describe_addon(ctx.aws, wanted.cluster, name) or {}
            issues = exc.issues + eks.health_issues(live)
            raise eks.UpdateFailed(name, exc.update, fix=wanted.remedy(issues)) from None
    wait_for(ctx, wanted.cluster, name, remedy=wanted.remedy)


def wait_for(
    ctx: RunContext,
    cluster: str,
    name: str,
    *,
    deleted: bool = False,
    remedy: Callable[[list[str]], str] | None = None,
    what: str = "add-on",
) -> None:
    """Wait until the add-on is ACTIVE (or deleted). A failure state raises AddonWaitFailed, with
    ``remedy``'s fix for its health issues when given; the time limit raises WaitTimeout."""
    state = "deleted" if deleted else "ACTIVE"
    with ctx.reporter.waiting(f"waiting for {what} {name} to be {state}"):
        try:
            eks.wait_addon(
                ctx.aws,
                cluster,
                name,
                deleted=deleted,
                timeout=ctx.options.timeout,
                delay=poll_interval(10.0),
            )
        except eks.AddonWaitFailed as exc:
            if remedy is None:
                raise
            raise eks.AddonWaitFailed(exc.addon, fix=remedy(exc.issues)) from None


def failed_addon_finding(
    detector: Detector, cluster: str, addon: dict[str, Any], remedy: Callable[[list[str]], str]
) -> Finding:
    """A failed or degraded add-on (``eks.FAILED``) with its health issues and the fix they point
    to, for ``hpkv diagnose``."""
    name, status = addon.get("addonName", "?"), addon.get("status")
    return detector.finding(
        Severity.CRITICAL,
        f"add-on {name} is {status} at {addon.get('addonVersion', '?')}: "
        f"{eks.health_summary(addon)}",
        remedy(eks.health_issues(addon))
        + f"; inspect with 'aws eks describe-addon --cluster-name {cluster} --addon-name {name} "
        "--query addon.health'",
        [f"eks addon/{name}"],
        title=f"add-on {name} is {status}",
    )
