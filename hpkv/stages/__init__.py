"""The stages, in the order ``hpkv up`` runs them (``hpkv down`` reverses it).

Each entry names the module and class that hold the stage's whole logic; modules are imported on
use so the CLI starts fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpkv.stages.base import Stage

# (stage name, module, class)
STAGES: list[tuple[str, str, str]] = [
    ("tiered-storage", "hpkv.stages.tiered_storage", "TieredStorageStage"),
    ("operator", "hpkv.stages.operator", "OperatorStage"),
    ("curvine", "hpkv.stages.curvine", "CurvineStage"),
    ("l2", "hpkv.stages.l2", "L2Stage"),
    ("bench", "hpkv.stages.bench", "BenchStage"),
]


def stage_names() -> list[str]:
    return [name for name, _module, _cls in STAGES]


def stage_class(name: str) -> type[Stage]:
    for stage_name, module, cls in STAGES:
        if stage_name == name:
            return getattr(importlib.import_module(module), cls)
    raise KeyError(name)


def stage_classes() -> list[type[Stage]]:
    return [stage_class(name) for name in stage_names()]
