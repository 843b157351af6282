"""``hpkv tiered-storage status|apply|remove`` — stage 1."""

from __future__ import annotations

from typing import Annotated

import typer

from hpkv.cli._common import emit_plan_and_apply, exit_with, state

app = typer.Typer(
    help="Stage 1: HyperPod Tiered Storage, the L1 CPU-memory tier (SageMaker UpdateCluster).",
    no_args_is_help=True,
)


def _stage(ctx: typer.Context):
    from hpkv.stages.tiered_storage import TieredStorageStage

    return TieredStorageStage(state(ctx).ctx)


@app.command()
def status(ctx: typer.Context) -> None:
    """Show the API state, the memory percentage and the ai-toolkit DaemonSet per node."""
    cli = state(ctx)
    checks = _stage(ctx).status()
    cli.output.checks(checks, title="tiered-storage")
    from hpkv.stages.base import worst_state

    exit_with(worst_state(c.state for c in checks).exit_code)


@app.command()
def apply(
    ctx: typer.Context,
    memory_percent: Annotated[
        int | None,
        typer.Option(
            "--memory-percent",
            help="Percent of instance memory for the L1 tier, 20..100 (default from hpkv.yaml, else 20).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Enable Tiered Storage (UpdateCluster; NodeRecovery is sent back unchanged)."""
    from hpkv.stages.tiered_storage import validate_percent

    if memory_percent is not None:
        validate_percent(memory_percent)
    cli = state(ctx)
    stage = _stage(ctx)
    plan = stage.plan(memory_percent=memory_percent)
    emit_plan_and_apply(cli, [plan], stage.apply)


@app.command()
def remove(ctx: typer.Context) -> None:
    """Disable Tiered Storage (Mode=Disable), after confirmation."""
    cli = state(ctx)
    stage = _stage(ctx)
    plan = stage.plan_remove()
    emit_plan_and_apply(cli, [plan], stage.remove, verb="remove")
