"""Where the harness binaries live (built or downloaded by scripts/prepare-harness.sh)."""

from __future__ import annotations

import os
from pathlib import Path


def harness_dir() -> Path:
    explicit = os.environ.get("HPKV_HARNESS_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hpkv-test"


def harness_binary(name: str) -> Path:
    path = harness_dir() / "bin" / name
    if not path.exists():
        raise RuntimeError(
            f"test harness binary {path} is missing: run scripts/prepare-harness.sh "
            "(or the README's test command, which runs it)"
        )
    return path
