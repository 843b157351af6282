"""``hpkv bench run|compare|report`` — stage 5: measure cross-pod L2 hits, TTFT and L2 latency."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from hpkv.cli._common import CliState, confirm_changes, state

app = typer.Typer(
    help=(
        "Stage 5: benchmark an inference endpoint — cross-pod L2 hits, TTFT speedup, L2 read "
        "latency, per-tier hit rates — and compare runs."
    ),
    no_args_is_help=True,
)


def _ints(value: str | None, flag: str) -> list[int] | None:
    if value is None:
        return None
    from hpkv.errors import UsageError

    try:
        items = [int(v) for v in value.replace(" ", "").split(",") if v]
    except ValueError:
        raise UsageError(
            f"{flag} takes integers separated by commas", fix=f"e.g. {flag} 500,1000"
        ) from None
    if not items:
        raise UsageError(f"{flag} is empty", fix=f"e.g. {flag} 500,1000")
    return items


def _given(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


@app.command()
def run(
    ctx: typer.Context,
    endpoint: Annotated[
        str | None,
        typer.Option("--endpoint", metavar="NAME", help="InferenceEndpointConfig to benchmark."),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace", "-n", metavar="NS", help="Its namespace (default: found by name)."
        ),
    ] = None,
    scenario: Annotated[
        list[str] | None,
        typer.Option(
            "--scenario",
            "-s",
            metavar="NAME",
            help="cross-pod, shared-prefix, multi-turn or all (repeat or comma-separate; default all).",
        ),
    ] = None,
    from_here: Annotated[
        bool,
        typer.Option(
            "--from-here",
            help="Run the client on this machine (small tests) instead of as a Job in the cluster.",
        ),
    ] = False,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            metavar="URL",
            help="With --from-here: where load scenarios send requests (the router).",
        ),
    ] = None,
    pod_url: Annotated[
        list[str] | None,
        typer.Option(
            "--pod-url",
            metavar="[NAME=]URL",
            help="With --from-here: a worker pod's URL; repeat (pod A, pod B, ...).",
        ),
    ] = None,
    clients: Annotated[
        int,
        typer.Option(
            "--clients",
            metavar="N",
            help="Client pods for the load scenarios (an Indexed Job; they start together).",
        ),
    ] = 1,
    results_dir: Annotated[
        str | None,
        typer.Option(
            "--results-dir",
            metavar="DIR",
            help="Where result.json, report.md and charts go (a folder per run; default bench.resultsDir).",
        ),
    ] = None,
    api: Annotated[
        str,
        typer.Option("--api", metavar="API", help="completions or chat (OpenAI API, streaming)."),
    ] = "completions",
    model: Annotated[
        str | None,
        typer.Option(
            "--model", metavar="ID", help="Model id to request (default: the server's /v1/models)."
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            metavar="PORT",
            help="The workers' vLLM port (default: the endpoint's modelInvocationPort).",
        ),
    ] = None,
    image: Annotated[
        str | None,
        typer.Option(
            "--image",
            metavar="IMAGE",
            help="Runner image (default: the endpoint's serving image; needs python3).",
        ),
    ] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", metavar="N", help="Seed for request order and arrivals.")
    ] = None,
    keep_job: Annotated[
        bool,
        typer.Option("--keep-job", help="Keep the runner Job(s) and ConfigMap for inspection."),
    ] = False,
    request_timeout: Annotated[
        str, typer.Option("--request-timeout", metavar="DURATION", help="Limit per request.")
    ] = "10m",
    lengths: Annotated[
        str | None,
        typer.Option(
            "--lengths",
            metavar="N,N,...",
            help="cross-pod: prompt lengths in tokens [default: 500,1000,1500,2000,2500,3000].",
        ),
    ] = None,
    repetitions: Annotated[
        int | None,
        typer.Option(
            "--repetitions", metavar="R", help="cross-pod: repetitions per length [default: 3]."
        ),
    ] = None,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-tokens", metavar="N", help="cross-pod: output tokens per request [default: 5]."
        ),
    ] = None,
    settle_timeout: Annotated[
        str | None,
        typer.Option(
            "--settle-timeout",
            metavar="DURATION",
            help="cross-pod: longest wait for pod A's L2 write before asking pod B [default: 5s].",
        ),
    ] = None,
    pod_a: Annotated[
        str | None,
        typer.Option(
            "--pod-a", metavar="POD", help="cross-pod: pod that computes the prompt first."
        ),
    ] = None,
    pod_b: Annotated[
        str | None,
        typer.Option(
            "--pod-b",
            metavar="POD",
            help="cross-pod: pod that reuses it (default: one on another node).",
        ),
    ] = None,
    prefixes: Annotated[
        int | None,
        typer.Option(
            "--prefixes", metavar="S", help="shared-prefix: shared system prompts [default: 4]."
        ),
    ] = None,
    prefix_tokens: Annotated[
        int | None,
        typer.Option(
            "--prefix-tokens",
            metavar="P",
            help="shared-prefix: tokens per shared prompt [default: 1000].",
        ),
    ] = None,
    users: Annotated[
        int | None,
        typer.Option(
            "--users", metavar="U", help="shared-prefix: users with unique suffixes [default: 32]."
        ),
    ] = None,
    suffix_tokens: Annotated[
        int | None,
        typer.Option(
            "--suffix-tokens",
            metavar="Q",
            help="shared-prefix: tokens per unique suffix [default: 100].",
        ),
    ] = None,
    requests: Annotated[
        int | None,
        typer.Option(
            "--requests", metavar="N", help="shared-prefix: requests in total [default: 128]."
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            metavar="C",
            help="shared-prefix: requests in flight, over all clients [default: 8].",
        ),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(
            "--rate",
            metavar="R",
            help="shared-prefix: Poisson arrivals per second instead of a closed loop (with --concurrency as a cap).",
        ),
    ] = None,
    output_tokens: Annotated[
        int | None,
        typer.Option(
            "--output-tokens",
            metavar="N",
            help="shared-prefix: output tokens per request [default: 32].",
        ),
    ] = None,
    driver: Annotated[
        str | None,
        typer.Option(
            "--driver",
            metavar="hpkv|vllm",
            help="shared-prefix: hpkv's runner, or the serving image's 'vllm bench serve' (prefix_repetition) [default: hpkv].",
        ),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer",
            metavar="ID",
            help="shared-prefix with --driver vllm: the tokenizer 'vllm bench serve' loads.",
        ),
    ] = None,
    via: Annotated[
        str | None,
        typer.Option(
            "--via",
            metavar="router|pods",
            help="shared-prefix, multi-turn: go through the routing service, or round-robin to the pods [default: router].",
        ),
    ] = None,
    sessions: Annotated[
        int | None,
        typer.Option(
            "--sessions", metavar="N", help="multi-turn: concurrent sessions [default: 8]."
        ),
    ] = None,
    turns: Annotated[
        int | None,
        typer.Option("--turns", metavar="T", help="multi-turn: turns per session [default: 4]."),
    ] = None,
    system_tokens: Annotated[
        int | None,
        typer.Option(
            "--system-tokens",
            metavar="N",
            help="multi-turn: shared system prompt, tokens (0: none) [default: 500].",
        ),
    ] = None,
    first_turn_tokens: Annotated[
        int | None,
        typer.Option(
            "--first-turn-tokens",
            metavar="N",
            help="multi-turn: first question, tokens [default: 500].",
        ),
    ] = None,
    turn_tokens: Annotated[
        int | None,
        typer.Option(
            "--turn-tokens", metavar="N", help="multi-turn: later questions, tokens [default: 200]."
        ),
    ] = None,
    answer_tokens: Annotated[
        int | None,
        typer.Option(
            "--answer-tokens", metavar="N", help="multi-turn: answer length, tokens [default: 64]."
        ),
    ] = None,
) -> None:
    """Run benchmark scenarios against an endpoint and write result.json, report.md and charts.

    By default the client runs inside the cluster as a Kubernetes Job using the endpoint's own
    serving image (created, then deleted when the run ends; needs --yes without a terminal).
    """
    from hpkv.bench.core import BenchOptions, expand_scenarios
    from hpkv.context import parse_duration
    from hpkv.errors import UsageError

    for flag, value in (("--via", via), ("--driver", driver)):
        allowed = {"--via": ("router", "pods"), "--driver": ("hpkv", "vllm")}[flag]
        if value is not None and value not in allowed:
            raise UsageError(
                f"{flag} must be {' or '.join(allowed)}, not '{value}'",
                fix=f"pass {flag} {allowed[0]}",
            )
    options = BenchOptions(
        scenarios=expand_scenarios(scenario or []),
        endpoint=endpoint,
        namespace=namespace,
        from_here=from_here,
        url=url,
        pod_urls=list(pod_url or []),
        clients=clients,
        results_dir=results_dir,
        api=api,
        model=model,
        port=port,
        image=image,
        seed=seed,
        keep_job=keep_job,
        request_timeout_s=parse_duration(request_timeout, default=600.0),
        pod_a=pod_a,
        pod_b=pod_b,
        cross_pod=_given(
            lengths=_ints(lengths, "--lengths"),
            repetitions=repetitions,
            maxTokens=max_tokens,
            settleTimeoutS=parse_duration(settle_timeout, default=5.0) if settle_timeout else None,
        ),
        shared_prefix=_given(
            prefixes=prefixes,
            prefixTokens=prefix_tokens,
            users=users,
            suffixTokens=suffix_tokens,
            requests=requests,
            concurrency=concurrency,
            rate=rate,
            maxTokens=output_tokens,
            driver=driver,
            tokenizer=tokenizer,
            via=via,
        ),
        multi_turn=_given(
            sessions=sessions,
            turns=turns,
            systemTokens=system_tokens,
            firstTurnTokens=first_turn_tokens,
            turnTokens=turn_tokens,
            maxTokens=answer_tokens,
            via=via,
        ),
    )
    _positive(
        repetitions=repetitions,
        prefixes=prefixes,
        users=users,
        requests=requests,
        concurrency=concurrency,
        sessions=sessions,
        turns=turns,
        max_tokens=max_tokens,
        output_tokens=output_tokens,
        answer_tokens=answer_tokens,
        prefix_tokens=prefix_tokens,
        suffix_tokens=suffix_tokens,
        first_turn_tokens=first_turn_tokens,
        turn_tokens=turn_tokens,
    )
    if rate is not None and rate <= 0:
        raise UsageError("--rate must be positive", fix="e.g. --rate 5")
    _run(state(ctx), options)


def _positive(**values: int | None) -> None:
    from hpkv.errors import UsageError

    for name, value in values.items():
        if value is not None and value < 1:
            flag = "--" + name.replace("_", "-")
            raise UsageError(
                f"{flag} must be at least 1, not {value}", fix=f"pass a positive {flag}"
            )


def _run(cli: CliState, options: Any) -> None:
    from hpkv.bench.core import Bench, failed_scenarios, write_outputs
    from hpkv.errors import ApiError

    bench = Bench(cli.ctx, options)
    prepared = bench.prepare()
    plan = bench.plan(prepared)
    out = cli.output
    if cli.options.dry_run:
        if out.structured:
            out.data(
                {
                    "dryRun": True,
                    "runId": prepared.run_id,
                    "plans": [plan.to_dict()],
                    "spec": prepared.spec,
                }
            )
        else:
            out.plan([plan])
            out.text("dry run: nothing was created and no request was sent")
        return
    if plan.changes:
        if not out.structured:
            out.plan([plan])
        confirm_changes(cli, [plan], verb="create")
    result, failure = bench.run(prepared)
    if failure is not None and not result["scenarios"]:
        raise failure
    directory = bench.results_dir(prepared.run_id)
    files = write_outputs(result, directory)
    _render(cli, result, files)
    if failure is not None:
        raise type(failure)(
            f"{failure.message} (the scenarios before it are in {files['result']})",
            fix=failure.fix,
        )
    failed = failed_scenarios(result)
    if failed:
        raise ApiError(
            f"every request of {', '.join(failed)} failed (see {files['result']})",
            fix="check the endpoint's health and the first errors in the report",
        )


def _render(cli: CliState, result: dict[str, Any], files: dict[str, str]) -> None:
    out = cli.output
    payload = {
        "runId": result["runId"],
        "files": files,
        "environment": result["environment"],
        "summaries": {s["name"]: s["summary"] for s in result["scenarios"]},
        "notes": result["notes"]
        + [f"{s['name']}: {n}" for s in result["scenarios"] for n in s["notes"]],
    }
    if out.structured:
        out.data(payload)
        return
    from hpkv.cli import _bench_render as render

    for doc in result["scenarios"]:
        out.console.print(render.scenario_table(doc))
    tiers = render.tiers_table(result)
    if tiers is not None:
        out.console.print(tiers)
    for note in payload["notes"]:
        out.text(f"note: {render.escape(note)}")
    out.text(f"result: {files['result']}")
    out.text(f"report: {files['report']}")


@app.command()
def compare(
    ctx: typer.Context,
    a: Annotated[
        str, typer.Argument(metavar="A.json", help="Baseline result (e.g. before stage 4).")
    ],
    b: Annotated[
        str, typer.Argument(metavar="B.json", help="Result to compare (e.g. after stage 4).")
    ],
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Bootstrap seed.")] = 0,
) -> None:
    """Side-by-side deltas (B - A) with 95% bootstrap confidence intervals."""
    from hpkv.bench import results
    from hpkv.bench.compare import compare as compare_results

    cli = state(ctx)
    doc_a, doc_b = results.load(a), results.load(b)
    comparison = compare_results(doc_a, doc_b, seed=seed)
    comparison["a"]["file"], comparison["b"]["file"] = a, b
    out = cli.output
    if out.structured:
        out.data(comparison)
        return
    from hpkv.cli import _bench_render as render

    out.console.print(render.compare_table(comparison))
    for change in comparison["environmentChanges"]:
        out.text(f"environment: {change['key']}: {change['a']} -> {change['b']}")
    for side in ("A", "B"):
        only = comparison[f"onlyIn{side}"]
        if only:
            out.text(f"only in {side}: {', '.join(only)}")
    if not comparison["rows"]:
        out.text("no scenario in common: nothing to compare")


@app.command()
def report(
    ctx: typer.Context,
    result_file: Annotated[
        str, typer.Argument(metavar="RESULT.json", help="A result written by 'hpkv bench run'.")
    ],
    results_dir: Annotated[
        str | None,
        typer.Option(
            "--results-dir",
            metavar="DIR",
            help="Where to write report.md and charts (default: beside the result).",
        ),
    ] = None,
) -> None:
    """Re-render report.md and the charts of a saved result."""
    from pathlib import Path

    from hpkv.bench import charts, results
    from hpkv.bench import report as report_module

    cli = state(ctx)
    result = results.load(result_file)
    directory = Path(results_dir) if results_dir else Path(result_file).resolve().parent
    directory.mkdir(parents=True, exist_ok=True)
    chart_files = charts.render_all(result, directory)
    path = directory / "report.md"
    path.write_text(report_module.render(result, chart_files), encoding="utf-8")
    files = {"report": str(path), **{f"chart:{k}": str(v) for k, v in chart_files.items()}}
    if cli.output.structured:
        cli.output.data({"runId": result["runId"], "files": files})
    else:
        for kind, value in files.items():
            cli.output.text(f"{kind}: {value}")
