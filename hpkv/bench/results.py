"""The bench result document: assembly, summaries, schema validation, save and load.

The document is versioned (``schemaVersion``, see ``schema/bench-result-v1.schema.json``) and keeps
every raw per-request timing, so percentiles are exact over all client pods, summaries can be
recomputed, and other tools (``hpkv simulate``) can replay a run. Readers accept any ``1.x``
document: minor versions only add optional fields.
"""

from __future__ import annotations

import datetime
import json
from functools import cache
from pathlib import Path
from typing import Any

from hpkv import __version__
from hpkv.bench import RESULT_KIND, SCHEMA_VERSION
from hpkv.bench.stats import distribution
from hpkv.errors import UsageError

SCHEMA_FILE = Path(__file__).with_name("schema") / "bench-result-v1.schema.json"

# [B2] sweep on 2x ml.g5.4xlarge (A10G), Qwen2-7B, Curvine L2: TTFT speedup of pod B over a cold
# prompt, by prompt length (hyperpod-inference-operator reference, section 6).
PUBLISHED_CROSS_POD = {
    500: 0.99,
    1000: 1.7,
    2500: 2.7,
    3000: 2.2,
}
PUBLISHED_SOURCE = "AWS blog 'Tiered KV cache ... with Curvine' (2x ml.g5.4xlarge, Qwen2-7B)"


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_result(run_id: str, inputs: dict[str, Any], environment: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": RESULT_KIND,
        "schemaVersion": SCHEMA_VERSION,
        "runId": run_id,
        "createdAt": utc_now(),
        "hpkvVersion": __version__,
        "inputs": inputs,
        "environment": environment,
        "scenarios": [],
        "notes": [],
    }


def merge_clients(name: str, client_results: list[dict[str, Any]]) -> dict[str, Any]:
    """One scenario document from the results of its client pods (raw requests concatenated)."""
    first = client_results[0]
    requests: list[dict[str, Any]] = []
    notes: list[str] = []
    for result in client_results:
        requests += result.get("requests", [])
        notes += [n for n in result.get("notes", []) if n not in notes]
    started = min(r.get("startedAt") or 0.0 for r in client_results)
    finished = max(r.get("finishedAt") or 0.0 for r in client_results)
    doc: dict[str, Any] = {
        "name": name,
        "driver": (first.get("parameters") or {}).get("driver", "hpkv"),
        "clients": len(client_results),
        "startedAt": iso(started),
        "finishedAt": iso(finished),
        "durationS": max(0.0, finished - started),
        "parameters": first.get("parameters", {}),
        "requests": requests,
        "metrics": None,
        "summary": {},
        "notes": notes,
    }
    if any("vllmBench" in r for r in client_results):
        doc["vllmBench"] = [r.get("vllmBench") for r in client_results]
    return doc


# --- summaries ------------------------------------------------------------------------------------


def _values(records: list[dict[str, Any]], key: str) -> list[float]:
    return [
        float(r[key])
        for r in records
        if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)
    ]


def _median(values: list[float]) -> float | None:
    dist = distribution(values)
    return dist["p50"] if dist else None


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


def _load_summary(requests: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in requests if r.get("ok")]
    ends = [
        (r.get("startS") or 0.0) + (r.get("e2eMs") or 0.0) / 1000.0
        for r in requests
        if r.get("e2eMs") is not None
    ]
    starts = _values(requests, "startS")
    span = (max(ends) - min(starts)) if ends and starts else 0.0
    tpot = [
        (r["e2eMs"] - r["ttftMs"]) / (r["outputTokens"] - 1)
        for r in ok
        if r.get("ttftMs") is not None and (r.get("outputTokens") or 0) > 1
    ]
    return {
        "requests": len(requests),
        "ok": len(ok),
        "errors": len(requests) - len(ok),
        "durationS": span,
        "requestThroughput": len(ok) / span if span > 0 else None,
        "inputTokensPerS": sum(_values(ok, "promptTokens")) / span if span > 0 else None,
        "outputTokensPerS": sum(_values(ok, "outputTokens")) / span if span > 0 else None,
        "ttftMs": distribution(_values(ok, "ttftMs")),
        "tpotMs": distribution(tpot),
        "e2eMs": distribution(_values(ok, "e2eMs")),
        "firstErrors": sorted({str(r.get("error")) for r in requests if not r.get("ok")})[:3],
    }


