"""CLI conventions every command follows: global options anywhere, output formats, confirmation,
dry run, and one-line errors with the documented exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.harness.aws import Fault
from tests.harness.cli import run_on_tty
from tests.harness.scenario import Scenario

pytestmark = [pytest.mark.kube, pytest.mark.aws]


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    assert lines[0].startswith("hpkv: error: ")
    assert "Traceback" not in stderr
    return lines[0]


def test_global_options_work_before_and_after_the_subcommand(scenario: Scenario) -> None:
    scenario.hyperpod(tiered_storage={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20})
    scenario.nodes(1)
    scenario.ai_toolkit()
    before = scenario.hpkv("--cluster", "demo", "-o", "json", "tiered-storage", "status")
    after = scenario.hpkv("tiered-storage", "status", "--cluster", "demo", "-o", "json")
    inline = scenario.hpkv("tiered-storage", "status", "--cluster=demo", "--output=json")
    assert before.exit_code == after.exit_code == inline.exit_code == 0, after
    assert json.loads(before.stdout) == json.loads(after.stdout) == json.loads(inline.stdout)
    assert after.stderr == ""


def test_yaml_output_and_table_output(scenario: Scenario) -> None:
    scenario.hyperpod(tiered_storage={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20})
    scenario.nodes(1)
    scenario.ai_toolkit()
    as_yaml = scenario.hpkv("tiered-storage", "status", "--cluster", "demo", "-o", "yaml")
    assert as_yaml.exit_code == 0
    assert yaml.safe_load(as_yaml.stdout)["state"] == "OK"
    table = scenario.hpkv("tiered-storage", "status", "--cluster", "demo")
    assert table.exit_code == 0
    assert "tiered-storage" in table.stdout and "overall: OK" in table.stdout
    assert "\x1b[" not in table.stdout  # no colour codes when not on a terminal


def test_dry_run_prints_plan_and_changes_nothing(scenario: Scenario) -> None:
    scenario.hyperpod()
    mark = scenario.mark()
    result = scenario.hpkv("tiered-storage", "apply", "--cluster", "demo", "--dry-run")
    assert result.exit_code == 0, result
    assert "update" in result.stdout and "Enable at 20%" in result.stdout
    assert "dry run: nothing was changed" in result.stdout
    assert scenario.writes_since(mark) == []
    as_json = scenario.hpkv(
        "tiered-storage", "apply", "--cluster", "demo", "--dry-run", "-o", "json"
    )
    payload = json.loads(as_json.stdout)
    assert payload["dryRun"] is True and payload["applied"] is False
    assert payload["plans"][0]["actions"][0]["verb"] == "update"


def test_mutation_without_tty_needs_yes(scenario: Scenario) -> None:
    scenario.hyperpod()
    mark = scenario.mark()
    result = scenario.hpkv("tiered-storage", "apply", "--cluster", "demo")
    assert result.exit_code == 2
    assert "--yes" in _one_line(result.stderr)
    assert scenario.writes_since(mark) == []


def _run_on_tty(args: list[str], answer: str, env: dict[str, str]) -> tuple[int, str]:
    """Run hpkv on a real pseudo-terminal and answer its prompt."""
    return run_on_tty(args, [(b"[y/N]", answer.encode())], env)


@pytest.mark.parametrize(("answer", "expected_code", "expected_writes"), [("n", 1, 0), ("y", 0, 1)])
def test_tty_asks_before_changing(
    scenario: Scenario, answer: str, expected_code: int, expected_writes: int
) -> None:
    scenario.hyperpod()
    scenario.nodes(1)
    scenario.play_hyperpod_tiered_storage()
    mark = scenario.mark()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    code, output = _run_on_tty(["tiered-storage", "apply", "--cluster", "demo"], answer, env)
    assert code == expected_code, output
    assert "Apply 1 change(s)?" in output
    writes = [w for w in scenario.writes_since(mark) if "UpdateCluster" in w]
    assert len(writes) == expected_writes
    if answer == "n":
        assert "cancelled; nothing was changed" in output


def test_missing_credentials_is_one_line(
    scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    result = scenario.hpkv("tiered-storage", "apply", "--cluster", "demo", "--yes")
    assert result.exit_code == 1
    line = _one_line(result.stderr)
    assert "no AWS credentials found" in line and "aws configure" in line


def test_denied_credentials_are_one_line(scenario: Scenario) -> None:
    scenario.hyperpod()
    scenario.aws.inject(Fault(service="sagemaker", action="DescribeCluster", kind="deny", times=-1))
    result = scenario.hpkv("tiered-storage", "apply", "--cluster", "demo", "--yes")
    assert result.exit_code == 1
    line = _one_line(result.stderr)
    assert "AWS denied sagemaker:DescribeCluster" in line
    assert "not authorized to perform: sagemaker:DescribeCluster" in line
    assert "hpkv diagnose --iam" in line


def test_expired_token_is_one_line(scenario: Scenario) -> None:
    scenario.hyperpod()
    scenario.aws.inject(Fault(service="sagemaker", kind="expired", times=-1))
    result = scenario.hpkv("tiered-storage", "status", "--cluster", "demo")
    assert result.exit_code == 3  # status commands: UNKNOWN
    assert "AWS credentials have expired" in _one_line(result.stderr)


def test_status_usage_error_is_unknown(scenario: Scenario) -> None:
    result = scenario.hpkv("tiered-storage", "status", "--bogus")
    assert result.exit_code == 3
    assert "No such option: --bogus" in _one_line(result.stderr)


def test_kubernetes_denied_is_one_line(scenario: Scenario) -> None:
    scenario.hyperpod(tiered_storage={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20})
    kubeconfig = scenario.kube.write_kubeconfig(
        scenario.workdir / "ro-kubeconfig", context="ro", user="readonly"
    )
    scenario.kube.apply_object(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "aws-hyperpod"}}
    )
    scenario.kube.apply_object(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "hpkv-test-no-nodes"},
            "rules": [],
        }
    )
    result = scenario.hpkv(
        "tiered-storage",
        "status",
        "--cluster",
        "demo",
        "--kubeconfig",
        str(kubeconfig),
        "-o",
        "json",
    )
    # The readonly user may not list nodes (cluster-scoped, not in 'view'): that check is UNKNOWN.
    assert result.exit_code == 3, result
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["ai-toolkit-daemonset"]["state"] == "unknown"
    assert "Kubernetes denied" in checks["ai-toolkit-daemonset"]["evidence"]


def test_unknown_context_and_broken_kubeconfig(scenario: Scenario) -> None:
    scenario.hyperpod(tiered_storage={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20})
    result = scenario.hpkv(
        "tiered-storage", "status", "--cluster", "demo", "--context", "nope", "-o", "json"
    )
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert "context 'nope' is not in kubeconfig" in checks["ai-toolkit-daemonset"]["evidence"]
    broken = scenario.workdir / "broken"
    broken.write_text("clusters: [unclosed\n")
    result = scenario.hpkv(
        "tiered-storage", "status", "--cluster", "demo", "--kubeconfig", str(broken), "-o", "json"
    )
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert "is not valid YAML" in checks["ai-toolkit-daemonset"]["evidence"]


def test_debug_shows_traceback_never_locals(scenario: Scenario) -> None:
    result = scenario.hpkv("tiered-storage", "apply", "--cluster", "nope", "--yes", "--debug")
    assert result.exit_code == 1
    assert "Traceback" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("hpkv: error: HyperPod cluster 'nope'")
    assert "SECRET" not in result.stderr and "secret_key" not in result.stderr


def test_version_and_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hpkv", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.startswith("hpkv ")
    out = subprocess.run([sys.executable, "-m", "hpkv"], capture_output=True, text=True)
    assert "tiered-storage" in out.stdout
