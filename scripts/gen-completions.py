#!/usr/bin/env python3
"""Write the static shell completion scripts in completions/ from the Typer app.

.venv/bin/python scripts/gen-completions.py          # rewrite completions/
.venv/bin/python scripts/gen-completions.py --check  # exit 1 if they are stale
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hpkv.cli.completion import render_all  # noqa: E402


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = []
    for name, text in render_all().items():
        path = ROOT / "completions" / name
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
    if stale:
        print(
            f"stale completions: {', '.join(stale)}; run scripts/gen-completions.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
