"""`hpkv diagnose` as a command: the detector list, the README's id table, exit codes, schema."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hpkv.config import Settings
from hpkv.context import RunContext
from hpkv.health.diagnose import catalog
from tests.harness.cli import run_hpkv
from tests.harness.scenario import Scenario
from tests.health.conftest import validate

README = Path(__file__).resolve().parents[2] / "README.md"


def test_list_reads_nothing_and_names_every_detector(isolated_env: Path) -> None:
    result = run_hpkv(["diagnose", "--list", "-o", "json"])
    assert result.exit_code == 0, result
    listed = json.loads(result.stdout)["detectors"]
    ids = [d["id"] for d in listed]
    assert len(ids) == len(set(ids))
    assert "tiered-storage.node-recovery-missing" in ids and "pods.crash-looping" in ids
    assert all(re.fullmatch(r"[a-z0-9-]+(\.[a-z0-9-]+)+", i) for i in ids)
    table = run_hpkv(["diagnose", "--list"])
    assert "pvc.pending" in table.stdout and "COMPONENT" in table.stdout


def test_readme_documents_every_detector_id() -> None:
    ids = {d.id for d in catalog(RunContext(Settings({})))}
    section = README.read_text().split("## Status and diagnose", 1)[1].split("\n## ", 1)[0]
    table = section.split("| id | severity | finds |", 1)[1].split("\n\n", 1)[0]
    documented = set(re.findall(r"^\| `([a-z0-9.-]+)` \|", table, re.MULTILINE))
    assert documented == ids


@pytest.mark.kube
@pytest.mark.aws
def test_findings_in_a_table_and_in_json(scenario: Scenario) -> None:
    scenario.hyperpod(node_recovery=None)
    scenario.nodes(1)
    table = scenario.hpkv("diagnose", "--cluster", "demo")
    assert table.exit_code == 1, table
    assert "tiered-storage.node-recovery-missing" in table.stdout
    assert "overall: WARNING" in table.stdout and table.stderr == ""
    as_json = scenario.hpkv("diagnose", "--cluster", "demo", "-o", "json", "--stage", "cluster")
    document = json.loads(as_json.stdout)
    validate(document, "diagnose")
    assert document["findings"] == [] and as_json.exit_code == 0
    assert {d["stage"] for d in document["detectors"]} == {"cluster"}
