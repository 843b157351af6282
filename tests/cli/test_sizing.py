"""`hpkv plan` and `hpkv simulate`: local only (no AWS, no cluster), table and JSON output,
hpkv.yaml overrides, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.cli import run_hpkv
from tests.sizing.hf_configs import HF_CONFIGS
from tests.sizing.test_replay import bench_document, measured_cost

pytestmark = pytest.mark.usefixtures("isolated_env")

SMALL = ["--requests", "1500"]


def ok(*args: str) -> str:
    result = run_hpkv(list(args))
    assert result.exit_code == 0, result
    assert result.exception is None, result
    return result.stdout


def fails(code: int, *args: str) -> str:
    result = run_hpkv(list(args))
    assert result.exit_code == code, result
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    # progress lines ("… simulating ...") may come first; the error is one line, the last
    assert lines[-1].startswith("hpkv: error: "), result.stderr
    assert all(line.startswith("… ") for line in lines[:-1]), result.stderr
    assert "Traceback" not in result.stderr
    return lines[-1]


# --- plan ---------------------------------------------------------------------------------------
def test_plan_with_no_arguments() -> None:
    result = run_hpkv(["plan"])
    assert result.exit_code == 0, result
    out = result.stdout
    assert "qwen2-7b" in out and "2 x ml.g6e.4xlarge" in out
    assert "57,344 bytes per token" in out
    for text in (
        "cache tiers",
        "load from L2",
        "break-even:",
        "cost for 10 req/s",
        "ml.p5.48xlarge",
    ):
        assert text in out
    assert "ml.g6e.4xlarge *" in out  # the chosen type, marked in the cost table
    assert result.stderr == ""


def test_plan_json_has_every_figure_as_a_number() -> None:
    report = json.loads(ok("plan", "-o", "json", "--tokens", "1925", "--tokens", "4000"))
    assert report["kvBytesPerToken"] == 57_344
    assert [r["tokens"] for r in report["load"]] == [1925, 4000]
    read = report["load"][0]
    assert read["bytes"] == 110_387_200
    assert read["l2TransferMs"] == pytest.approx(55.75, rel=0.01)
    for row in report["load"]:
        assert all(isinstance(v, (int, float)) for v in row.values())
    for tier in report["tiers"].values():
        assert all(isinstance(v, int) for v in tier.values())
    assert all(isinstance(v, (int, float)) for v in report["rates"].values())


def test_plan_options_after_the_command_and_global_options_anywhere() -> None:
    report = json.loads(
        ok("plan", "--model", "llama-3.1-70b", "--instance-type", "ml.p5.48xlarge", "--tp", "4",
           "--replicas", "4", "--memory-percent", "40", "-o", "json", "--rps", "3",
           "--prompt-tokens", "12000", "--output-tokens", "100", "--cached-fraction", "0.9")
    )  # fmt: skip
    assert report["kvBytesPerToken"] == 327_680
    assert (report["tp"], report["replicas"], report["nodes"], report["memoryPercent"]) == (
        4,
        4,
        2,
        40,
    )
    assert report["traffic"] == {
        "requestsPerSecond": 3.0, "promptTokens": 12000, "outputTokens": 100, "cachedFraction": 0.9,
    }  # fmt: skip
    assert report["tiers"]["l1"]["bytesPerNode"] == 2048 * 2**30 * 40 // 100


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "llama-3.1-7b"], "unknown model 'llama-3.1-7b'. Fix: did you mean"),
        (["--instance-type", "ml.g9.xlarge"], "unknown instance type 'ml.g9.xlarge'"),
        (["--model", "llama-3.1-70b"], "leaves no room for KV cache"),
        (["--tp", "2"], "--tp 2 is not possible"),
        (["--memory-percent", "5"], "--memory-percent 5 is outside the valid range 20..100"),
        (["--cached-fraction", "2"], "--cached-fraction must be between 0 and 1"),
        (["--replicas", "0"], "Invalid value for '--replicas'"),
    ],
)
def test_plan_errors_are_one_line_usage_errors(args: list[str], message: str) -> None:
    assert message in fails(2, "plan", *args)


def test_plan_reads_the_sizing_section_and_hf_configs(isolated_env: Path) -> None:
    (isolated_env / "models").mkdir()
    (isolated_env / "models" / "config.json").write_text(json.dumps(HF_CONFIGS["qwen2.5-32b"]))
    (isolated_env / "hpkv.yaml").write_text(
        "tieredStorage:\n  memoryPercent: 50\n"
        "sizing:\n"
        "  model: my-32b\n"
        "  instanceType: ml.g6e.12xlarge\n"
        "  replicas: 1\n"
        "  tp: 4\n"
        "  models:\n    my-32b:\n      hfConfig: models\n"
        "  instanceTypes:\n    ml.g6e.12xlarge:\n      pricePerHour: 1.0\n"
        "  costModel:\n    l2ReadEfficiency: 0.5\n"
        "  traffic:\n    promptTokens: 6000\n"
    )
    report = json.loads(ok("plan", "-o", "json"))
    assert report["model"]["key"] == "my-32b"
    assert report["kvBytesPerToken"] == 262_144
    assert report["memoryPercent"] == 50
    assert report["instanceType"]["pricePerHour"] == 1.0
    assert report["rates"]["l2ReadGBps"] == pytest.approx(min(6.0, 100 / 8) * 0.5)
    assert report["traffic"]["promptTokens"] == 6000
    # a config.json given directly, and an environment variable over the file
    direct = json.loads(
        ok("plan", "-o", "json", "--model", str(isolated_env / "models" / "config.json"))
    )
    assert direct["kvBytesPerToken"] == 262_144
    result = run_hpkv(["plan", "-o", "json"], env={"HPKV_SIZING__REPLICAS": "3"})
    assert result.exit_code == 0, result
    assert json.loads(result.stdout)["replicas"] == 3


def test_plan_rejects_bad_sizing_config(isolated_env: Path) -> None:
    (isolated_env / "hpkv.yaml").write_text("sizing:\n  costModel:\n    prefilEfficiency: 0.5\n")
    message = fails(2, "plan")
    assert "unknown key 'sizing.costModel.prefilEfficiency'" in message
    assert "did you mean 'sizing.costModel.prefillEfficiency'" in message


# --- simulate -----------------------------------------------------------------------------------
def test_simulate_with_no_arguments_writes_the_table_and_chart(isolated_env: Path) -> None:
    result = run_hpkv(["simulate"])
    assert result.exit_code == 0, result
    out = result.stdout
    assert "qwen2-7b on 2 x ml.g6e.4xlarge" in out and "20,000 requests of a chat workload" in out
    for strategy in ("roundrobin", "session", "prefixaware", "kvaware"):
        assert strategy in out
    assert "chart: hpkv-simulate.png" in out
    chart = isolated_env / "hpkv-simulate.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert chart.stat().st_size > 10_000
    assert "simulating 20,000 requests x 4 strategies" in result.stderr


def test_simulate_json_is_deterministic_for_a_seed(isolated_env: Path) -> None:
    args = ["simulate", "-o", "json", "--no-chart", "--seed", "4", *SMALL]
    first = json.loads(ok(*args))
    assert first == json.loads(ok(*args))
    assert first["chart"] is None
    assert not (isolated_env / "hpkv-simulate.png").exists()
    other = json.loads(ok("simulate", "-o", "json", "--no-chart", "--seed", "5", *SMALL))
    assert other["strategies"] != first["strategies"]
    row = first["strategies"][0]
    assert set(row["hitRate"]) == {"l0", "l1", "l2", "total"}
    assert set(row["ttftMs"]) == {"mean", "p50", "p90", "p99", "max"}
    assert first["requests"] == 1500
    assert set(first["best"]) == {"hitRate", "ttftP50", "ttftP99"}


def test_simulate_workload_options(isolated_env: Path) -> None:
    payload = json.loads(
        ok("simulate", "-o", "json", "--workload", "document-qa", "--requests", "800",
           "--prefixes", "20", "--prefix-tokens", "6000", "--users", "8", "--turns", "3",
           "--strategy", "session", "--strategy", "kvaware", "--replicas", "3",
           "--l2-ttl", "10m", "--chart", "charts/out.png", "--instance-type", "g5.12xlarge")
    )  # fmt: skip
    assert [s["strategy"] for s in payload["strategies"]] == ["session", "kvaware"]
    assert payload["workload"]["kind"] == "document-qa"
    assert payload["workload"]["prefixTokens"] == 6000
    assert payload["cluster"]["l2TtlSeconds"] == 600
    assert payload["instanceType"] == "ml.g5.12xlarge"
    assert (isolated_env / "charts" / "out.png").is_file()
    assert payload["chart"] == "charts/out.png"


def test_simulate_a_trace(isolated_env: Path) -> None:
    trace = isolated_env / "trace.jsonl"
    rows = [{"time": i * 0.5, "session": f"u{i % 3}", "segments": [["sys", 2048], [f"q{i}", 64]]}
            for i in range(30)]  # fmt: skip
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    payload = json.loads(ok("simulate", "-o", "json", "--no-chart", "--trace", str(trace)))
    assert payload["workload"] == {"kind": "trace", "file": str(trace)}
    assert payload["requests"] == 30
    for row in payload["strategies"]:
        # the 2,048-token prefix is computed once per replica at most, then hit
        assert row["tokens"]["recomputed"] <= 2 * 2048 + 30 * 64
    trace.write_text(trace.read_text() + "not json\n")
    assert f"{trace}:31: not valid JSON" in fails(2, "simulate", "--trace", str(trace))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "batch"], "unknown workload 'batch'"),
        (["--strategy", "random"], "unknown routing strategy 'random'"),
        (["--overlap", "2"], "--overlap must be between 0 and 1"),
        (["--l2-ttl", "soon"], "invalid duration 'soon'"),
        (["--workload", "chat", "--trace", "t.jsonl"], "--workload and --trace exclude each other"),
        (["--trace", "missing.jsonl"], "trace file missing.jsonl does not exist"),
        (["--prefix-tokens", "40000"], "exceeds qwen2-7b's context"),
    ],
)
def test_simulate_errors_are_one_line_usage_errors(args: list[str], message: str) -> None:
    assert message in fails(2, "simulate", "--no-chart", *args)


def test_simulate_replays_a_bench_result(isolated_env: Path) -> None:
    result_file = isolated_env / "bench.json"
    result_file.write_text(json.dumps(bench_document(measured_cost())))
    out = ok("simulate", "--replay", str(result_file))
    assert "measured vs predicted" in out
    assert "cold (recomputed) vs warm (read from L2)" in out
    assert "values that fit these measurements" in out
    payload = json.loads(ok("simulate", "--replay", str(result_file), "-o", "json"))
    assert payload["model"] == "qwen2-7b" and payload["instanceType"] == "ml.g5.4xlarge"
    assert len(payload["sweep"]) == 5
    assert payload["fitted"]["prefillEfficiency"] == pytest.approx(0.6, rel=0.02)
    assert "lacks model" in fails(2, "simulate", "--replay", _write(isolated_env, {"sweep": []}))


def _write(folder: Path, document: dict) -> str:
    path = folder / "other.json"
    path.write_text(json.dumps(document))
    return str(path)


def test_help_imports_no_heavy_modules() -> None:
    code = (
        "import sys\n"
        "from hpkv.cli.main import main\n"
        "sys.argv = ['hpkv', 'simulate', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('matplotlib', 'numpy', 'boto3', 'botocore', 'kubernetes', 'pyhelm3')"
        " if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr
    assert "--replay" in out.stdout and "--strategy" in out.stdout
