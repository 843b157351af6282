#!/usr/bin/env python3
"""Wall time of ``hpkv status`` with 50 ms added to every AWS and Kubernetes call (figures, not a
pass/fail test).

Targets (issue 7): a full ``hpkv status`` within 1 s, and at least 5 times faster than the same
reads made one after another. Starts the test harness (the AWS emulator and a real
kube-apiserver behind the latency proxy; see tests/harness), installs every stage with hpkv itself
(tests/harness/stack.py: Tiered Storage on two GPU nodes, ``hpkv operator apply``, ``hpkv curvine
apply``, ``hpkv l2 apply`` and a wired two-replica endpoint; latency off while installing), then
adds the latency to every AWS call, every Kubernetes request and every in-cluster answer (the
Curvine master, pod exec probes) and measures, in a child process (the harness's servers, which
the AWS emulator's request handling makes busy, keep their own interpreter lock, as AWS and the API
server would):

* ``hpkv status --cluster demo -o json`` through the CLI, each run with fresh clients (as a new
  invocation would have; imports are warm after the first run), and as a new process each time
  (imports included), beside what a new process spends before its first request (importing the
  libraries and building the boto3 clients: CPU, the same at any latency);
* the same collection with 16 workers and with 1 worker (every check, and every read inside a
  check, one after another), with the number of AWS and Kubernetes requests each made.

Run from the repository root:

    HPKV_SHARED_DIR=/path/to/shared .venv/bin/python benchmarks/status_latency.py \
        [--runs 5] [--latency 0.05]

It also prints the requests of one run and the slowest checks of a concurrent run: the longest
chains of calls that depend on each other (each a latency), which bound its wall time from below.
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
    parser.add_argument(
        "--profile", action="store_true", help="print where one sequential run spends CPU time"
    )
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # the child process's part
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="print when each check and each shared read of one concurrent run started and ended",
    )
    options = parser.parse_args()
    if options.measure:
        measure(options.measure, options.runs)
        return

    import pytest

    from tests.harness.aws import AwsEmulator
    from tests.harness.curvine import ChartRepo
    from tests.harness.kube import KubeHarness
    from tests.harness.kube_proxy import KubeProxy
    from tests.harness.scenario import Scenario
    from tests.harness.stack import Stack

    shared = Path(
        os.environ.get("HPKV_SHARED_DIR") or Path(__file__).resolve().parents[2] / "shared"
    )
    if not (shared / "upstream").is_dir():
        raise SystemExit(f"{shared}/upstream not found: set HPKV_SHARED_DIR to the shared/ folder")
    workdir = Path(tempfile.mkdtemp(prefix="hpkv-bench-"))
    aws = AwsEmulator().start()
    aws.reset()  # seeds what every account has (AWS managed policies)
    kube = KubeHarness.start()
    proxy = KubeProxy(kube).start()
    repo = ChartRepo.build(workdir / "charts").start()
    env = pytest.MonkeyPatch()
    stack = None
    try:
        for key, value in aws.env().items():
            env.setenv(key, value)
        kubeconfig = workdir / "kubeconfig"
        env.setenv("KUBECONFIG", str(kubeconfig))
        env.setenv("HOME", str(workdir))
        env.setenv("HPKV_POLL_INTERVAL", "0.05")
        env.chdir(workdir)
        kube.write_kubeconfig(kubeconfig)
        scenario = Scenario(aws=aws, kube=kube, workdir=workdir, kubeconfig=kubeconfig)
        stack = Stack(scenario, shared, repo, workdir, env).install()
        stack.stop_controllers()  # the cluster is settled; their polling would skew the timings
        # From here on hpkv reaches Kubernetes through the latency proxy (its kubeconfig and the
        # EKS endpoint both point there).
        scenario.proxy = proxy
        proxy.write_kubeconfig(kubeconfig)
        aws.extensions["eks"].seed_cluster(scenario.eks_name, endpoint=proxy.url)
        stack.set_latency(options.latency)
        if options.profile:
            profile(scenario)
        elif options.timeline:
            import subprocess

            subprocess.run([sys.executable, __file__, "--measure", "timeline"], check=True)
        else:
            report(scenario, options.runs, options.latency)
    finally:
        if stack is not None:
            stack.stop()
        env.undo()
        repo.stop()
        proxy.stop()
        kube.stop()
        aws.stop()


def report(scenario, runs: int, latency: float) -> None:  # type: ignore[no-untyped-def]
    import json
    import subprocess

    def child(*args: str) -> dict:  # type: ignore[type-arg]
        done = subprocess.run(
            [sys.executable, __file__, *args], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise SystemExit(f"measuring failed:\n{done.stdout}\n{done.stderr}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    aws_mark, kube_mark = scenario.aws.mark(), scenario.kube.audit_mark()
    child("--measure", "16", "--runs", "1")
    aws_calls = len(scenario.aws.calls_since(aws_mark))
    kube_calls = len(scenario.kube.audit_since(kube_mark))
    measured = child("--measure", "all", "--runs", str(runs))
    cold = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "hpkv", "status", "--cluster", "demo", "-o", "json"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        cold.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"hpkv status failed:\n{done.stdout}\n{done.stderr}")
    floor, services = [], status_services()
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", startup_floor(services)], check=True)
        floor.append(time.perf_counter() - started)
    median = statistics.median
    cli, c_times, s_times = measured["cli"], measured["concurrent"], measured["sequential"]
    print(f"latency injected per AWS and Kubernetes call: {latency * 1000:.0f} ms")
    print(f"requests per run: {aws_calls} AWS + {kube_calls} Kubernetes")
    print(
        f"hpkv status (CLI, fresh clients, warm imports): median {median(cli):.3f} s, "
        f"min {min(cli):.3f} s, max {max(cli):.3f} s   (target <= 1 s)"
    )
    print(
        f"hpkv status (a new process each time, imports included): median {median(cold):.3f} s, "
        f"min {min(cold):.3f} s, max {max(cold):.3f} s"
    )
    print(
        f"  of which a new process's start-up before any request (imports, {len(services)} boto3 "
        f"clients): median {median(floor):.3f} s"
    )
    c_time, s_time = median(c_times), median(s_times)
    print(f"checks concurrently (16 workers): median {c_time:.3f} s, min {min(c_times):.3f} s")
    print(f"same reads one after another (1 worker): median {s_time:.3f} s")
    print(f"speed-up: {s_time / c_time:.1f}x   (target >= 5x)")
    print(
        f"sequential lower bound: {aws_calls + kube_calls} requests x {latency * 1000:.0f} ms = "
        f"{(aws_calls + kube_calls) * latency:.2f} s, plus the in-cluster answers"
    )
    print("slowest checks of a concurrent run (each includes the shared reads it waited for):")
    for stage, name, seconds in measured["slowest"]:
        print(f"  {seconds:.3f} s  {stage} / {name}")


def status_services() -> list[str]:
    """The boto3 clients a full ``hpkv status`` builds (hpkv.health.engine.aws_services)."""
    from hpkv.config import load_settings
    from hpkv.context import RunContext
    from hpkv.health.engine import aws_services
    from hpkv.health.sections import sections

    ctx = RunContext(load_settings(flags={"cluster": "demo"}))
    return aws_services(ctx, sections(ctx))


def startup_floor(services: list[str]) -> str:
    """What any new hpkv status process does before its first request, whatever the latency."""
    return f"""
