"""Fast start: help and completion never import boto3, botocore, kubernetes or pyhelm3."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer

from hpkv.cli.main import app

HEAVY = {"boto3", "botocore", "kubernetes", "pyhelm3"}


def _group_paths() -> list[list[str]]:
    root = typer.main.get_command(app)
    paths: list[list[str]] = [[]]
    for name, command in root.commands.items():
        paths.append([name])
        for sub in getattr(command, "commands", {}) or {}:
            paths.append([name, sub])
    return paths


def _imported_heavy(args: list[str]) -> tuple[set[str], str]:
    probe = (
        "import json, runpy, sys\n"
        f"sys.argv = ['hpkv', *{args!r}]\n"
        "try:\n    runpy.run_module('hpkv', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    modules = set(json.loads(out.stderr.strip().splitlines()[-1]))
    return modules & HEAVY, out.stdout


@pytest.mark.parametrize("path", _group_paths(), ids=lambda p: " ".join(p) or "root")
def test_help_imports_no_heavy_module(path: list[str]) -> None:
    heavy, stdout = _imported_heavy([*path, "--help"])
    assert heavy == set()
    assert "Usage:" in stdout


def test_usage_error_imports_no_heavy_module() -> None:
    heavy, _ = _imported_heavy(["tiered-storage", "apply", "--memory-percent", "5"])
    assert heavy == set()
