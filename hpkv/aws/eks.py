"""EKS access: cluster description (endpoint, CA, version, OIDC issuer) and add-ons (describe,
versions and their choice as eksctl makes it, create/update/delete, and waits on add-on status and
on update IDs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpkv.aws import error_code, translate_errors
from hpkv.errors import ApiError, ConfigError, NotFound, PreconditionFailed, WaitTimeout

if TYPE_CHECKING:
    from hpkv.aws import AwsClients

# Add-on states in which EKS refuses to start another change.
BUSY = ("CREATING", "UPDATING", "DELETING")
# Add-on states that need a fix.
FAILED = ("CREATE_FAILED", "DEGRADED", "UPDATE_FAILED", "DELETE_FAILED")
# What an add-on version setting may say: default | latest | vX.Y.Z[-eksbuild.N].
VERSION_POLICY_PATTERN = r"^(default|latest|v?\d+\.\d+\.\d+(-eksbuild\.\d+)?)$"


def describe_cluster(aws: AwsClients, name: str) -> dict[str, Any]:
    import botocore.exceptions

    with translate_errors(f"eks:DescribeCluster on '{name}'"):
        try:
            return aws.eks.describe_cluster(name=name)["cluster"]
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) == "ResourceNotFoundException":
                raise NotFound(
                    f"EKS cluster '{name}' not found in {aws.region}",
                    fix="check --region; the HyperPod cluster's orchestrator points at it",
                ) from None
            raise


def oidc_issuer(cluster: dict[str, Any]) -> str | None:
    return ((cluster.get("identity") or {}).get("oidc") or {}).get("issuer")


# --- add-ons ------------------------------------------------------------------------------------
def describe_addon(aws: AwsClients, cluster: str, name: str) -> dict[str, Any] | None:
    """The add-on, or None when it is not installed."""
    import botocore.exceptions

    with translate_errors(f"eks:DescribeAddon {name} on '{cluster}'"):
        try:
            return aws.eks.describe_addon(clusterName=cluster, addonName=name)["addon"]
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) == "ResourceNotFoundException":
                return None
            raise


def addon_versions(aws: AwsClients, name: str, kubernetes_version: str) -> list[dict[str, Any]]:
    """DescribeAddonVersions for one add-on and Kubernetes version (all pages)."""
    with translate_errors(f"eks:DescribeAddonVersions {name}"):
        paginator = aws.eks.get_paginator("describe_addon_versions")
        versions: list[dict[str, Any]] = []
        for page in paginator.paginate(addonName=name, kubernetesVersion=kubernetes_version):
            for addon in page.get("addons", []):
                if addon.get("addonName") == name:
                    versions.extend(addon.get("addonVersions", []))
    return versions


def list_addons(aws: AwsClients, cluster: str) -> list[str]:
    with translate_errors(f"eks:ListAddons on '{cluster}'"):
        paginator = aws.eks.get_paginator("list_addons")
        return [n for page in paginator.paginate(clusterName=cluster) for n in page["addons"]]


def create_addon(aws: AwsClients, **params: Any) -> dict[str, Any] | None:
    """CreateAddon; None when the add-on exists already (e.g. an interrupted earlier run)."""
    import botocore.exceptions

    with translate_errors(f"eks:CreateAddon {params.get('addonName')}"):
        try:
            return aws.eks.create_addon(**params)["addon"]
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) == "ResourceInUseException":
                return None
            raise


def update_addon(aws: AwsClients, **params: Any) -> dict[str, Any]:
    """UpdateAddon; returns the update (its ``id`` is what to wait on)."""
    with translate_errors(f"eks:UpdateAddon {params.get('addonName')}"):
        return aws.eks.update_addon(**params)["update"]


def delete_addon(aws: AwsClients, cluster: str, name: str, *, preserve: bool = False) -> None:
    with translate_errors(f"eks:DeleteAddon {name}"):
        aws.eks.delete_addon(clusterName=cluster, addonName=name, preserve=preserve)


def _attempts(timeout: float, delay: float) -> int:
    import math

    return max(1, math.ceil(timeout / max(delay, 0.01)))


def wait_addon(
    aws: AwsClients, cluster: str, name: str, *, deleted: bool, timeout: float, delay: float
) -> dict[str, Any] | None:
    """botocore's AddonActive/AddonDeleted waiter. Returns the last DescribeAddon answer's add-on.

    Raises :class:`AddonWaitFailed` when the add-on enters a failure state and ``WaitTimeout``
    when ``timeout`` passes.
    """
    from botocore.exceptions import WaiterError

    waiter = aws.eks.get_waiter("addon_deleted" if deleted else "addon_active")
    what = "deleted" if deleted else "ACTIVE"
    try:
        with translate_errors(f"wait for add-on {name} to be {what}"):
            waiter.wait(
                clusterName=cluster,
                addonName=name,
                WaiterConfig={"Delay": delay, "MaxAttempts": _attempts(timeout, delay)},
            )
    except WaiterError as exc:
        addon = (exc.last_response or {}).get("addon") or {}
        if "Max attempts exceeded" in str(exc):
            raise WaitTimeout(
                f"add-on {name} was not {what} within {int(timeout)}s "
                f"(status {addon.get('status', 'unknown')})",
                fix="rerun later (the change continues in EKS) or raise --timeout",
            ) from None
        raise AddonWaitFailed(addon or {"addonName": name}) from None
    return None if deleted else describe_addon(aws, cluster, name)


def _update_waiter_model(delay: float, max_attempts: int) -> Any:
    from botocore.waiter import WaiterModel

    return WaiterModel(
        {
            "version": 2,
            "waiters": {
                "UpdateDone": {
                    "operation": "DescribeUpdate",
                    "delay": delay,
                    "maxAttempts": max_attempts,
                    "acceptors": [
                        {
                            "matcher": "path",
                            "argument": "update.status",
                            "expected": "Successful",
                            "state": "success",
                        },
                        {
                            "matcher": "path",
                            "argument": "update.status",
                            "expected": "Failed",
                            "state": "failure",
                        },
                        {
                            "matcher": "path",
                            "argument": "update.status",
                            "expected": "Cancelled",
                            "state": "failure",
                        },
                    ],
                }
            },
        }
    )


def wait_update(
    aws: AwsClients, cluster: str, name: str, update_id: str, *, timeout: float, delay: float
) -> dict[str, Any]:
    """Wait on an UpdateAddon's update ID (DescribeUpdate) until it is Successful.

    Waiting on the update rather than on the add-on's status avoids reading a stale ACTIVE before
    EKS moves the add-on to UPDATING. Raises :class:`UpdateFailed` or ``WaitTimeout``.
    """
    from botocore.exceptions import WaiterError
    from botocore.waiter import create_waiter_with_client

    model = _update_waiter_model(delay, _attempts(timeout, delay))
    waiter = create_waiter_with_client("UpdateDone", model, aws.eks)
    try:
        with translate_errors(f"wait for the update of add-on {name}"):
            waiter.wait(name=cluster, updateId=update_id, addonName=name)
    except WaiterError as exc:
        update = (exc.last_response or {}).get("update") or {}
        if "Max attempts exceeded" in str(exc):
            raise WaitTimeout(
                f"update {update_id} of add-on {name} did not finish within {int(timeout)}s "
                f"(status {update.get('status', 'unknown')})",
                fix="rerun later (the update continues in EKS) or raise --timeout",
            ) from None
        raise UpdateFailed(name, update) from None
    with translate_errors(f"eks:DescribeUpdate {update_id}"):
        return aws.eks.describe_update(name=cluster, updateId=update_id, addonName=name)["update"]


def health_issues(addon: dict[str, Any]) -> list[str]:
    """The add-on's health issues, verbatim, one string each."""
    lines = []
    for issue in (addon.get("health") or {}).get("issues") or []:
        text = f"[{issue.get('code', 'Unknown')}] {issue.get('message', '')}".strip()
        resources = issue.get("resourceIds") or []
        if resources:
            text += f" (resources: {', '.join(resources)})"
        lines.append(text)
    return lines


