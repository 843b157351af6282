"""Speed and memory of ``hpkv simulate`` (figures, not a pass/fail test).

Target (issue 9): 1,000,000 requests over 8 replicas in at most 10 s on a 2-core machine, memory
bounded. The workload is the default chat profile scaled to 8 replicas (4x the users and the
rate of the 2-replica default), streamed; each strategy runs in a fresh process so its peak RSS
is its own. Usage:

    .venv/bin/python benchmarks/simulate_speed.py [--requests N] [--replicas N] [--strategy S ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def one(strategy: str, requests: int, replicas: int) -> dict[str, float]:
    from hpkv.sizing.catalog import Catalog
    from hpkv.sizing.costmodel import CostModel
    from hpkv.sizing.runner import SimulateOptions, simulate

    catalog = Catalog()
    cost = CostModel(
        catalog.model("qwen2-7b"), catalog.instance_type("ml.g6e.4xlarge"), replicas=replicas
    )
    scale = replicas / 2
    options = SimulateOptions(
        spec_overrides={"requests": requests, "users": int(400 * scale), "rate": 4.0 * scale},
        strategies=(strategy,),
    )
    wall, cpu = time.perf_counter(), time.process_time()
    result = simulate(cost, options).to_dict()
    row = result["strategies"][0]
    return {
        "wallS": time.perf_counter() - wall,
        "cpuS": time.process_time() - cpu,
        "peakRssMiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "hitRate": row["hitRate"]["total"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument(
        "--strategy",
        action="append",
        choices=["roundrobin", "session", "prefixaware", "kvaware"],
        help="default: all four, one after the other",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one(args.child, args.requests, args.replicas)))
        return
    strategies = args.strategy or ["roundrobin", "session", "prefixaware", "kvaware"]
    print(
        f"hpkv simulate: {args.requests:,} requests, {args.replicas} replicas, chat workload, "
        f"{os.cpu_count()} CPU(s), Python {sys.version.split()[0]}"
    )
    print(
        f"{'strategy':<12} {'wall s':>8} {'cpu s':>8} {'req/s':>10} {'peak RSS MiB':>13} {'hit':>6}"
    )
    total_wall = total_cpu = 0.0
    for strategy in strategies:
        command = [sys.executable, __file__, "--child", strategy, "--requests", str(args.requests),
                   "--replicas", str(args.replicas)]  # fmt: skip
        figures = json.loads(
            subprocess.run(command, check=True, capture_output=True, text=True).stdout
        )
        total_wall += figures["wallS"]
        total_cpu += figures["cpuS"]
        print(
            f"{strategy:<12} {figures['wallS']:>8.2f} {figures['cpuS']:>8.2f} "
            f"{args.requests / figures['wallS']:>10,.0f} {figures['peakRssMiB']:>13.1f} "
            f"{figures['hitRate']:>6.1%}"
        )
    print(f"{'all':<12} {total_wall:>8.2f} {total_cpu:>8.2f}   (target: <= 10 s per strategy)")


if __name__ == "__main__":
    main()
