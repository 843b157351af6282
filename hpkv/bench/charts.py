"""PNG charts of a bench result (matplotlib's object API on the Agg canvas; no pyplot state).

* ``ttft-by-length.png``: cross-pod TTFT, cold vs warm, by prompt length (p50, min-max whiskers);
* ``ttft-cdf.png``: TTFT distribution (CDF) of every request group;
* ``tier-hit-rates.png``: per-tier hit rates (L0, L1+L2) per scenario.

matplotlib is imported here only, so ``hpkv --help`` never loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpkv.bench import results
from hpkv.bench.stats import clean

COLD, WARM, OTHER = "#c0504d", "#4f81bd", "#9bbb59"


def _figure(width: float = 8.0, height: float = 4.5) -> Any:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig, fig.subplots()


def render_all(result: dict[str, Any], directory: Path) -> dict[str, Path]:
    charts: dict[str, Path] = {}
    cross = results.scenario(result, "cross-pod")
    if cross and any(row.get("warmTtftMs") for row in cross["summary"].get("byLength", [])):
        charts["ttft-by-length"] = ttft_by_length(cross, directory / "ttft-by-length.png")
    groups = ttft_groups(result)
    if groups:
        charts["ttft-cdf"] = ttft_cdf(groups, directory / "ttft-cdf.png")
    tiers = tier_rows(result)
    if tiers:
        charts["tier-hit-rates"] = tier_hit_rates(tiers, directory / "tier-hit-rates.png")
    return charts


def ttft_by_length(cross: dict[str, Any], path: Path) -> Path:
    rows = [r for r in cross["summary"]["byLength"] if r.get("coldTtftMs") or r.get("warmTtftMs")]
    fig, ax = _figure()
    positions = list(range(len(rows)))
    width = 0.38
    for offset, key, label, color in (
        (-width / 2, "coldTtftMs", "cold (fresh prompt, pod B)", COLD),
        (width / 2, "warmTtftMs", "warm (pod A's prompt, pod B, via L2)", WARM),
    ):
        p50 = [(r.get(key) or {}).get("p50", 0.0) for r in rows]
        low = [
            max(0.0, v - (r.get(key) or {}).get("min", v)) for v, r in zip(p50, rows, strict=True)
        ]
        high = [(r.get(key) or {}).get("max", v) - v for v, r in zip(p50, rows, strict=True)]
        ax.bar(
            [x + offset for x in positions],
            p50,
            width,
            yerr=[low, high],
            capsize=3,
            label=label,
            color=color,
        )
    for x, row in zip(positions, rows, strict=True):
        if row.get("speedup"):
            top = max(
                (row.get("coldTtftMs") or {}).get("max", 0),
                (row.get("warmTtftMs") or {}).get("max", 0),
            )
            ax.annotate(
                f"{row['speedup']:.2f}x",
                (x, top),
                ha="center",
                va="bottom",
                fontsize=9,
                xytext=(0, 3),
                textcoords="offset points",
            )
    ax.set_xticks(positions, [_tokens_label(r) for r in rows])
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("TTFT p50 (ms), whiskers min-max")
    ax.set_title("Cross-pod KV reuse: TTFT cold vs warm")
    ax.legend(loc="upper left", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path)
    return path


def _tokens_label(row: dict[str, Any]) -> str:
    tokens = row.get("promptTokens")
    return str(int(tokens)) if tokens else str(row["length"])


def ttft_groups(result: dict[str, Any]) -> dict[str, list[float]]:
    groups: dict[str, list[float]] = {}
    for doc in result.get("scenarios", []):
        ok = [r for r in doc["requests"] if r.get("ok")]
        if doc["name"] == "cross-pod":
            for role in ("cold", "warm"):
                values = clean(r.get("ttftMs") for r in ok if r.get("role") == role)
                if values:
                    groups[f"cross-pod {role}"] = values
        else:
            values = clean(r.get("ttftMs") for r in ok)
            if values:
                groups[doc["name"]] = values
    return groups


def ttft_cdf(groups: dict[str, list[float]], path: Path) -> Path:
    fig, ax = _figure()
    colors = {"cross-pod cold": COLD, "cross-pod warm": WARM}
    lowest = min(min(v) for v in groups.values())
    highest = max(max(v) for v in groups.values())
    for label, values in groups.items():
        ordered = sorted(values)
        n = len(ordered)
        ax.step(
            ordered,
            [(i + 1) / n for i in range(n)],
            where="post",
            label=f"{label} (n={n})",
            color=colors.get(label),
        )
    if lowest > 0 and highest / lowest > 20:
        ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.set_title("TTFT distribution")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    fig.savefig(path)
    return path


def tier_rows(result: dict[str, Any]) -> list[tuple[str, float | None, float | None]]:
    rows = []
    for doc in result.get("scenarios", []):
        tiers = (doc.get("summary") or {}).get("tiers")
        if not tiers:
            continue
        l0 = (tiers.get("l0") or {}).get("hitRate")
        external = (tiers.get("external") or {}).get("hitRate")
        if l0 is None and external is None:
            continue
        rows.append((doc["name"], l0, external))
    return rows


def tier_hit_rates(rows: list[tuple[str, float | None, float | None]], path: Path) -> Path:
    fig, ax = _figure(7.0, 4.0)
    positions = list(range(len(rows)))
    width = 0.38
    for offset, index, label, color in (
        (-width / 2, 1, "L0 (vLLM GPU prefix cache)", OTHER),
        (width / 2, 2, "L1+L2 (LMCache, via KV connector)", WARM),
    ):
        values = [100.0 * (row[index] or 0.0) for row in rows]
        bars = ax.bar([x + offset for x in positions], values, width, label=label, color=color)
        for bar, row in zip(bars, rows, strict=True):
            text = "n/a" if row[index] is None else f"{100 * row[index]:.1f}%"
            ax.annotate(
                text,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 2),
                textcoords="offset points",
            )
    ax.set_xticks(positions, [row[0] for row in rows])
    ax.set_ylabel("hit rate (% of prompt tokens)")
    ax.set_ylim(0, 110)
    ax.set_title("Per-tier hit rates (worker /metrics deltas)")
    ax.legend(loc="upper right", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path)
    return path