import boto3, jsonschema, kubernetes.client, kubernetes.config, rich.console, typer
session = boto3.Session(region_name="us-west-2")
for service in {services!r}:
    session.client(service)
"""


def measure(which: str, runs: int) -> None:
    """In the child process: time the collection (and the CLI) and print one JSON line."""
    import json

    from tests.harness.cli import run_hpkv

    def cli_once() -> float:
        started = time.perf_counter()
        result = run_hpkv(["status", "--cluster", "demo", "-o", "json"])
        elapsed = time.perf_counter() - started
        if result.exit_code != 0:
            raise SystemExit(f"hpkv status failed:\n{result}")
        return elapsed

    if which == "timeline":
        timeline()
        return
    if which != "all":
        print(json.dumps({"seconds": collect(int(which))}))
        return
    cli_once()  # warm imports
    cli = [cli_once() for _ in range(runs)]
    concurrent = [collect(16) for _ in range(runs)]
    sequential = [collect(1) for _ in range(runs)]
    result = {"cli": cli, "concurrent": concurrent, "sequential": sequential}
    result["slowest"] = [[stage, name, seconds] for (stage, name), seconds in slowest]
    print(json.dumps(result))


def collect(workers: int) -> float:
    from hpkv.config import load_settings
    from hpkv.context import RunContext
    from hpkv.health.engine import Limits
    from hpkv.health.status import collect_status

    ctx = RunContext(load_settings(flags={"cluster": "demo"}))
    started = time.perf_counter()
    status = collect_status(ctx, limits=Limits(workers=workers))
    elapsed = time.perf_counter() - started
    if status.exit_code != 0:
        raise SystemExit(f"status is {status.state.value}: {status.to_dict()}")
    if workers > 1:
        slowest.clear()
        timed = {
            (c.check.stage, c.check.name): c.seconds or 0.0
            for s in status.sections
            for c in s.checks
        }
        slowest.extend(sorted(timed.items(), key=lambda item: -item[1])[:6])
    return elapsed


slowest: list[tuple[tuple[str, str], float]] = []


def timeline() -> None:
    """Start and end (ms from the start) of every check and every shared read of one concurrent
    run: the chains of reads that wait for each other show the critical path."""
    from hpkv import concurrency, context
    from hpkv.aws import AwsClients
    from hpkv.kube import KubeClients

    collect(16)  # warm imports
    events: list[tuple[float, float, str]] = []
    origin = [0.0]
    get = context.ReadCache.get

    def timed_get(cache, key, load):  # type: ignore[no-untyped-def]
        def timed_load():  # type: ignore[no-untyped-def]
            started = time.perf_counter()
            try:
                return load()
            finally:
                events.append((started - origin[0], time.perf_counter() - origin[0], f"read {key}"))

        return get(cache, key, timed_load)

    def timed_submit(runner, key, fn, *, timeout=None):  # type: ignore[no-untyped-def]
        def timed():  # type: ignore[no-untyped-def]
            started = time.perf_counter()
            try:
                return fn()
            finally:
                events.append(
                    (started - origin[0], time.perf_counter() - origin[0], f"check {key}")
                )

        return submit(runner, key, timed, timeout=timeout)

    def timed(what: str, fn):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            return fn()
        finally:
            events.append((started - origin[0], time.perf_counter() - origin[0], what))

    def timed_client(clients, service):  # type: ignore[no-untyped-def]
        if service in clients.built:
            return aws_client(clients, service)
        return timed(
            f"boto3 client {service} (lock wait included)", lambda: aws_client(clients, service)
        )

    def timed_connect(clients):  # type: ignore[no-untyped-def]
        return timed("kubernetes client (waits for the EKS endpoint)", lambda: connect(clients))

    submit = concurrency.TaskRunner.submit
    aws_client, connect = AwsClients.client, KubeClients._connect
    context.ReadCache.get = timed_get  # type: ignore[method-assign]
    concurrency.TaskRunner.submit = timed_submit  # type: ignore[method-assign]
    AwsClients.client = timed_client  # type: ignore[method-assign]
    KubeClients._connect = timed_connect  # type: ignore[method-assign]
    try:
        origin[0] = time.perf_counter()
        elapsed = collect(16)
    finally:
        context.ReadCache.get = get  # type: ignore[method-assign]
        concurrency.TaskRunner.submit = submit  # type: ignore[method-assign]
        AwsClients.client = aws_client  # type: ignore[method-assign]
        KubeClients._connect = connect  # type: ignore[method-assign]
    print(f"one concurrent run: {elapsed:.3f} s", file=sys.__stdout__)
    for start, end, what in sorted(events):
        print(f"{start * 1000:7.0f} {end * 1000:7.0f} ms  {what}", file=sys.__stdout__)


def profile(scenario) -> None:  # type: ignore[no-untyped-def]
    """cProfile of one sequential run, inside the worker thread that runs every check."""
    import cProfile
    import pstats

    from hpkv import concurrency

    collect(1)  # warm imports and caches
    profilers: list[cProfile.Profile] = []
    work = concurrency.TaskRunner._work

    def profiled(runner):  # type: ignore[no-untyped-def]
        profiler = cProfile.Profile()
        profilers.append(profiler)
        profiler.enable()
        try:
            work(runner)
        finally:
            profiler.disable()

    concurrency.TaskRunner._work = profiled  # type: ignore[method-assign]
    try:
        collect(1)
    finally:
        concurrency.TaskRunner._work = work  # type: ignore[method-assign]
    stats = pstats.Stats(profilers[0], stream=sys.__stdout__)
    for more in profilers[1:]:
        stats.add(more)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(60)


if __name__ == "__main__":
    main()
