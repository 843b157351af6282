"""The Markdown report of a bench result (charts are linked by file name, next to it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpkv.bench import results


def ms(value: float | None) -> str:
    return "–" if value is None else (f"{value:.1f}" if value < 100 else f"{value:.0f}")


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def num(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def mib(value: float | None) -> str:
    return "–" if value is None else f"{value / 1024**2:.1f} MiB"


def dist(d: dict[str, Any] | None) -> str:
    if not d:
        return "–"
    if d["n"] == 1:
        return ms(d["p50"])
    return f"{ms(d['p50'])} ({ms(d['min'])}–{ms(d['max'])})"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def render(result: dict[str, Any], charts: dict[str, Path] | None = None) -> str:
    charts = charts or {}
    inputs, env = result["inputs"], result["environment"]
    where = (
        "inside the cluster"
        if inputs["location"] == "in-cluster"
        else "from the operator's machine"
    )
    lines = [
        f"# hpkv bench {result['runId']}",
        "",
        f"{result['createdAt']} · hpkv {result['hpkvVersion']} · result schema "
        f"{result['schemaVersion']} · client ran {where}"
        + (f" on {inputs['clients']} pods" if inputs["clients"] > 1 else ""),
        "",
        "## Environment",
        "",
    ]
    kv = env.get("kvCache") or {}
    rows = [
        ["endpoint", str(inputs.get("endpoint") or "–")],
        [
            "model",
            f"{env.get('model') or '–'}"
            + (f" ({env['modelName']})" if env.get("modelName") else ""),
        ],
        ["replicas", f"{num(env.get('readyReplicas'))} ready of {num(env.get('replicas'))}"],
        ["instance type", str(env.get("instanceType") or "–")],
        ["serving image", str(env.get("image") or "–")],
        ["routing", str(env.get("routingStrategy") or ("router" if env.get("router") else "–"))],
        ["LMCache L2", str(kv.get("remoteUrl") or kv.get("l2Backend") or "–")],
        ["API", f"/v1/{'chat/' if inputs['api'] == 'chat' else ''}completions, streaming"],
    ]
    lines += table(["", ""], rows)
    for doc in result["scenarios"]:
        render_scenario = {
            "cross-pod": _cross_pod,
            "shared-prefix": _shared_prefix,
            "multi-turn": _multi_turn,
        }[doc["name"]]
        lines += render_scenario(doc, charts)
    lines += _tiers(result, charts)
    if "ttft-cdf" in charts:
        lines += ["## TTFT distribution", "", f"![TTFT CDF]({charts['ttft-cdf'].name})", ""]
    notes = list(result.get("notes", []))
    for doc in result["scenarios"]:
        notes += [f"{doc['name']}: {n}" for n in doc.get("notes", [])]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def _cross_pod(doc: dict[str, Any], charts: dict[str, Path]) -> list[str]:
    p = doc["parameters"]
    summary = doc["summary"]
    lines = [
        "## Cross-pod L2 reuse",
        "",
        f"For each prompt length and repetition ({p.get('repetitions')}×): a fresh prompt goes to pod "
        f"A (`{p.get('podA')}`) directly, bypassing the router; the byte-identical prompt then goes "
        f"to pod B (`{p.get('podB')}`) — **warm**, its KV must come from the shared L2 — and a "
        f"different fresh prompt of the same length goes to pod B — **cold**. max_tokens "
        f"{p.get('maxTokens')}, temperature 0, one request at a time. Hit tokens are pod B's "
        "`vllm:external_prefix_cache_hits` delta; L2 read time is LMCache's retrieve time.",
        "",
    ]
    rows = []
    for row in summary["byLength"]:
        published = row.get("published")
        rows.append(
            [
                num(row.get("promptTokens") or row["length"]),
                dist(row.get("coldTtftMs")),
                dist(row.get("warmTtftMs")),
                "–" if row.get("speedup") is None else f"{row['speedup']:.2f}×",
                f"{published['speedup']:.2f}×" if published else "–",
                num(row.get("hitTokens")),
                pct(row.get("hitRate")),
                dist(row.get("l2ReadMs")),
                mib(row.get("l2ReadBytes")),
            ]
        )
    lines += table(
        [
            "prompt tokens",
            "cold TTFT ms p50 (min–max)",
            "warm TTFT ms p50 (min–max)",
            "speedup",
            "published",
            "hit tokens",
            "hit rate",
            "L2 read ms",
            "KV read from L2",
        ],
        rows,
    )
    lines.append(
        f"Published: {results.PUBLISHED_SOURCE}. Different hardware; compare shape, not values."
    )
    lines.append("")
    if any(r.get("interference") for r in summary["byLength"]):
        lines += [
            "Pod B served other prompts during some measurements; their hit figures include that traffic.",
            "",
        ]
    if "ttft-by-length" in charts:
        lines += [f"![TTFT cold vs warm]({charts['ttft-by-length'].name})", ""]
    return lines


def _load_rows(summary: dict[str, Any]) -> list[str]:
    ttft = summary.get("ttftMs") or {}
    rows = [
        ["requests (ok / errors)", f"{summary['ok']} / {summary['errors']}"],
        ["TTFT p50 / p90 / p99 ms", " / ".join(ms(ttft.get(k)) for k in ("p50", "p90", "p99"))],
        [
            "throughput",
            f"{_rate(summary.get('requestThroughput'))} req/s, {_rate(summary.get('outputTokensPerS'))} output tok/s",
        ],
        ["duration", f"{summary['durationS']:.1f} s"],
    ]
    if summary.get("firstErrors"):
        rows.append(["first errors", "; ".join(summary["firstErrors"])])
    return table(["", ""], rows)


def _rate(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _shared_prefix(doc: dict[str, Any], charts: dict[str, Path]) -> list[str]:
    p = doc["parameters"]
    load = f"concurrency {p.get('concurrency')}" if p.get("concurrency") else ""
    if p.get("rate"):
        load += (", " if load else "") + f"Poisson {p['rate']} req/s"
    lines = [
        "## Shared-prefix load",
        "",
        f"{p.get('prefixes')} shared system prompts of {p.get('prefixTokens')} tokens, "
        f"{p.get('users')} users with unique {p.get('suffixTokens')}-token suffixes, "
        f"{p.get('requests')} requests ({load or 'unbounded'}) through "
        f"{'the routing service' if p.get('via') != 'pods' else 'the pods round-robin'}"
        + (" driven by `vllm bench serve`" if doc.get("driver") == "vllm" else "")
        + f", {doc['clients']} client(s).",
        "",
    ]
    return lines + _load_rows(doc["summary"])


def _multi_turn(doc: dict[str, Any], charts: dict[str, Path]) -> list[str]:
    p = doc["parameters"]
    summary = doc["summary"]
    lines = [
        "## Multi-turn",
        "",
        f"{p.get('sessions')} concurrent sessions × {p.get('turns')} turns: a "
        f"{p.get('systemTokens')}-token shared system prompt, a {p.get('firstTurnTokens')}-token "
        f"first question, then {p.get('turnTokens')}-token questions; each answer "
        f"({p.get('maxTokens')} tokens max) joins the history.",
        "",
    ]
    lines += _load_rows(summary)
    rows = [
        [str(t["turn"]), num(t.get("promptTokens")), dist(t.get("ttftMs")), str(t["requests"])]
        for t in summary.get("byTurn", [])
    ]
    return lines + table(["turn", "prompt tokens", "TTFT ms p50 (min–max)", "requests"], rows)


def _tiers(result: dict[str, Any], charts: dict[str, Path]) -> list[str]:
    rows = []
    for doc in result["scenarios"]:
        tiers = (doc.get("summary") or {}).get("tiers")
        if not tiers:
            continue
        l2 = tiers.get("l2") or {}
        rows.append(
            [
                doc["name"],
                pct((tiers.get("l0") or {}).get("hitRate")),
                pct((tiers.get("external") or {}).get("hitRate")),
                mib(l2.get("readBytes")),
                mib(l2.get("writeBytes")),
                ms((tiers.get("retrieve") or {}).get("meanMs")),
            ]
        )
    if not rows:
        return []
    lines = [
        "## Per-tier hit rates",
        "",
        "Deltas of every worker pod's /metrics before and after each scenario, summed over pods: "
        "L0 = `vllm:prefix_cache_hits/queries`, L1+L2 = `vllm:external_prefix_cache_hits/queries`, "
        "L2 traffic = `lmcache:num_remote_read_bytes` / `num_remote_write_bytes`.",
        "",
    ]
    lines += table(
        ["scenario", "L0 hit rate", "L1+L2 hit rate", "L2 read", "L2 written", "retrieve mean ms"],
        rows,
    )
    if "tier-hit-rates" in charts:
        lines += [f"![Per-tier hit rates]({charts['tier-hit-rates'].name})", ""]
    return lines
