"""What a health run inspects: the cluster-wide group, then every registered stage in run order.

The cluster-wide group (``cluster``) follows the stage contract without being a stage: it has
checks and detectors but nothing to apply. Stages come from ``hpkv.stages.STAGES``, so a newly
registered stage's checks and detectors join ``hpkv status`` and ``hpkv diagnose`` by themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hpkv.errors import HpkvError, UsageError

if TYPE_CHECKING:
    from hpkv.context import RunContext
    from hpkv.stages.base import Stage

CLUSTER_SECTION = "cluster"


def section_names() -> list[str]:
    from hpkv.stages import stage_names

    return [CLUSTER_SECTION, *stage_names()]


def sections(ctx: RunContext, only: Sequence[str] | None = None) -> list[Stage]:
    """The cluster group and the stages, as Stage objects; ``only`` restricts them by name."""
    from hpkv.health.cluster import ClusterSection
    from hpkv.stages import stage_classes

    known = section_names()
    unknown = [name for name in only or [] if name not in known]
    if unknown:
        raise UsageError(f"unknown stage '{unknown[0]}'", fix=f"use one of: {', '.join(known)}")
    everything: list[Stage] = [ClusterSection(ctx), *(cls(ctx) for cls in stage_classes())]
    return [s for s in everything if not only or s.name in only]


def namespaces(ctx: RunContext, stages: Sequence[Stage]) -> list[str]:
    """Namespaces to inspect: the stages' own, the operator's, Curvine's and kube-system."""
    from hpkv import topology

    names = {
        topology.OPERATOR_NAMESPACE,
        str(ctx.settings.section("curvine").get("namespace") or topology.CURVINE_NAMESPACE),
        "kube-system",
    }
    for stage in stages:
        try:
            names.update(stage.namespaces())
        except HpkvError:
            continue  # a stage that cannot tell (API down) adds none; the others still count
    return sorted(names)
