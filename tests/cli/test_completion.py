"""Shell completions: committed scripts match the app, and they complete for real in each shell."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hpkv.cli.completion import render_all

ROOT = Path(__file__).resolve().parents[2]
COMPLETIONS = ROOT / "completions"


def test_committed_completions_are_current() -> None:
    stale = [
        name
        for name, text in render_all().items()
        if not (COMPLETIONS / name).exists() or (COMPLETIONS / name).read_text() != text
    ]
    assert stale == [], f"stale: {stale}; run scripts/gen-completions.py"


def _bash(words: list[str]) -> list[str]:
    script = (
        f"source {COMPLETIONS / 'hpkv.bash'}\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        '_hpkv_completion; printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if line]


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["hpkv", "ti"], ["tiered-storage"]),
        (["hpkv", "tiered-storage", "ap"], ["apply"]),
        (["hpkv", "--cluster", "x", "tiered-storage", "apply", "--mem"], ["--memory-percent"]),
        (["hpkv", "tiered-storage", "status", "-o", ""], ["table", "json", "yaml"]),
    ],
)
def test_bash_completes(words: list[str], expected: list[str]) -> None:
    assert _bash(words) == expected


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("hpkv tiered-storage ap", ["apply"]),
        ("hpkv --cluster x tiered-storage apply --mem", ["--memory-percent"]),
        ("hpkv -o ", ["json", "table", "yaml"]),
    ],
)
def test_fish_completes(line: str, expected: list[str]) -> None:
    script = f"source {COMPLETIONS / 'hpkv.fish'}; complete -C '{line}'"
    out = subprocess.run(["fish", "-c", script], capture_output=True, text=True, check=True)
    assert sorted(row.split("\t")[0] for row in out.stdout.splitlines()) == expected


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
@pytest.mark.parametrize(
    ("words", "prefix", "expected"),
    [
        (["hpkv", "tiered-storage", ""], "", "describe: apply:Enable"),
        (["hpkv", "tiered-storage", "apply", "--m"], "--m", "compadd: -- "),
    ],
)
def test_zsh_completes(words: list[str], prefix: str, expected: str) -> None:
    # The completion system's builtins are stubbed to print what they are given; the script's own
    # logic (command path, candidates) runs for real.
    script = (
        'compadd() { print -r -- "compadd: $*" }\n'
        '_describe() { print -r -- "describe: ${(P)2}" }\n'
        "_files() { print files }\n"
        "compdef() { : }\n"
        f"words=({' '.join(repr(w) for w in words)}); CURRENT={len(words)}; PREFIX={prefix!r}\n"
        f"source {COMPLETIONS / '_hpkv'}\n"
    )
    out = subprocess.run(["zsh", "-f", "-c", script], capture_output=True, text=True, check=True)
    assert expected in out.stdout
    if prefix:
        assert "--memory-percent" in out.stdout
