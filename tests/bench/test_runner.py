"""The stdlib-only runner: standalone (system python, isolated) against the fake vLLM + LMCache
pods, and its parts (HTTP chunk decoding, Prometheus parsing, result blocks, vllm bench serve)."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpkv.bench import results, runner
from tests.harness.bench import MEASURED_COSTS, SYSTEM_PYTHON, assert_cross_pod_recovered
from tests.harness.fake_vllm import FakeCluster

RUNNER = Path(runner.__file__)


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    fake = FakeCluster(pods=2, costs=MEASURED_COSTS, process=True).start()
    yield fake
    fake.stop()


def spec_for(cluster: FakeCluster, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "runId": "test-" + os.urandom(3).hex(),
        "seed": 7,
        "pods": [{"name": p.name, "url": p.url} for p in cluster.members],
        "router": {"name": "router", "url": cluster.router_url},
    }
    spec.update(extra)
    return spec


def run_standalone(
    spec: dict[str, Any], scenario: str, tmp_path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The runner file alone, copied out of the package, under the system python with no site
    packages (-I -S): exactly what the Job does with the serving image's python3."""
    folder = tmp_path / "runner"
    folder.mkdir(exist_ok=True)
    shutil.copy(RUNNER, folder / "runner.py")
    (folder / "spec.json").write_text(json.dumps(spec))
    return subprocess.run(
        [SYSTEM_PYTHON, "-I", "-S", "runner.py", "--spec", "spec.json", "--scenario", scenario],
        cwd=folder,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_runner_imports_only_the_standard_library_and_parses_as_python_38() -> None:
    source = RUNNER.read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import in the runner"
            modules.add((node.module or "").split(".")[0])
    third_party = sorted(
        m for m in modules if m not in sys.stdlib_module_names and m != "__future__"
    )
    assert third_party == []
    assert "hpkv" not in modules


def test_standalone_cross_pod_recovers_the_injected_numbers(
    cluster: FakeCluster, tmp_path: Path
) -> None:
    spec = spec_for(cluster, crossPod={"lengths": [500, 1000, 2000], "repetitions": 3})
    proc = run_standalone(spec, "cross-pod", tmp_path)
    assert proc.returncode == 0, proc.stderr
    (result,) = runner.decode_results(proc.stdout)
    assert result["runner"] == runner.RUNNER_VERSION
    assert result["model"] == cluster.model
    assert result["parameters"]["tokenCounts"] == "tokenize"
    # prompts are exactly the asked-for length in the server's tokens
    assert {r["promptTokens"] for r in result["requests"] if r["length"] == 1000} == {1000}
    assert [r["role"] for r in result["requests"][:3]] == ["seed", "warm", "cold"]
    assert {r["target"] for r in result["requests"] if r["role"] == "seed"} == {"pod-0"}
    assert {r["target"] for r in result["requests"] if r["role"] != "seed"} == {"pod-1"}
    # pod A's L2 write landed before pod B was asked
    assert all(r["l2WriteBytes"] > 0 for r in result["requests"] if r["role"] == "seed")
    doc = results.merge_clients("cross-pod", [result])
    doc["summary"] = results.summarize(doc)
    assert_cross_pod_recovered(doc, cluster)
    assert "cross-pod 2000 tokens rep 3/3" in proc.stderr


def test_standalone_runner_reports_a_fatal_error_in_one_line(tmp_path: Path) -> None:
    spec = {
        "runId": "dead",
        "pods": [
            {"name": "a", "url": "http://127.0.0.1:9"},
            {"name": "b", "url": "http://127.0.0.1:9"},
        ],
    }
    proc = run_standalone(spec, "cross-pod", tmp_path)
    assert proc.returncode == 1
    error = runner.find_error(proc.stdout)
    assert error is not None and "http://127.0.0.1:9/v1/models" in error
    assert runner.decode_results(proc.stdout) == []


def test_shared_prefix_and_multi_turn_match_the_server_truth(cluster: FakeCluster) -> None:
    spec = spec_for(
        cluster,
        sharedPrefix={
            "prefixes": 2,
            "prefixTokens": 600,
            "users": 6,
            "suffixTokens": 60,
            "requests": 18,
            "concurrency": 2,
            "maxTokens": 8,
        },
        multiTurn={
            "sessions": 3,
            "turns": 3,
            "systemTokens": 200,
            "firstTurnTokens": 150,
            "turnTokens": 40,
            "maxTokens": 6,
        },
    )
    shared = asyncio.run(runner.run_scenario(spec, "shared-prefix"))
    truth = cluster.truth_by_id()
    assert len(shared["requests"]) == 18 and all(r["ok"] for r in shared["requests"])
    assert {r["prefix"] for r in shared["requests"]} == {0, 1}
    assert sorted(r["request"] for r in shared["requests"]) == list(range(18))
    assert {truth[r["id"]].via_router for r in shared["requests"]} == {True}
    _assert_matches_server(shared["requests"], truth)
    assert all(r["promptTokens"] == truth[r["id"]].prompt_tokens for r in shared["requests"])
    assert all(c == 600 for c in shared["parameters"]["prefixTokenCounts"])
    # the second request of a prefix on another pod reads it from the L2
    assert any(truth[r["id"]].l2_tokens > 0 for r in shared["requests"])

    turns = asyncio.run(runner.run_scenario(spec, "multi-turn"))
    by_session: dict[int, list[dict[str, Any]]] = {}
    for record in turns["requests"]:
        assert record["ok"], record
        by_session.setdefault(record["session"], []).append(record)
    assert sorted(by_session) == [0, 1, 2]
    for records in by_session.values():
        records.sort(key=lambda r: r["turn"])
        assert [r["turn"] for r in records] == [1, 2, 3]
        prompt = [r["promptTokens"] for r in records]
        # each turn carries the whole history: previous prompt + its answer + the new question
        assert prompt[1] > prompt[0] + records[0]["outputTokens"] and prompt[2] > prompt[1]
    _assert_matches_server(turns["requests"], cluster.truth_by_id())


def _assert_matches_server(records: list[dict[str, Any]], truth: dict[str, Any]) -> None:
    """Client TTFTs under concurrency agree with the server's own clock. The bound is loose: on
    this shared 2-core machine a waking process can wait a few ms for a CPU (the serial
    cross-pod tests hold the 2 ms bound; benchmarks/ measures the client's own overhead)."""
    errors = sorted(r["ttftMs"] - truth[r["id"]].ttft_true_ms for r in records)
    assert errors[0] > -0.5, errors  # never earlier than the server wrote the token
    assert errors[len(errors) // 2] <= 5.0, errors
    assert errors[-1] <= 50.0, errors


def test_chat_api_times_the_first_content_token_not_the_role_chunk(cluster: FakeCluster) -> None:
    spec = spec_for(cluster, api="chat", crossPod={"lengths": [400], "repetitions": 1})
    result = asyncio.run(runner.run_scenario(spec, "cross-pod"))
    truth = cluster.truth_by_id()
    for record in result["requests"]:
        assert record["ok"] and record["id"].startswith("chatcmpl-")
        assert record["promptTokens"] == 400  # the chat template's tokens included
    _assert_matches_server(result["requests"], truth)
    assert result["api"] == "chat"


def test_without_tokenize_prompt_lengths_come_from_usage(tmp_path: Path) -> None:
    with FakeCluster(pods=2, tokenize_endpoint=False) as fake:
        spec = spec_for(fake, crossPod={"lengths": [300], "repetitions": 1})
        result = asyncio.run(runner.run_scenario(spec, "cross-pod"))
        truth = fake.truth_by_id()
    assert result["parameters"]["tokenCounts"] == "usage"
    # calibration used a prompt of its own: nothing measured was cached beforehand
    for record in result["requests"]:
        served = truth[record["id"]]
        if record["role"] != "warm":
            assert (served.l0_hit, served.external_hit) == (0, 0), served
    prompt = [r["promptTokens"] for r in result["requests"]]
    assert all(abs(p - 300) <= 15 for p in prompt), prompt  # calibrated, then measured exactly
    warm = next(r for r in result["requests"] if r["role"] == "warm")
    assert warm["hitTokens"] == warm["promptTokens"] - 1


def test_load_scenarios_without_router_go_round_robin_to_pods(cluster: FakeCluster) -> None:
    spec = spec_for(
        cluster,
        sharedPrefix={
            "prefixes": 1,
            "prefixTokens": 100,
            "users": 2,
            "suffixTokens": 20,
            "requests": 4,
            "concurrency": 1,
        },
    )
    spec["router"] = None
    result = asyncio.run(runner.run_scenario(spec, "shared-prefix"))
    assert {r["target"] for r in result["requests"]} == {"pod-0", "pod-1"}
    assert any("round-robin" in n for n in result["notes"])


def test_two_clients_meet_at_the_barrier_and_split_the_work(
    cluster: FakeCluster, tmp_path: Path
) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    spec = spec_for(
        cluster,
        clients=2,
        sharedPrefix={
            "prefixes": 1,
            "prefixTokens": 100,
            "users": 4,
            "suffixTokens": 20,
            "requests": 10,
            "concurrency": 4,
        },
        barriers={
            "shared-prefix": {
                "host": "job-0.job.ns.svc.cluster.local",
                "port": port,
                "timeoutS": 60,
            }
        },
    )
    resolve = json.dumps({f"job-0.job.ns.svc.cluster.local:{port}": f"127.0.0.1:{port}"})
    folder = tmp_path / "runner"
    folder.mkdir()
    shutil.copy(RUNNER, folder / "runner.py")
    (folder / "spec.json").write_text(json.dumps(spec))
    procs = [
        subprocess.Popen(
            [
                SYSTEM_PYTHON,
                "-I",
                "-S",
                "runner.py",
                "--spec",
                "spec.json",
                "--scenario",
                "shared-prefix",
            ],
            cwd=folder,
            env={
                "PATH": "/usr/bin:/bin",
                "JOB_COMPLETION_INDEX": str(index),
                "HPKV_BENCH_RESOLVE": resolve,
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in (1, 0)  # the follower starts first and waits for the coordinator
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    client_results = sorted(
        (runner.decode_results(out)[0] for out, _err in outputs), key=lambda r: r["client"]
    )
    assert [r["client"] for r in client_results] == [0, 1]
    assert [len(r["requests"]) for r in client_results] == [5, 5]
    merged = results.merge_clients("shared-prefix", client_results)
    assert sorted(r["request"] for r in merged["requests"]) == list(range(10))
    assert merged["clients"] == 2


def test_vllm_bench_serve_drives_prefix_repetition_and_its_saved_json_is_read(
    cluster: FakeCluster, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_vllm = bin_dir / "vllm"
    # Stands in for the serving image's `vllm bench serve`: checks the flags hpkv passes and saves
    # a result in vLLM's documented format (per-request arrays kept by --save-detailed).
    fake_vllm.write_text(
        f"#!{SYSTEM_PYTHON}\n"
        + """import json, os, sys
args = sys.argv[1:]
assert args[:2] == ["bench", "serve"], args
opts = dict(zip(args[2::2], args[3::2]))
flags = [a for a in args if a in ("--save-result", "--save-detailed")]
assert flags == ["--save-result", "--save-detailed"], args
assert opts["--dataset-name"] == "prefix_repetition"
n = int(opts["--num-prompts"])
saved = {"date": "20261129-120000", "backend": opts["--backend"], "model_id": opts["--model"],
  "num_prompts": n, "duration": 2.0, "completed": n - 1, "failed": 1,
  "request_throughput": (n - 1) / 2.0, "output_throughput": 40.0, "mean_ttft_ms": 50.0,
  "median_ttft_ms": 50.0, "p99_ttft_ms": 90.0,
  "input_lens": [int(opts["--prefix-repetition-prefix-len"]) + int(opts["--prefix-repetition-suffix-len"])] * n,
  "output_lens": [int(opts["--prefix-repetition-output-len"])] * (n - 1) + [0],
  "ttfts": [0.01 * (i + 1) for i in range(n - 1)] + [0.0],
  "latencies": [0.1 * (i + 1) for i in range(n)],
  "start_times": [100.0 + 0.5 * i for i in range(n)],
  "errors": [""] * (n - 1) + ["Server disconnected"],
  "itls": [[] for _ in range(n)], "generated_texts": [""] * n}
path = os.path.join(opts["--result-dir"], opts["--result-filename"])
json.dump(saved, open(path, "w"))
print("============ Serving Benchmark Result ============")
"""
    )
    fake_vllm.chmod(0o755)
    spec = spec_for(
        cluster,
        sharedPrefix={
            "driver": "vllm",
            "prefixes": 2,
            "prefixTokens": 300,
            "suffixTokens": 50,
            "requests": 6,
            "concurrency": 3,
            "maxTokens": 16,
        },
    )
    proc = run_standalone(spec, "shared-prefix", tmp_path, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = runner.decode_results(proc.stdout)
    argv = result["parameters"]["argv"]
    assert argv[argv.index("--base-url") + 1] == cluster.router_url
    assert argv[argv.index("--max-concurrency") + 1] == "3"
    assert argv[argv.index("--model") + 1] == cluster.model
    records = result["requests"]
    assert [r["ttftMs"] for r in records] == pytest.approx([10.0, 20.0, 30.0, 40.0, 50.0, None])
    assert [r["ok"] for r in records] == [True] * 5 + [False]
    assert records[-1]["error"] == "Server disconnected"
    assert records[2]["startS"] == 1.0 and records[2]["e2eMs"] == pytest.approx(300.0)
    assert {r["promptTokens"] for r in records} == {350}
    assert result["vllmBench"]["p99_ttft_ms"] == 90.0
    assert result["parameters"]["driver"] == "vllm"


def test_vllm_bench_serve_failure_is_a_runner_error(cluster: FakeCluster, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(
        "#!/bin/sh\necho 'OSError: Can not load tokenizer for Qwen/Qwen2-7B'\nexit 1\n"
    )
    (bin_dir / "vllm").chmod(0o755)
    spec = spec_for(cluster, sharedPrefix={"driver": "vllm", "requests": 4, "prefixes": 2})
    proc = run_standalone(spec, "shared-prefix", tmp_path, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert proc.returncode == 1
    assert runner.find_error(proc.stdout) == (
        "vllm bench serve exited with 1: OSError: Can not load tokenizer for Qwen/Qwen2-7B"
    )


@pytest.mark.parametrize("seed", range(5))
def test_chunked_decoder_handles_any_split(seed: int) -> None:
    payloads = [b'data: {"x": %d}\n\n' % i for i in range(20)] + [b"data: [DONE]\n\n"]
    wire = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads) + b"0\r\n\r\n"
    rng = random.Random(seed)
    decoder = runner.ChunkedDecoder()
    out = b""
    position = 0
    while position < len(wire):
        step = rng.randint(1, 7)
        out += decoder.feed(wire[position : position + step])
        position += step
    assert decoder.done
    assert out == b"".join(payloads)


def test_prometheus_parsing_and_tier_arithmetic() -> None:
    text = """# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen2-7B"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="Qwen/Qwen2-7B"} 500.0
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen2-7B"} 300.0
vllm:prefix_cache_hits_total{engine="1",model_name="Qwen/Qwen2-7B"} 0.0
vllm:external_prefix_cache_queries_total{engine="0",model_name="a \\"quoted\\" name"} 1500.0
vllm:external_prefix_cache_hits_total{engine="0",model_name="a \\"quoted\\" name"} 750.0
lmcache:num_remote_read_bytes_total{model_name="m",worker_id="0"} 1.5e+07
lmcache:num_remote_read_bytes_total{model_name="m",worker_id="1"} 1.5e+07
lmcache:time_to_retrieve_bucket{le="0.1",model_name="m"} 2.0
lmcache:time_to_retrieve_sum{model_name="m"} 0.11
lmcache:time_to_retrieve_count{model_name="m"} 2.0
vllm:num_requests_running{engine="0"} 3 1700000000000
"""
    samples = runner.parse_prometheus(text)
    assert samples["vllm:external_prefix_cache_hits_total"][0][0]["model_name"] == 'a "quoted" name'
    snap = runner.snapshot(samples)
    assert snap["l0Queries"] == 1500.0 and snap["l0Hits"] == 300.0
    assert snap["l2ReadBytes"] == 3e7
    assert "l2WriteBytes" not in snap  # not exported: absent, not zero
    zero = {k: 0.0 for k in snap}
    stats = runner.tier_stats(runner.delta(zero, snap))
    assert stats["l0"]["hitRate"] == 0.2
    assert stats["external"]["hitRate"] == 0.5
    assert stats["retrieve"]["meanMs"] == pytest.approx(55.0)
    assert stats["l2"]["writeBytes"] is None
    # a counter reset (pod restart) counts from zero instead of going negative
    assert runner.delta({"l0Hits": 500.0}, {"l0Hits": 20.0}) == {"l0Hits": 20.0}


def test_result_blocks_survive_log_prefixes_and_noise() -> None:
    payload = {"requests": [{"ttftMs": 1.5}] * 500, "client": 3}
    block = runner.encode_result(payload)
    log = "starting\n" + "".join(
        f"2026-11-29T10:00:00Z stdout F {line}\n" for line in block.splitlines()
    )
    assert runner.decode_results(log) == [payload]
    assert runner.find_error("x\nhpkv-bench-error: pod B unreachable\n") == "pod B unreachable"
