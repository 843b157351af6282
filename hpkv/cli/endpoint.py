"""``hpkv endpoint deploy|status|list|delete`` — InferenceEndpointConfigs for the operator."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer

from hpkv.cli._common import CliState, emit_plan_and_apply, exit_with, state

app = typer.Typer(
    help="Inference endpoints: InferenceEndpointConfigs the HyperPod Inference Operator serves.",
    no_args_is_help=True,
)


class RoutingStrategy(StrEnum):
    PREFIXAWARE = "prefixaware"
    KVAWARE = "kvaware"
    SESSION = "session"
    ROUNDROBIN = "roundrobin"


Namespace = Annotated[
    str, typer.Option("--namespace", "-n", metavar="NAMESPACE", help="Kubernetes namespace.")
]


@app.command()
def deploy(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Endpoint name (at most 63 characters).")],
    namespace: Namespace = "default",
    model_source: Annotated[
        str | None,
        typer.Option(
            "--model-source",
            metavar="URI",
            help="hf://ORG/MODEL, s3://BUCKET/PATH[?region=R] or fsx://FS-ID/PATH "
            "(default: hf://Qwen/Qwen2-7B-Instruct).",
            show_default=False,
        ),
    ] = None,
    model_name: Annotated[
        str | None,
        typer.Option(
            "--model-name", help="Served model name (default: from the source).", show_default=False
        ),
    ] = None,
    instance_type: Annotated[
        str | None,
        typer.Option(
            "--instance-type",
            help="HyperPod instance type (default ml.g6e.4xlarge).",
            show_default=False,
        ),
    ] = None,
    replicas: Annotated[
        int | None,
        typer.Option("--replicas", min=1, help="Worker replicas (default 2).", show_default=False),
    ] = None,
    routing_strategy: Annotated[
        RoutingStrategy | None,
        typer.Option(
            "--routing-strategy",
            help="Intelligent routing strategy (default prefixaware; kvaware needs the "
            "completions endpoint).",
            case_sensitive=False,
            show_default=False,
        ),
    ] = None,
    routing: Annotated[
        bool,
        typer.Option(
            "--routing/--no-routing",
            help="Intelligent routing (cannot be added to or removed from an existing endpoint).",
        ),
    ] = True,
    invocation_endpoint: Annotated[
        str | None,
        typer.Option(
            "--invocation-endpoint",
            metavar="PATH",
            help="Model server path requests go to (default v1/chat/completions; "
            "v1/completions with kvaware).",
            show_default=False,
        ),
    ] = None,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            "--max-model-len",
            min=1,
            help="vLLM --max-model-len (default 8192).",
            show_default=False,
        ),
    ] = None,
    image: Annotated[
        str | None,
        typer.Option("--image", help="vLLM + LMCache image for the workers.", show_default=False),
    ] = None,
    l1: Annotated[
        bool | None,
        typer.Option("--l1/--no-l1", help="L1 CPU offload (default on).", show_default=False),
    ] = None,
    l2: Annotated[
        bool | None,
        typer.Option(
            "--l2/--no-l2",
            help="L2 cache, tieredstorage backend (default on).",
            show_default=False,
        ),
    ] = None,
    hf_token_secret: Annotated[
        str | None,
        typer.Option(
            "--hf-token-secret",
            metavar="SECRET[:KEY]",
            help="Secret holding a Hugging Face token for gated models (key default 'token').",
            show_default=False,
        ),
    ] = None,
    template: Annotated[
        str | None,
        typer.Option(
            "--template",
            metavar="FILE",
            help="InferenceEndpointConfig template to start from.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Render an InferenceEndpointConfig and create or update it (server-side apply).

    --dry-run prints the object: validated by the API server when a cluster is reachable,
    rendered locally otherwise (no credentials needed).
    """
    from hpkv.endpoint import EndpointOptions, Endpoints, region_hint, render

    cli = state(ctx)
    options = EndpointOptions(
        name=name,
        namespace=namespace,
        model_source=model_source,
        model_name=model_name,
        instance_type=instance_type,
        replicas=replicas,
        routing_strategy=routing_strategy.value if routing_strategy else None,
        routing=routing,
        invocation_endpoint=invocation_endpoint,
        max_model_len=max_model_len,
        image=image,
        l1=l1,
        l2=l2,
        hf_token_secret=hf_token_secret,
        template=template,
    )
    needs_region = bool(model_source and model_source.lower().startswith("s3://"))
    obj = render(options, region=region_hint(cli.ctx) if needs_region else None)
    endpoints = Endpoints(cli.ctx)
    if cli.options.dry_run:
        result = endpoints.dry_run(obj)
        cli.output.stderr.write(f"dry run: {result.note}\n")
        _print_object(cli, result.object)
        return
    plan = endpoints.plan_deploy(obj)
    emit_plan_and_apply(cli, [plan], endpoints.apply, verb="deploy")