def health_summary(addon: dict[str, Any]) -> str:
    return "; ".join(health_issues(addon)) or "no health issues reported"


def update_errors(update: dict[str, Any]) -> list[str]:
    lines = []
    for error in update.get("errors") or []:
        text = f"[{error.get('errorCode', 'Unknown')}] {error.get('errorMessage', '')}".strip()
        resources = error.get("resourceIds") or []
        if resources:
            text += f" (resources: {', '.join(resources)})"
        lines.append(text)
    return lines


class AddonWaitFailed(ApiError):
    """An add-on entered CREATE_FAILED/DEGRADED/DELETE_FAILED while hpkv waited."""

    def __init__(self, addon: dict[str, Any], *, fix: str | None = None) -> None:
        self.addon = addon
        self.issues = health_issues(addon)
        detail = "; ".join(self.issues) or "EKS reports no health issues"
        super().__init__(
            f"add-on {addon.get('addonName')} is {addon.get('status')}: {detail}",
            fix=fix or "fix the cause shown, then rerun",
        )


class UpdateFailed(ApiError):
    """An add-on update ended Failed or Cancelled."""

    def __init__(self, name: str, update: dict[str, Any], *, fix: str | None = None) -> None:
        self.name = name
        self.update = update
        self.issues = update_errors(update)
        detail = "; ".join(self.issues) or "EKS reports no errors"
        super().__init__(
            f"update {update.get('id')} of add-on {name} is {update.get('status')}: {detail}",
            fix=fix or "fix the cause shown, then rerun",
        )


