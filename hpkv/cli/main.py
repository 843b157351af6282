"""The ``hpkv`` command: root options and command groups.

Command modules are imported here, but each imports its core lazily inside the command body, so
``hpkv --help`` and shell completion load neither boto3, botocore, kubernetes nor pyhelm3.
"""

from __future__ import annotations

from typing import Annotated

import typer

from hpkv import __version__
from hpkv.cli._common import CliState, GlobalOptions
from hpkv.cli._framework import HpkvGroup
from hpkv.output import OutputFormat

app = typer.Typer(
    name="hpkv",
    cls=HpkvGroup,
    help=(
        "Set up and operate a three-tier KV cache for vLLM on SageMaker HyperPod (EKS): "
        "L0 GPU prefix cache, L1 Tiered Storage (CPU memory), L2 a shared Curvine NVMe pool."
    ),
    epilog=(
        "Global options work before or after the subcommand. Exit codes: 0 success, 1 failure, "
        "2 usage error; status commands: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hpkv {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            metavar="FILE",
            help="Config file (default ./hpkv.yaml, then ~/.config/hpkv/hpkv.yaml).",
        ),
    ] = None,
    region: Annotated[
        str | None,
        typer.Option(
            "--region", metavar="REGION", help="AWS region (default: AWS_REGION / profile)."
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option("--profile", metavar="PROFILE", help="AWS profile (default: AWS_PROFILE)."),
    ] = None,
    cluster: Annotated[
        str | None, typer.Option("--cluster", metavar="NAME", help="HyperPod cluster name.")
    ] = None,
    kubeconfig: Annotated[
        str | None,
        typer.Option(
            "--kubeconfig",
            metavar="FILE",
            help="Kubeconfig file (default: KUBECONFIG, ~/.kube/config).",
        ),
    ] = None,
    context: Annotated[
        str | None,
        typer.Option(
            "--context",
            metavar="CONTEXT",
            help="Kubeconfig context (default: the one pointing at the cluster's EKS API).",
        ),
    ] = None,
    output: Annotated[
        OutputFormat | None,
        typer.Option(
            "--output", "-o", help="Output format: table, json or yaml.", case_sensitive=False
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan; change nothing.")
    ] = False,
    yes: Annotated[
        bool,
        typer.Option("--yes", "-y", help="Do not ask for confirmation (required without a TTY)."),
    ] = False,
    wait: Annotated[
        bool | None,
        typer.Option(
            "--wait/--no-wait",
            help="Wait for changes to finish (and for busy resources before starting).",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        str | None,
        typer.Option(
            "--timeout",
            metavar="DURATION",
            help="Limit for each wait, e.g. 900, 90s, 15m (default 30m).",
        ),
    ] = None,
    verbose: Annotated[
        int,
        typer.Option(
            "--verbose",
            "-v",
            count=True,
            show_default=False,
            help="More progress detail on stderr.",
        ),
    ] = 0,
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks on errors.")] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    ctx.obj = CliState(
        GlobalOptions(
            config=config,
            region=region,
            profile=profile,
            cluster=cluster,
            kubeconfig=kubeconfig,
            context=context,
            output=output,
            dry_run=dry_run,
            yes=yes,
            wait=wait,
            timeout=timeout,
            verbose=verbose,
            debug=debug,
        )
    )


def _register() -> None:
    from hpkv.cli import (
        bench,
        curvine,
        diagnose,
        endpoint,
        l2,
        operator,
        runbook,
        sizing,
        status,
        tiered_storage,
    )

    # the whole runbook
    app.command("init")(runbook.init)
    app.command("up")(runbook.up)
    app.command("down")(runbook.down)
    # operations across all stages
    app.command("status")(status.status)
    app.command("diagnose")(diagnose.diagnose)
    # stages, in run order
    app.add_typer(tiered_storage.app, name="tiered-storage")
    app.add_typer(operator.app, name="operator")
    app.add_typer(curvine.app, name="curvine")
    app.add_typer(l2.app, name="l2")
    app.add_typer(bench.app, name="bench")
    # inference endpoints
    app.add_typer(endpoint.app, name="endpoint")
    # sizing
    app.command("plan")(sizing.plan)
    app.command("simulate")(sizing.simulate)


_register()


def main() -> None:
    """Console-script entry point."""
    command = typer.main.get_command(app)
    command.main(prog_name="hpkv")
