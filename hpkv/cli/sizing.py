"""``hpkv plan`` and ``hpkv simulate``: sizing before touching a cluster (no AWS, no Kubernetes)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hpkv.cli._common import CliState, state

if TYPE_CHECKING:
    from hpkv.sizing.costmodel import CostModel
    from hpkv.sizing.plan import Choice

ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        metavar="KEY|PATH",
        help="Catalog key (qwen2-7b, qwen2.5-32b, llama-3.1-8b, llama-3.1-70b, ...), Hugging Face "
        "id, or the path of a config.json (default sizing.model, else qwen2-7b).",
        show_default=False,
    ),
]
InstanceOpt = Annotated[
    str | None,
    typer.Option(
        "--instance-type",
        metavar="TYPE",
        help="e.g. ml.g6e.4xlarge, ml.g5.12xlarge, ml.p5.48xlarge (default sizing.instanceType).",
        show_default=False,
    ),
]
ReplicasOpt = Annotated[
    int | None,
    typer.Option(
        "--replicas",
        min=1,
        help="vLLM replicas (default sizing.replicas, else 2).",
        show_default=False,
    ),
]
TpOpt = Annotated[
    int | None,
    typer.Option(
        "--tp", min=1, help="Tensor-parallel GPUs per replica (default 1).", show_default=False
    ),
]
PercentOpt = Annotated[
    int | None,
    typer.Option(
        "--memory-percent",
        help="Host memory share of the L1 tier, 20..100 (default tieredStorage.memoryPercent).",
        show_default=False,
    ),
]


def _choice(
    model: str | None,
    instance_type: str | None,
    replicas: int | None,
    tp: int | None,
    memory_percent: int | None,
) -> Choice:
    from hpkv.sizing.plan import Choice

    return Choice(model, instance_type, replicas, tp, memory_percent)


def _load(cli: CliState, choice: Choice) -> tuple[Any, CostModel, dict[str, Any]]:
    from hpkv.sizing import plan as sizing_plan

    settings = cli.settings
    section = settings.section("sizing")
    percent = int(settings.section("tieredStorage").get("memoryPercent") or 20)
    config_dir = settings.source.parent if settings.source else None
    catalog, cost = sizing_plan.load(
        section, choice, memory_percent_default=percent, config_dir=config_dir
    )
    return catalog, cost, section


def _opt(flag: str, help: str, **kwargs: Any) -> Any:
    """An option whose default lives elsewhere (hpkv.yaml or the workload preset)."""
    return typer.Option(flag, help=help, show_default=False, **kwargs)


# --- hpkv plan ----------------------------------------------------------------------------------
def plan(
    ctx: typer.Context,
    model: ModelOpt = None,
    instance_type: InstanceOpt = None,
    replicas: ReplicasOpt = None,
    tp: TpOpt = None,
    memory_percent: PercentOpt = None,
    tokens: Annotated[
        list[int] | None,
        _opt(
            "--tokens",
            "Prompt length to compare L2 load and recompute for (repeatable; default "
            "500 1000 1925 2500 4000 8000 16000 32000).",
            min=1,
            metavar="N",
        ),
    ] = None,
    rps: Annotated[
        float | None, _opt("--rps", "Traffic profile: requests per second (default 10).")
    ] = None,
    prompt_tokens: Annotated[
        int | None, _opt("--prompt-tokens", "Traffic profile: prompt tokens (default 4000).")
    ] = None,
    output_tokens: Annotated[
        int | None, _opt("--output-tokens", "Traffic profile: output tokens (default 256).")
    ] = None,
    cached_fraction: Annotated[
        float | None,
        _opt(
            "--cached-fraction",
            "Traffic profile: share of prompt tokens a cache tier holds, 0..1 (default 0.5; "
            "'hpkv simulate' estimates it).",
        ),
    ] = None,
) -> None:
    """Size L0/L1/L2, compare loading KV from L2 with recomputing it, and price a traffic profile
    on every instance type. Reads only hpkv.yaml: no AWS or cluster access."""
    from hpkv.sizing import plan as sizing_plan

    cli = state(ctx)
    catalog, cost, section = _load(cli, _choice(model, instance_type, replicas, tp, memory_percent))
    profile = sizing_plan.traffic(
        section,
        {
            "requestsPerSecond": rps,
            "promptTokens": prompt_tokens,
            "outputTokens": output_tokens,
            "cachedFraction": cached_fraction,
        },
    )
    report = sizing_plan.report(catalog, cost, profile, tokens or list(sizing_plan.DEFAULT_TOKENS))
    cli.output.data(report, lambda: _plan_renderable(report))


def _plan_renderable(report: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    m, it, tiers = report["model"], report["instanceType"], report["tiers"]
    header = Text(
        f"{m['key']} ({m['name']}, {m['paramsBillion']:g}B params, {report['weightsGiB']:g} GiB "
        f"weights) on {report['replicas']} x {it['name']} ({it['gpus']} x {it['gpu']} "
        f"{it['gpuMemoryGiB']:g} GiB), tp {report['tp']}: {report['replicasPerNode']} replica(s) "
        f"per node, {report['nodes']} node(s)\nKV cache: {report['kvBytesPerToken']:,} bytes per "
        f"token; one 256-token LMCache chunk = {report['kvBytesPerChunk'] / 2**20:.1f} MiB"
    )
    capacity = Table(title="cache tiers", expand=False)
    for column in ("TIER", "WHERE", "TOKENS/REPLICA", "TOKENS, ALL", "SIZE"):
        capacity.add_column(column, justify="left" if column == "WHERE" else "right")
    capacity.add_row(
        "L0",
        "GPU memory x utilisation - weights - reserve",
        f"{tiers['l0']['tokensPerReplica']:,}",
        f"{tiers['l0']['tokensTotal']:,}",
        _bytes(tiers["l0"]["bytesPerReplica"]) + "/replica",
    )
    capacity.add_row(
        "L1",
        f"host memory x {report['memoryPercent']}% (Tiered Storage)",
        f"{tiers['l1']['tokensPerReplica']:,}",
        f"{tiers['l1']['tokensTotal']:,}",
        _bytes(tiers["l1"]["bytesPerNode"]) + "/node",
    )
    capacity.add_row(
        "L2",
        f"NVMe of {report['nodes']} node(s), shared (Curvine)",
        "-",
        f"{tiers['l2']['tokens']:,}",
        _bytes(tiers["l2"]["bytes"]),
    )
    rates = report["rates"]
    load = Table(
        title=(
            f"load from L2 ({rates['l2ReadGBps']:g} GB/s + {rates['l2LatencyMs']:g} ms) vs "
            f"recompute ({rates['prefillTflops']:g} TFLOPS effective), ms"
        ),
        expand=False,
    )
    for column in ("TOKENS", "KV", "L2 LOAD", "RECOMPUTE", "TTFT COLD", "TTFT L2", "SPEEDUP"):
        load.add_column(column, justify="right")
    for row in report["load"]:
        load.add_row(
            f"{row['tokens']:,}",
            _bytes(row["bytes"]),
            f"{row['l2LoadMs']:,.1f}",
            f"{row['recomputeMs']:,.1f}",
            f"{row['coldTtftMs']:,.1f}",
            f"{row['warmTtftMs']:,.1f}",
            f"{row['speedup']:.2f}x",
        )
    even = report["breakEvenTokens"]
    verdict = Text(
        f"break-even: prompts of {even:,} tokens or more start faster with their prefix in L2"
        if even is not None
        else "break-even: none; recomputing is always faster than loading from L2 here"
    )
    profile = report["traffic"]
    costs = Table(
        title=(
            f"cost for {profile['requestsPerSecond']:g} req/s of {profile['promptTokens']:,} + "
            f"{profile['outputTokens']:,} tokens, {profile['cachedFraction']:.0%} of each prompt "
            "cached (TTFT in ms, $ per million requests)"
        ),
        expand=False,
    )
    for column in (
        "INSTANCE TYPE",
        "TP",
        "TTFT COLD",
        "TTFT CACHED",
        "RPS/REPLICA",
        "NODES",
        "$/HOUR",
        "$/1M",
        "$/1M UNCACHED",
    ):
        costs.add_column(
            column, justify="left" if column == "INSTANCE TYPE" else "right", no_wrap=True
        )
    for row in report["cost"]:
        name = row["instanceType"] + (" *" if row["instanceType"] == it["name"] else "")
        if not row["fits"]:
            costs.add_row(name, "-", "does not fit", *["-"] * 6)
            continue
        costs.add_row(
            name,
            str(row["tp"]),
            f"{row['ttftColdMs']:,.0f}",
            f"{row['ttftCachedMs']:,.0f}",
            f"{row['requestsPerSecondPerReplica']:.2f}",
            str(row["nodesNeeded"]),
            f"{row['costPerHour']:,.2f}",
            f"{row['costPerMillionRequests']:,.2f}",
            f"{row['costPerMillionRequestsNoCache']:,.2f}",
        )
    return Group(header, capacity, load, verdict, costs)


def _bytes(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,.0f} B"


# --- hpkv simulate ------------------------------------------------------------------------------
def simulate(
    ctx: typer.Context,
    model: ModelOpt = None,
    instance_type: InstanceOpt = None,
    replicas: ReplicasOpt = None,
    tp: TpOpt = None,
    memory_percent: PercentOpt = None,
    workload: Annotated[
        str | None,
        _opt(
            "--workload",
            "chat (shared system prompts, multi-turn; default), system-prompt, document-qa.",
            metavar="KIND",
        ),
    ] = None,
    trace: Annotated[
        Path | None, _opt("--trace", "Replay a JSONL trace instead.", metavar="FILE.jsonl")
    ] = None,
    requests: Annotated[
        int | None, _opt("--requests", "Requests to simulate (default 20000).", min=1)
    ] = None,
    rate: Annotated[float | None, _opt("--rate", "Arrivals per second, Poisson (chat: 4).")] = None,
    users: Annotated[int | None, _opt("--users", "Sessions in flight (chat: 400).", min=1)] = None,
    turns: Annotated[int | None, _opt("--turns", "Requests per session (chat: 8).", min=1)] = None,
    prefixes: Annotated[
        int | None,
        _opt(
            "--prefixes", "Distinct shared prefixes: system prompts or documents (chat: 4).", min=1
        ),
    ] = None,
    prefix_tokens: Annotated[
        int | None, _opt("--prefix-tokens", "Tokens per shared prefix (chat: 2048).", min=1)
    ] = None,
    skew: Annotated[
        float | None, _opt("--skew", "Zipf exponent of prefix popularity, 0 = uniform (chat: 0).")
    ] = None,
    overlap: Annotated[
        float | None, _opt("--overlap", "Share of sessions on a shared prefix, 0..1 (default 1).")
    ] = None,
    context_tokens: Annotated[
        int | None, _opt("--context-tokens", "Private context per session (chat: 512).")
    ] = None,
    question_tokens: Annotated[
        int | None, _opt("--question-tokens", "Tokens per question (chat: 128).", min=1)
    ] = None,
    answer_tokens: Annotated[
        int | None, _opt("--answer-tokens", "Tokens per answer (chat: 256).")
    ] = None,
    strategy: Annotated[
        list[str] | None,
        _opt(
            "--strategy",
            "roundrobin, session, prefixaware, kvaware (repeatable; default all).",
            metavar="NAME",
        ),
    ] = None,
    seed: Annotated[int | None, _opt("--seed", "Random seed (default 0).", min=0)] = None,
    l2_ttl: Annotated[
        str | None,
        _opt(
            "--l2-ttl",
            "L2 time to live from the write (e.g. 30m, 7d; default none).",
            metavar="DURATION",
        ),
    ] = None,
    kvaware_threshold: Annotated[
        int | None,
        _opt("--kvaware-threshold", "kvaware fallback threshold in tokens (default 2000).", min=0),
    ] = None,
    chart: Annotated[
        Path | None,
        _opt(
            "--chart", "Where to write the chart (default hpkv-simulate.png).", metavar="FILE.png"
        ),
    ] = None,
    no_chart: Annotated[bool, typer.Option("--no-chart", help="Write no chart.")] = False,
    replay: Annotated[
        Path | None,
        _opt(
            "--replay",
            "Compare an 'hpkv bench' result with the cost model instead.",
            metavar="RESULT.json",
        ),
    ] = None,
) -> None:
    """Simulate N replicas with L0/L1/L2 caches under a workload and compare routing strategies:
    per-tier hit rates, recomputed tokens, TTFT. Runs locally; deterministic for a seed."""
    cli = state(ctx)
    choice = _choice(model, instance_type, replicas, tp, memory_percent)
    if replay is not None:
        _replay(cli, choice, replay)
        return
    from hpkv.sizing import runner

    _catalog, cost, section = _load(cli, choice)
    simulate_section = dict(section.get("simulate") or {})
    flags = {
        "workload": workload,
        "trace": trace,
        "requests": requests,
        "rate": rate,
        "users": users,
        "turns": turns,
        "prefixes": prefixes,
        "prefixTokens": prefix_tokens,
        "skew": skew,
        "overlap": overlap,
        "contextTokens": context_tokens,
        "questionTokens": question_tokens,
        "answerTokens": answer_tokens,
        "strategies": strategy,
        "seed": seed,
        "l2TtlSeconds": _ttl(l2_ttl),
        "kvawareThreshold": kvaware_threshold,
    }
    opts = runner.options(simulate_section, flags)
    result = runner.simulate(cost, opts, reporter=cli.reporter)
    payload = result.to_dict()
    chart_path = None
    if not no_chart:
        from hpkv.sizing.chart import write_chart

        target = chart or Path(simulate_section.get("chart") or runner.DEFAULT_CHART)
        chart_path = str(write_chart(result, target))
    payload["chart"] = chart_path
    cli.output.data(payload, lambda: _simulate_renderable(payload))


def _ttl(value: str | None) -> float | None:
    """--l2-ttl in seconds: 0/none/off, a duration (90s, 30m, 1h) or days (7d, Curvine's unit)."""
    if value is None:
        return None
    from hpkv.context import parse_duration

    text = value.strip().lower()
    if text in ("0", "none", "off"):
        return 0.0
    if text.endswith("d"):
        return parse_duration(text[:-1] + "h", default=0.0) * 24
    return parse_duration(text, default=0.0)


def _simulate_renderable(payload: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    workload, cluster = payload["workload"], payload["cluster"]
    what = (
        f"trace {workload['file']}"
        if workload["kind"] == "trace"
        else f"{workload['kind']} workload ({workload['users']} users, {workload['turns']} "
        f"turns, {workload['prefixes']} x {workload['prefixTokens']:,}-token prefixes, "
        f"{workload['rate']:g} req/s)"
    )
    header = Text(
        f"{payload['model']} on {payload['replicas']} x {payload['instanceType']} "
        f"(tp {payload['tp']}), {payload['requests']:,} requests of a {what}, seed "
        f"{payload['seed']}\ncapacity per replica: L0 {cluster['l0BlocksPerReplica']:,} blocks, "
        f"L1 {cluster['l1ChunksPerReplica']:,} chunks; shared L2 {cluster['l2Chunks']:,} chunks"
        + (f", TTL {cluster['l2TtlSeconds']:g} s" if cluster["l2TtlSeconds"] else "")
    )
    table = Table(title="routing strategies (share of prompt tokens; TTFT in ms)", expand=False)
    for column in (
        "STRATEGY",
        "L0 HIT",
        "L1 HIT",
        "L2 HIT",
        "TOTAL",
        "RECOMPUTED TOKENS",
        "TTFT P50",
        "P90",
        "P99",
        "MEAN",
        "BUSIEST REPLICA",
        "L2 WRITES",
    ):
        table.add_column(column, justify="left" if column == "STRATEGY" else "right")
    for row in payload["strategies"]:
        hits, ttft = row["hitRate"], row["ttftMs"]
        table.add_row(
            row["strategy"],
            f"{hits['l0']:.1%}",
            f"{hits['l1']:.1%}",
            f"{hits['l2']:.1%}",
            f"{hits['total']:.1%}",
            f"{row['recomputedTokens']:,}",
            f"{ttft['p50']:,.0f}",
            f"{ttft['p90']:,.0f}",
            f"{ttft['p99']:,.0f}",
            f"{ttft['mean']:,.0f}",
            f"{row['busiestReplicaUtilization']:.0%} busy",
            f"{row['l2WriteGBps']:.2f} GB/s",
        )
    best = payload["best"]
    notes = [
        f"best: {best['hitRate']} by hit rate, {best['ttftP50']} by TTFT p50, "
        f"{best['ttftP99']} by TTFT p99"
    ]
    if payload.get("chart"):
        notes.append(f"chart: {payload['chart']}")
    return Group(header, table, Text("\n".join(notes)))


def _replay(cli: CliState, choice: Choice, path: Path) -> None:
    from hpkv.sizing import replay as sizing_replay

    bench = sizing_replay.read_bench_result(path)
    catalog, cost, _section = _load(
        cli,
        _choice(
            choice.model or bench.model,
            choice.instance_type or bench.instance_type,
            bench.replicas,
            bench.tp,
            choice.memory_percent,
        ),
    )
    report = sizing_replay.replay(bench, catalog, cost)
    cli.output.data(report, lambda: _replay_renderable(report))


def _replay_renderable(report: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = [
        Text(
            f"bench result: {report['model']} on {report['replicas']} x {report['instanceType']}"
            f" (tp {report['tp']}): measured vs predicted"
        )
    ]
    if report["sweep"]:
        sweep = Table(title="cold (recomputed) vs warm (read from L2), TTFT in ms", expand=False)
        for column in (
            "PROMPT TOKENS",
            "HIT TOKENS",
            "COLD MEASURED",
            "COLD PREDICTED",
            "WARM MEASURED",
            "WARM PREDICTED",
            "SPEEDUP MEASURED",
            "SPEEDUP PREDICTED",
        ):
            sweep.add_column(column, justify="right")
        for row in report["sweep"]:
            sweep.add_row(
                f"{row['promptTokens']:,}",
                f"{row['hitTokens']:,}",
                f"{row['measuredColdMs']:,.1f}",
                f"{row['predictedColdMs']:,.1f}",
                f"{row['measuredWarmMs']:,.1f}",
                f"{row['predictedWarmMs']:,.1f}",
                f"{row['measuredSpeedup']:.2f}x",
                f"{row['predictedSpeedup']:.2f}x",
            )
        parts.append(sweep)
    summary = report["requests"]
    if summary["count"]:
        requests = Table(title=f"{summary['count']:,} requests, TTFT in ms", expand=False)
        for column in ("", "P50", "P90"):
            requests.add_column(column, justify="right")
        requests.add_row(
            "measured", f"{summary['measuredP50Ms']:,.1f}", f"{summary['measuredP90Ms']:,.1f}"
        )
        requests.add_row(
            "predicted", f"{summary['predictedP50Ms']:,.1f}", f"{summary['predictedP90Ms']:,.1f}"
        )
        parts.append(requests)
        parts.append(
            Text(
                f"per-request error: median |error| {summary['medianAbsErrorPct']:g}%, "
                f"mean {summary['meanErrorPct']:+g}%"
            )
        )
    fitted = report["fitted"]
    if fitted:
        values = ", ".join(f"{k}: {v:g}" for k, v in fitted.items())
        parts.append(Text(f"values that fit these measurements (sizing.costModel): {values}"))
    return Group(*parts)