def version_key(version: str) -> tuple[int, ...]:
    """Sort key for add-on versions such as ``v1.14.1-eksbuild.1`` (numeric, build last)."""
    import re

    numbers = [int(n) for n in re.findall(r"\d+", version)]
    return tuple(numbers + [0] * (4 - len(numbers)))


# --- version choice (as eksctl) -------------------------------------------------------------------
def default_version(versions: list[dict[str, Any]], kubernetes_version: str) -> str | None:
    """The version DescribeAddonVersions flags as default for ``kubernetes_version``."""
    for version in versions:
        for compat in version.get("compatibilities") or []:
            if compat.get("clusterVersion") == kubernetes_version and compat.get("defaultVersion"):
                return version["addonVersion"]
    return None


def choose_version(
    name: str,
    policy: str,
    versions: list[dict[str, Any]],
    kubernetes_version: str,
    live_version: str | None,
    *,
    config_key: str,
    minimum: str | None = None,
) -> tuple[str, str]:
    """(version, why) for ``policy`` = default | latest | a (partial) version, as eksctl chooses.

    ``default`` keeps an installed version (at or above ``minimum``), else takes the version EKS
    flags as default for the cluster's Kubernetes version. ``config_key`` names the setting in
    messages.
    """
    available = sorted({v["addonVersion"] for v in versions}, key=version_key)
    if not available:
        raise PreconditionFailed(
            f"EKS offers no {name} add-on for Kubernetes {kubernetes_version}",
            fix="upgrade the EKS cluster to a Kubernetes version the add-on supports",
        )
    if policy == "latest":
        return available[-1], "latest"
    if policy == "default":
        if live_version is not None and (
            minimum is None or version_key(live_version) >= version_key(minimum)
        ):
            return live_version, "installed version kept"
        chosen = default_version(versions, kubernetes_version)
        if chosen is None:
            raise PreconditionFailed(
                f"EKS names no default {name} version for Kubernetes {kubernetes_version}",
                fix=f"set {config_key} to 'latest' or to one of: {', '.join(available)}",
            )
        return chosen, f"default for Kubernetes {kubernetes_version}"
    wanted = policy if policy.startswith("v") else f"v{policy}"
    if wanted in available:
        return wanted, "pinned"
    partial = [v for v in available if v.startswith(wanted + "-")]
    if partial:
        return partial[-1], f"newest build of {wanted}"
    raise ConfigError(
        f"{config_key}: {name} {policy} is not available for Kubernetes {kubernetes_version}",
        fix=f"use 'default', 'latest' or one of: {', '.join(available)}",
    )
