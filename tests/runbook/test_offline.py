"""`hpkv up --offline --dry-run`: the full plan for the embedded example cluster with no API call,
no credentials and no cluster (the README's quick start)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpkv.config import Settings
from hpkv.context import RunContext
from hpkv.runbook.profile import load_profile
from hpkv.stages import stage_class, stage_names
from tests.harness.cli import run_hpkv

REPO = Path(__file__).resolve().parents[2]
HEAVY = {"boto3", "botocore", "kubernetes", "pyhelm3"}


def _bare_run(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run hpkv in a process with no AWS or Kubernetes configuration; report heavy imports."""
    probe = (
        "import json, runpy, sys\n"
        f"sys.argv = ['hpkv', *{args!r}]\n"
        "code = 0\n"
        "try:\n    runpy.run_module('hpkv', run_name='__main__')\n"
        "except SystemExit as exc:\n    code = exc.code\n"
        "sys.stderr.write('\\nMODULES ' + json.dumps(sorted({m.split('.')[0] for m in "
        "sys.modules})) + '\\n')\n"
        "sys.exit(code)\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(cwd),
        "PYTHONPATH": str(REPO),
        "COLUMNS": "160",
        "AWS_CONFIG_FILE": str(cwd / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(cwd / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=cwd, env=env
    )
    marker = out.stderr.rsplit("MODULES ", 1)
    modules = set(json.loads(marker[1])) if len(marker) == 2 else set()
    return out, modules & HEAVY


def _default_stages() -> list[str]:
    """What `up` runs without --bench: every stage but the optional benchmark."""
    return [name for name in stage_names() if not stage_class(name).optional]


def test_offline_dry_run_needs_no_credentials_and_calls_no_api(tmp_path: Path) -> None:
    out, heavy = _bare_run(["up", "--offline", "--dry-run"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert heavy == set()  # boto3/botocore/kubernetes never loaded: no API could be called
    text = out.stdout
    assert "offline plan for HyperPod cluster 'example' in us-west-2" in text
    assert "2 x ml.g6e.4xlarge; EKS example-eks 1.33" in text
    stages = _default_stages()
    assert stages == ["tiered-storage", "operator", "curvine", "l2"]
    for index, name in enumerate(stages, 1):
        assert f"stage {index}/{len(stages)}: {name}" in text
    assert "bench" not in [
        line.split(": ")[1] for line in text.splitlines() if "stage " in line[:7]
    ]
    assert "sagemaker cluster/example TieredStorageConfig" in text
    assert "not configured -> Enable at 20%" in text
    assert "dry run: nothing was changed" in text


def test_offline_json_is_one_document(tmp_path: Path) -> None:
    out, _ = _bare_run(["up", "--offline", "--dry-run", "-o", "json"], tmp_path)
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    assert payload["offline"] is True and payload["dryRun"] is True and payload["applied"] is False
    assert payload["profile"]["name"] == "example"
    assert [s["stage"] for s in payload["stages"]] == _default_stages()


def test_offline_dry_run_with_bench_shows_all_five_stages(tmp_path: Path) -> None:
    out, heavy = _bare_run(["up", "--offline", "--dry-run", "--bench"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert heavy == set()
    names = stage_names()
    assert len(names) == 5
    for index, name in enumerate(names, 1):
        assert f"stage {index}/5: {name}" in out.stdout
    assert "run the cross-pod scenario" in out.stdout


@pytest.mark.parametrize("stage", stage_names())
def test_every_stage_plans_the_example_cluster_offline(stage: str) -> None:
    """FOLLOW-UP: a stage without plan_offline fails here until it has one."""
    ctx = RunContext(Settings(data={"tieredStorage": {"memoryPercent": 20}}))
    plan = stage_class(stage)(ctx).plan_offline(load_profile())
    assert plan.actions, f"stage {stage} has no offline plan: implement Stage.plan_offline"
    assert plan.changes, f"stage {stage} plans nothing for a cluster with nothing installed"


def test_offline_uses_hpkv_yaml_and_a_custom_profile(isolated_env: Path) -> None:
    (isolated_env / "hpkv.yaml").write_text("tieredStorage:\n  memoryPercent: 40\n")
    default = run_hpkv(["up", "--offline", "--dry-run"])
    assert default.exit_code == 0, default
    assert "not configured -> Enable at 40%" in default.stdout

    (isolated_env / "mine.yaml").write_text(
        "name: mine\n"
        "instanceGroups: [{name: gpu, instanceType: ml.p5.48xlarge, count: 4}]\n"
        "tieredStorage: {Mode: Enable, InstanceMemoryAllocationPercentage: 40}\n"
    )
    mine = run_hpkv(["up", "--offline", "--dry-run", "--cluster-profile", "mine.yaml"])
    assert mine.exit_code == 0, mine
    assert "HyperPod cluster 'mine' in us-west-2 (4 x ml.p5.48xlarge; EKS mine-eks 1.33)" in (
        mine.stdout
    )
    assert "Enable at 40% (unchanged)" in mine.stdout


def test_profile_api_shapes() -> None:
    profile = load_profile()
    described = profile.describe_hyperpod()
    assert described["Orchestrator"]["Eks"]["ClusterArn"].endswith(":cluster/example-eks")
    assert "TieredStorageConfig" not in described and described["NodeRecovery"] == "Automatic"
    assert profile.describe_eks()["version"] == "1.33"
    assert len(profile.cluster_nodes()) == profile.node_count == 2
