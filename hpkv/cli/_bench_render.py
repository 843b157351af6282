"""Rich tables for ``hpkv bench`` (table output mode only)."""

from __future__ import annotations

from typing import Any

from rich.markup import escape as _escape
from rich.table import Table

from hpkv.bench.report import dist, mib, ms, num, pct


def escape(text: str) -> str:
    return _escape(text)


def scenario_table(doc: dict[str, Any]) -> Table:
    if doc["name"] == "cross-pod":
        return _cross_pod(doc)
    return _load(doc)


def _cross_pod(doc: dict[str, Any]) -> Table:
    params = doc["parameters"]
    table = Table(title=f"cross-pod: pod A {params.get('podA')} -> pod B {params.get('podB')}")
    for column in (
        "TOKENS",
        "COLD TTFT ms",
        "WARM TTFT ms",
        "SPEEDUP",
        "HIT TOKENS",
        "HIT RATE",
        "L2 READ ms",
        "KV FROM L2",
    ):
        table.add_column(column, justify="right", no_wrap=True)
    for row in doc["summary"]["byLength"]:
        table.add_row(
            num(row.get("promptTokens") or row["length"]),
            dist(row.get("coldTtftMs")),
            dist(row.get("warmTtftMs")),
            "–" if row.get("speedup") is None else f"{row['speedup']:.2f}x",
            num(row.get("hitTokens")),
            pct(row.get("hitRate")),
            dist(row.get("l2ReadMs")),
            mib(row.get("l2ReadBytes")),
        )
    return table


def _load(doc: dict[str, Any]) -> Table:
    summary = doc["summary"]
    ttft = summary.get("ttftMs") or {}
    table = Table(title=f"{doc['name']} ({doc['clients']} client(s), driver {doc['driver']})")
    table.add_column("METRIC", no_wrap=True)
    table.add_column("VALUE", justify="right")
    table.add_row("requests ok / errors", f"{summary['ok']} / {summary['errors']}")
    for key in ("p50", "p90", "p99"):
        table.add_row(f"TTFT {key} ms", ms(ttft.get(key)))
    throughput = summary.get("requestThroughput")
    table.add_row("throughput req/s", "–" if throughput is None else f"{throughput:.2f}")
    tokens = summary.get("outputTokensPerS")
    table.add_row("output tokens/s", "–" if tokens is None else f"{tokens:.1f}")
    for turn in summary.get("byTurn", []):
        table.add_row(f"turn {turn['turn']} TTFT p50 ms", ms((turn.get("ttftMs") or {}).get("p50")))
    return table


def tiers_table(result: dict[str, Any]) -> Table | None:
    rows = []
    for doc in result["scenarios"]:
        tiers = (doc.get("summary") or {}).get("tiers")
        if tiers:
            rows.append((doc["name"], tiers))
    if not rows:
        return None
    table = Table(title="per-tier hit rates (worker /metrics deltas)")
    for column in ("SCENARIO", "L0", "L1+L2", "L2 READ", "L2 WRITTEN", "RETRIEVE ms"):
        table.add_column(column, justify="right" if column != "SCENARIO" else "left", no_wrap=True)
    for name, tiers in rows:
        l2 = tiers.get("l2") or {}
        table.add_row(
            name,
            pct((tiers.get("l0") or {}).get("hitRate")),
            pct((tiers.get("external") or {}).get("hitRate")),
            mib(l2.get("readBytes")),
            mib(l2.get("writeBytes")),
            ms((tiers.get("retrieve") or {}).get("meanMs")),
        )
    return table


def _value(row: dict[str, Any], value: float | None) -> str:
    if value is None:
        return "–"
    unit = row["unit"]
    if unit == "ratio":
        return pct(value)
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "ms":
        return ms(value) if value >= 0 else "-" + ms(-value)
    return f"{value:.2f}" if not float(value).is_integer() else f"{value:.0f}"


def compare_table(comparison: dict[str, Any]) -> Table:
    a, b = comparison["a"], comparison["b"]
    level = round(comparison["confidence"] * 100)
    table = Table(title=f"A = {a['runId']}  vs  B = {b['runId']}")
    table.add_column("SCENARIO", no_wrap=True)
    table.add_column("METRIC", no_wrap=True)
    for column in ("A", "B", "DELTA", f"{level}% CI"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("VERDICT", no_wrap=True)
    for row in comparison["rows"]:
        delta = row["delta"]
        shown = "–"
        if delta is not None:
            shown = _value(row, delta) if row["unit"] != "ratio" else f"{100 * delta:+.1f} pt"
            if row["unit"] != "ratio" and delta >= 0:
                shown = "+" + shown
            if row.get("deltaPct") is not None and row["unit"] != "ratio":
                shown += f" ({row['deltaPct']:+.0f}%)"
        ci = row.get("ci")
        ci_text = "–" if ci is None else f"[{_value(row, ci[0])}, {_value(row, ci[1])}]"
        verdict = row.get("verdict") or ""
        style = {"better": "green", "worse": "red"}.get(verdict)
        table.add_row(
            row["scenario"],
            row["metric"],
            _value(row, row["a"]),
            _value(row, row["b"]),
            shown,
            ci_text,
            f"[{style}]{verdict}[/{style}]" if style else verdict,
        )
    return table
