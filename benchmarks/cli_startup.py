#!/usr/bin/env python3
"""Cold-start time of `hpkv --help` (target: median within 150 ms on the development machine).

Runs the installed console script (or `python -m hpkv`) N times in fresh processes and prints the
median, p90 and min wall time, plus which heavy modules were imported (there must be none).

    .venv/bin/python benchmarks/cli_startup.py [--runs 30] [--args "tiered-storage --help"]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

HEAVY = ("boto3", "botocore", "kubernetes", "pyhelm3")


def command(args: list[str]) -> list[str]:
    script = shutil.which("hpkv", path=os.path.dirname(sys.executable)) or shutil.which("hpkv")
    return [script, *args] if script else [sys.executable, "-m", "hpkv", *args]


def heavy_imports(args: list[str]) -> list[str]:
    probe = (
        "import sys, runpy\n"
        f"sys.argv = ['hpkv', *{args!r}]\n"
        "try:\n    runpy.run_module('hpkv', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        f"print('\\n' + __import__('json').dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--args", default="--help")
    options = parser.parse_args()
    args = shlex.split(options.args)
    cmd = command(args)
    subprocess.run(cmd, capture_output=True, check=False)  # warm the page cache
    times = []
    for _ in range(options.runs):
        start = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=False)
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    p90 = times[max(0, int(len(times) * 0.9) - 1)]
    print(f"command: {' '.join(cmd)}")
    print(f"runs: {len(times)}")
    print(f"median_ms: {statistics.median(times):.1f}")
    print(f"p90_ms: {p90:.1f}")
    print(f"min_ms: {times[0]:.1f}")
    print(f"target_median_ms: 150 ({'met' if statistics.median(times) <= 150 else 'NOT met'})")
    print(f"heavy_modules_imported: {heavy_imports(args) or 'none'}")


if __name__ == "__main__":
    main()
