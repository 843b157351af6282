"""A stage for testing the health framework: checks that pass, need the installation, hang,
raise, or return several checks; its installation state is set by the test."""

from __future__ import annotations

import time
from typing import ClassVar

from hpkv.errors import ApiError
from hpkv.stages.base import (
    Check,
    CheckSpec,
    CheckState,
    Detector,
    Finding,
    IamNeed,
    Severity,
    Stage,
)

IAM_ACTIONS: list[IamNeed] = []  # it calls no AWS API


class FakeStage(Stage):
    name = "fake"
    title = "A fake stage"
    number = 9
    installed_state: ClassVar[bool | Exception | None] = True
    slow_seconds: ClassVar[float] = 3.0

    def installed(self) -> bool | None:
        state = FakeStage.installed_state
        if isinstance(state, Exception):
            raise state
        return state

    def check_functions(self) -> list[CheckSpec]:
        return [
            CheckSpec("fast", lambda: [self.check("fast", CheckState.OK, "fine")], False),
            CheckSpec("needs-install", lambda: [self.check("needs-install", CheckState.OK, "ok")]),
            CheckSpec("slow", self._slow),
            CheckSpec("broken", self._broken),
            CheckSpec("bug", lambda: [Check("bug", CheckState.OK, str(1 / 0))]),
            CheckSpec(
                "many",
                lambda: [Check("a", CheckState.WARN, "one"), Check("b", CheckState.OK, "two")],
            ),
        ]

    def detectors(self) -> list[Detector]:
        return [
            Detector.of(
                "fake.always", "Always finds something", "fake", self._always, stage=self.name
            )
        ]

    def _always(self, detector: Detector) -> list[Finding]:
        return [detector.finding(Severity.WARNING, "found it", "fix it", ["Thing/x"])]

    def _slow(self) -> list[Check]:
        time.sleep(FakeStage.slow_seconds)
        return [self.check("slow", CheckState.OK, "eventually")]

    def _broken(self) -> list[Check]:
        raise ApiError("the fake API failed", fix="retry")