def summarize_cross_pod(doc: dict[str, Any]) -> dict[str, Any]:
    requests = doc["requests"]
    lengths = doc["parameters"].get("lengths") or sorted({r.get("length") for r in requests})
    rows = []
    for length in lengths:
        group = [r for r in requests if r.get("length") == length]
        warm = [r for r in group if r.get("role") == "warm" and r.get("ok")]
        cold = [r for r in group if r.get("role") == "cold" and r.get("ok")]
        seed = [r for r in group if r.get("role") == "seed" and r.get("ok")]
        cold_d = distribution(_values(cold, "ttftMs"))
        warm_d = distribution(_values(warm, "ttftMs"))
        with_hits = [r for r in warm if r.get("hitTokens") is not None and r.get("promptTokens")]
        hit_sum = sum(r["hitTokens"] for r in with_hits)
        prompt_sum = sum(r["promptTokens"] for r in with_hits)
        read_bytes = [r for r in with_hits if r.get("l2ReadBytes") is not None]
        bytes_sum = sum(r["l2ReadBytes"] for r in read_bytes)
        hits_for_bytes = sum(r["hitTokens"] for r in read_bytes)
        rows.append(
            {
                "length": length,
                "promptTokens": _median(_values(warm + cold, "promptTokens")),
                "repetitions": len(warm),
                "coldTtftMs": cold_d,
                "warmTtftMs": warm_d,
                "seedTtftMs": distribution(_values(seed, "ttftMs")),
                "speedup": _ratio(
                    cold_d["p50"] if cold_d else None, warm_d["p50"] if warm_d else None
                ),
                "ttftSavedMs": (cold_d["p50"] - warm_d["p50"]) if cold_d and warm_d else None,
                "hitTokens": _median(_values(warm, "hitTokens")),
                "hitRate": hit_sum / prompt_sum if prompt_sum else None,
                "l0HitTokens": _median(_values(warm, "l0HitTokens")),
                "coldHitTokens": _median(_values(cold, "hitTokens")),
                "l2ReadMs": distribution(_values(warm, "l2ReadMs")),
                "l2ReadBytes": _median(_values(warm, "l2ReadBytes")),
                "l2WriteBytes": _median(_values(seed, "l2WriteBytes")),
                "kvBytesPerToken": bytes_sum / hits_for_bytes if hits_for_bytes else None,
                "interference": any(r.get("interference") for r in warm + cold),
                "published": (
                    {"speedup": PUBLISHED_CROSS_POD[length], "source": PUBLISHED_SOURCE}
                    if length in PUBLISHED_CROSS_POD
                    else None
                ),
            }
        )
    warm_all = [r for r in requests if r.get("role") == "warm" and r.get("ok")]
    return {
        "requests": len(requests),
        "errors": sum(1 for r in requests if not r.get("ok")),
        "byLength": rows,
        "l2ReadMs": distribution(_values(warm_all, "l2ReadMs")),
        "firstErrors": sorted({str(r.get("error")) for r in requests if not r.get("ok")})[:3],
    }


def summarize_multi_turn(doc: dict[str, Any]) -> dict[str, Any]:
    requests = doc["requests"]
    summary = _load_summary(requests)
    turns = sorted({r.get("turn") for r in requests if r.get("turn") is not None})
    summary["byTurn"] = [
        {
            "turn": turn,
            "requests": len([r for r in requests if r.get("turn") == turn]),
            "promptTokens": _median(
                _values([r for r in requests if r.get("turn") == turn], "promptTokens")
            ),
            "ttftMs": distribution(
                _values([r for r in requests if r.get("turn") == turn and r.get("ok")], "ttftMs")
            ),
        }
        for turn in turns
    ]
    return summary


def summarize(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["name"] == "cross-pod":
        summary = summarize_cross_pod(doc)
    elif doc["name"] == "multi-turn":
        summary = summarize_multi_turn(doc)
    else:
        summary = _load_summary(doc["requests"])
    metrics = doc.get("metrics") or {}
    summary["tiers"] = metrics.get("tiers")
    return summary


def scenario(result: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((s for s in result.get("scenarios", []) if s.get("name") == name), None)


# --- schema, files ----------------------------------------------------------------------------------


@cache
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


def validation_errors(doc: Any) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors]


def save(result: dict[str, Any], path: Path) -> Path:
    errors = validation_errors(result)
    if errors:  # a bug in hpkv, not the user's doing
        raise ValueError(f"result does not match its schema: {errors[0]}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return path


def load(path: str | Path) -> dict[str, Any]:
    """A result document from a file; UsageError when unreadable or not a 1.x bench result."""
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(
            f"result file {path} does not exist",
            fix="pass a result.json written by 'hpkv bench run'",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}", fix="check the path") from None
    except ValueError:
        raise UsageError(
            f"{path} is not JSON", fix="pass a result.json written by 'hpkv bench run'"
        ) from None
    if not isinstance(data, dict) or data.get("kind") != RESULT_KIND:
        raise UsageError(
            f"{path} is not an hpkv bench result (kind is not {RESULT_KIND})",
            fix="pass a result.json written by 'hpkv bench run'",
        )
    version = str(data.get("schemaVersion", ""))
    if version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        raise UsageError(
            f"{path} has result schema version {version or '?'}; this hpkv reads {SCHEMA_VERSION.split('.')[0]}.x",
            fix="use the hpkv version that wrote it",
        )
    errors = validation_errors(data)
    if errors:
        raise UsageError(
            f"{path} is not a valid bench result: {errors[0]}",
            fix="regenerate it with 'hpkv bench run'",
        )
    return data
