#!/usr/bin/env python3
"""Wall time of ``hpkv status`` with 50 ms added to every AWS and Kubernetes call (figures, not a
pass/fail test).

Targets (issue 7): a full ``hpkv status`` within 1 s, and at least 5 times faster than the same
reads made one after another. Starts the test harness (the AWS emulator and a real
kube-apiserver behind the latency proxy; see tests/harness), seeds a HyperPod cluster with Tiered
Storage on N nodes, then measures:

* ``hpkv status --cluster demo -o json`` through the CLI, in process, each run with fresh clients
  (as a new invocation would have; imports are warm after the first run);
* the same collection with 16 workers and with 1 worker (every check, and every read inside a
  check, one after another), with the number of AWS and Kubernetes requests each made.

Run from the repository root:

    .venv/bin/python benchmarks/status_latency.py [--runs 5] [--latency 0.05] [--nodes 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--latency", type=float, default=0.05, help="seconds added per call")
    parser.add_argument("--nodes", type=int, default=4)
    options = parser.parse_args()

    from tests.harness.aws import AwsEmulator
    from tests.harness.kube import KubeHarness
    from tests.harness.kube_proxy import KubeProxy
    from tests.harness.scenario import Scenario

    workdir = Path(tempfile.mkdtemp(prefix="hpkv-bench-"))
    aws = AwsEmulator().start()
    kube = KubeHarness.start()
    proxy = KubeProxy(kube).start()
    try:
        os.environ.update(aws.env())
        kubeconfig = workdir / "kubeconfig"
        os.environ["KUBECONFIG"] = str(kubeconfig)
        os.environ["HOME"] = str(workdir)
        os.environ.pop("HPKV_SHARED_DIR", None)
        scenario = Scenario(aws=aws, kube=kube, workdir=workdir, kubeconfig=kubeconfig, proxy=proxy)
        scenario.hyperpod(
            tiered_storage={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20}
        )
        scenario.nodes(options.nodes)
        scenario.ai_toolkit()
        aws.latency = proxy.latency = options.latency
        report(scenario, options.runs, options.latency)
    finally:
        proxy.stop()
        kube.stop()
        aws.stop()


def report(scenario, runs: int, latency: float) -> None:  # type: ignore[no-untyped-def]
    from tests.harness.cli import run_hpkv

    def cli_once() -> float:
        started = time.perf_counter()
        result = run_hpkv(["status", "--cluster", "demo", "-o", "json"])
        elapsed = time.perf_counter() - started
        if result.exit_code != 0:
            raise SystemExit(f"hpkv status failed:\n{result}")
        return elapsed

    cli_once()  # warm imports
    cli = [cli_once() for _ in range(runs)]
    concurrent = [collect(scenario, workers=16) for _ in range(runs)]
    sequential = [collect(scenario, workers=1) for _ in range(runs)]
    median = statistics.median
    print(f"latency injected per AWS and Kubernetes call: {latency * 1000:.0f} ms")
    print(
        f"hpkv status (CLI, fresh clients): median {median(cli):.3f} s, "
        f"min {min(cli):.3f} s, max {max(cli):.3f} s   (target <= 1 s)"
    )
    c_time = median(t for t, _a, _k in concurrent)
    s_time = median(t for t, _a, _k in sequential)
    _t, aws_calls, kube_calls = concurrent[0]
    print(
        f"checks concurrently (16 workers): median {c_time:.3f} s; "
        f"{aws_calls} AWS + {kube_calls} Kubernetes requests"
    )
    _t, aws_seq, kube_seq = sequential[0]
    print(
        f"same reads one after another (1 worker): median {s_time:.3f} s; "
        f"{aws_seq} AWS + {kube_seq} Kubernetes requests"
    )
    print(f"speed-up: {s_time / c_time:.1f}x   (target >= 5x)")


def collect(scenario, *, workers: int) -> tuple[float, int, int]:  # type: ignore[no-untyped-def]
    from hpkv.config import load_settings
    from hpkv.context import RunContext
    from hpkv.health.engine import Limits
    from hpkv.health.status import collect_status

    ctx = RunContext(load_settings(flags={"cluster": "demo"}))
    aws_mark, kube_mark = scenario.aws.mark(), scenario.kube.audit_mark()
    started = time.perf_counter()
    status = collect_status(ctx, limits=Limits(workers=workers))
    elapsed = time.perf_counter() - started
    if status.exit_code != 0:
        raise SystemExit(f"status is {status.state.value}: {status.to_dict()}")
    aws_calls = len(scenario.aws.calls_since(aws_mark))
    kube_calls = len(scenario.kube.audit_since(kube_mark))
    return elapsed, aws_calls, kube_calls


if __name__ == "__main__":
    main()
