"""The bench client's own overhead: measured TTFT minus the server's true TTFT, at 256 streams.

Starts the fake vLLM server (tests/harness/fake_vllm.py) in its own process, sends requests from
hpkv's runner engine (one asyncio loop, raw streams) with 256 in flight, then reads the server's
per-request truth (from reading the request to writing the first token) from ``/_fake/requests``
and prints the difference per request. Target: p99 within 1 ms.

    .venv/bin/python benchmarks/bench_client_overhead.py [--streams 256] [--requests 2048]

The machine is shared: run it a few times, and note the load average it prints.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpkv.bench import runner  # noqa: E402
from hpkv.bench.stats import percentile  # noqa: E402


def _pin(cpu: int):  # type: ignore[no-untyped-def]
    """Server and client each on their own CPU (when there are two), so neither measures the
    other's work."""
    if (os.cpu_count() or 1) < 2 or not hasattr(os, "sched_setaffinity"):
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.harness.fake_vllm",
            "--pods",
            "1",
            "--base-ms",
            str(args.ttft_ms),
            "--prefill-ms-per-token",
            "0",
            "--itl-ms",
            str(args.itl_ms),
            "--jitter-ms",
            str(args.jitter_ms),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_pin(0),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise SystemExit(f"fake server did not start: {line!r}")
    return proc, json.loads(line[6:])["pods"][0]


def one_run(args: argparse.Namespace, url: str, index: int) -> tuple[list[float], float, int]:
    """(overhead per request in ms, wall seconds, requests ok)"""
    spec = {
        "runId": f"overhead-{os.getpid()}-{index}",
        "seed": index,
        "pods": [{"name": "pod-0", "url": url}],
        "router": None,
        "sharedPrefix": {
            "prefixes": 1,
            "prefixTokens": 64,
            "users": args.streams,
            "suffixTokens": 16,
            "requests": args.requests,
            "concurrency": args.streams,
            "maxTokens": args.output_tokens,
            "via": "pods",
        },
    }
    started = time.perf_counter()
    result = asyncio.run(runner.run_scenario(spec, "shared-prefix"))
    wall = time.perf_counter() - started
    with urllib.request.urlopen(url + "/_fake/requests", timeout=30) as response:
        truth = {t["id"]: t for t in json.load(response)}
    ok = [r for r in result["requests"] if r["ok"] and r["id"] in truth]
    return [r["ttftMs"] - truth[r["id"]]["ttft_true_ms"] for r in ok], wall, len(ok)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=256, help="requests in flight")
    parser.add_argument("--requests", type=int, default=2048, help="requests per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ttft-ms", type=float, default=200.0, help="server TTFT")
    parser.add_argument("--itl-ms", type=float, default=20.0)
    parser.add_argument(
        "--jitter-ms", type=float, default=100.0, help="spread of server TTFT (uniform)"
    )
    parser.add_argument("--output-tokens", type=int, default=8)
    args = parser.parse_args()

    proc, url = start_server(args)
    pin = _pin(1)
    if pin is not None:
        pin()
    runner.log_sink = lambda _message: None
    print(f"client overhead: measured TTFT - server's true TTFT, {args.streams} concurrent streams")
    print(
        f"server: TTFT {args.ttft_ms:.0f} ms (+0..{args.jitter_ms:.0f} ms), {args.output_tokens}"
        f" tokens every {args.itl_ms:.0f} ms; {args.requests} requests per run"
    )
    p99s = []
    complete = True
    try:
        for index in range(args.runs):
            overhead, wall, ok = one_run(args, url, index)
            complete &= ok == args.requests
            p99s.append(percentile(overhead, 99))
            figures = "  ".join(
                f"{label} {percentile(overhead, q):.3f}"
                for label, q in (("p50", 50), ("p90", 90), ("p99", 99))
            )
            print(
                f"run {index + 1}: {ok}/{args.requests} ok, {ok / wall:.0f} req/s, load "
                f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs | ms: {figures}  "
                f"max {max(overhead):.3f}"
            )
    finally:
        proc.terminate()
        proc.wait(10)
    median_p99 = sorted(p99s)[len(p99s) // 2]
    verdict = (
        "met" if median_p99 <= 1.0 else "NOT met (see the load average: the machine is shared)"
    )
    print(f"median p99 over {args.runs} runs: {median_p99:.3f} ms; target p99 <= 1 ms: {verdict}")
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
