"""Declarative object handling shared by the stages: read, compare, server-side apply, delete.

``plan_apply`` reads the live object and compares only the fields hpkv sets (the desired object
must be a subset of the live one; fields the API server defaults are ignored). A converged object
yields a ``none`` action, so a second apply makes no write. Writes are server-side apply with field
manager ``hpkv`` and ``force`` (hpkv owns the fields it sets).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from hpkv.kube import FIELD_MANAGER, is_status, kube_errors
from hpkv.stages.base import Action, Verb

if TYPE_CHECKING:
    from hpkv.kube import KubeClients


def describe(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata", {})
    ns = meta.get("namespace")
    kind = obj.get("kind", "?")
    return f"{kind}/{ns}/{meta.get('name')}" if ns else f"{kind}/{meta.get('name')}"


def read(
    kube: KubeClients, api_version: str, kind: str, name: str, namespace: str | None = None
) -> dict[str, Any] | None:
    resource = kube.resource(api_version, kind)
    with kube_errors(f"read {kind} {namespace + '/' if namespace else ''}{name}"):
        try:
            obj = (
                resource.get(name=name, namespace=namespace)
                if namespace
                else resource.get(name=name)
            )
        except Exception as exc:
            if is_status(exc, 404):
                return None
            raise
    return obj.to_dict()


def is_subset(desired: Any, live: Any) -> bool:
    """True when every field in ``desired`` has the same value in ``live``."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return False
        return all(is_subset(v, live.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(live, list) or len(desired) != len(live):
            return False
        return all(is_subset(d, item) for d, item in zip(desired, live, strict=True))
    if desired is None:
        return live is None or live == {} or live == []
    if (
        isinstance(desired, (int, float))
        and not isinstance(desired, bool)
        and isinstance(live, str)
    ):
        return str(desired) == live
    return desired == live


def live_view(desired: Any, live: Any) -> Any:
    """The part of ``live`` at the paths ``desired`` sets (for before/after diffs)."""
    if isinstance(desired, dict) and isinstance(live, dict):
        return {k: live_view(v, live.get(k)) for k, v in desired.items() if k in live}
    if isinstance(desired, list) and isinstance(live, list):
        return [live_view(d, item) for d, item in zip(desired, live, strict=False)] + live[
            len(desired) :
        ]
    return copy.deepcopy(live)


def comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """The desired object without apiVersion/kind/identity fields that never differ."""
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "status")}
    meta = dict(body.get("metadata", {}))
    meta.pop("name", None)
    meta.pop("namespace", None)
    body["metadata"] = meta
    if not meta:
        body.pop("metadata")
    return body


def apply(kube: KubeClients, obj: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    """Server-side apply; ``dry_run`` asks the API server to admit and validate it, not store it."""
    meta = obj["metadata"]
    resource = kube.resource(obj["apiVersion"], obj["kind"])
    extra = {"dry_run": "All"} if dry_run else {}
    with kube_errors(f"{'dry-run ' if dry_run else ''}apply {describe(obj)}"):
        result = resource.server_side_apply(
            body=obj,
            name=meta["name"],
            namespace=meta.get("namespace"),
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
            **extra,
        )
    return result.to_dict()


def delete(
    kube: KubeClients, api_version: str, kind: str, name: str, namespace: str | None = None
) -> bool:
    """Delete an object; False when it was already gone."""
    resource = kube.resource(api_version, kind)
    with kube_errors(f"delete {kind} {namespace + '/' if namespace else ''}{name}"):
        try:
            if namespace:
                resource.delete(name=name, namespace=namespace)
            else:
                resource.delete(name=name)
        except Exception as exc:
            if is_status(exc, 404):
                return False
            raise
    return True


def plan_apply(kube: KubeClients, obj: dict[str, Any], *, summary: str | None = None) -> Action:
    meta = obj["metadata"]
    live = read(kube, obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
    desired = comparable(obj)
    target = describe(obj)
    if live is None:
        return Action(
            target, Verb.CREATE, summary or "create", None, desired, run=lambda: apply(kube, obj)
        )
    if is_subset(desired, live):
        return Action(target, Verb.NONE, "up to date", desired, desired)
    return Action(
        target,
        Verb.UPDATE,
        summary or "update the fields hpkv manages",
        live_view(desired, live),
        desired,
        run=lambda: apply(kube, obj),
    )


def plan_delete(
    kube: KubeClients,
    api_version: str,
    kind: str,
    name: str,
    namespace: str | None = None,
    *,
    summary: str = "delete",
    destructive: bool = False,
) -> Action:
    live = read(kube, api_version, kind, name, namespace)
    target = f"{kind}/{namespace}/{name}" if namespace else f"{kind}/{name}"
    if live is None:
        return Action(target, Verb.NONE, "already absent")
    return Action(
        target,
        Verb.DELETE,
        summary,
        before={"exists": True},
        after=None,
        run=lambda: delete(kube, api_version, kind, name, namespace),
        destructive=destructive,
    )