def _print_object(cli: CliState, obj: dict[str, Any]) -> None:
    from hpkv.output import OutputFormat, to_json, to_yaml

    text = to_json(obj) + "\n" if cli.output.fmt is OutputFormat.JSON else to_yaml(obj)
    cli.output.stdout.write(text)
    cli.output.stdout.flush()


@app.command()
def status(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Endpoint name.")],
    namespace: Namespace = "default",
) -> None:
    """Show state, replicas, conditions, worker pods, routing service and load balancer."""
    from hpkv.endpoint import Endpoints

    cli = state(ctx)
    report = Endpoints(cli.ctx).report(name, namespace)
    cli.output.data(report.to_dict(), lambda: _status_tables(report))
    exit_with(report.overall.exit_code)


def _status_tables(report: Any) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from hpkv.output import checks_table

    parts: list[Any] = [
        checks_table(report.checks, title=f"endpoint {report.namespace}/{report.name}")
    ]
    if report.conditions:
        table = Table(title="conditions")
        for column in ("TYPE", "STATUS", "REASON", "MESSAGE"):
            table.add_column(column)
        for c in report.conditions:
            table.add_row(
                str(c.get("type", "")),
                str(c.get("status", "")),
                str(c.get("reason", "")),
                str(c.get("message", "")),
            )
        parts.append(table)
    if report.pods:
        table = Table(title="worker pods")
        for column in ("POD", "NODE", "PHASE", "READY", "RESTARTS"):
            table.add_column(column)
        for p in report.pods:
            table.add_row(
                p["name"], str(p["node"]), str(p["phase"]), p["containers"], str(p["restarts"])
            )
        parts.append(table)
    parts.append(Text(f"overall: {report.overall.value.upper()}"))
    return Group(*parts)


@app.command("list")
def list_(
    ctx: typer.Context,
    namespace: Annotated[
        str | None,
        typer.Option("--namespace", "-n", metavar="NAMESPACE", help="Only this namespace."),
    ] = None,
) -> None:
    """List InferenceEndpointConfigs (all namespaces unless -n is given)."""
    from hpkv.endpoint import Endpoints

    cli = state(ctx)
    rows = Endpoints(cli.ctx).summaries(namespace)

    def table() -> Any:
        from rich.table import Table

        t = Table(title="endpoints")
        for column in ("NAMESPACE", "NAME", "MODEL", "STATE", "READY", "ROUTING"):
            t.add_column(column)
        for r in rows:
            t.add_row(
                r["namespace"],
                r["name"],
                str(r["model"]),
                str(r["state"] or "-"),
                r["ready"],
                str(r["routing"] or "-"),
            )
        return t

    cli.output.data({"endpoints": rows}, table)


@app.command()
def delete(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Endpoint name.")],
    namespace: Namespace = "default",
) -> None:
    """Delete an endpoint after confirmation (--wait waits until the operator cleaned up)."""
    from hpkv.endpoint import Endpoints

    cli = state(ctx)
    endpoints = Endpoints(cli.ctx)
    plan = endpoints.plan_delete(name, namespace)
    emit_plan_and_apply(cli, [plan], endpoints.delete, verb="delete")
