"""``hpkv curvine status|apply|remove`` — stage 3: the EBS CSI driver and Curvine (the L2)."""

from __future__ import annotations

from typing import Annotated

import typer

from hpkv.cli._common import emit_plan_and_apply, exit_with, state

app = typer.Typer(
    help="Stage 3: the EBS CSI driver and Curvine, the shared NVMe cache (L2), via Helm.",
    no_args_is_help=True,
)


def _stage(ctx: typer.Context):
    from hpkv.stages.curvine import CurvineStage

    return CurvineStage(state(ctx).ctx)


@app.command()
def status(ctx: typer.Context) -> None:
    """Check the EBS CSI add-on, the releases, the master (Active), workers, capacity, CSI node
    plugins, PVCs and node kernels."""
    from hpkv.stages.base import worst_state

    cli = state(ctx)
    checks = _stage(ctx).status()
    cli.output.checks(checks, title="curvine")
    exit_with(worst_state(c.state for c in checks).exit_code)


@app.command()
def apply(
    ctx: typer.Context,
    reformat: Annotated[
        bool,
        typer.Option(
            "--reformat",
            help="Delete all Curvine metadata and cached blocks and start empty (asks first; "
            "never happens without this flag).",
        ),
    ] = False,
) -> None:
    """Install or converge the EBS CSI add-on, the curvine-csi and curvine charts, StorageClass
    curvine-sc and the L2 PVCs (values from hpkv.yaml; --dry-run shows the values diff)."""
    cli = state(ctx)
    stage = _stage(ctx)
    plan = stage.plan(reformat=reformat)
    emit_plan_and_apply(cli, [plan], stage.apply)


@app.command()
def remove(
    ctx: typer.Context,
    delete_data: Annotated[
        bool,
        typer.Option(
            "--delete-data",
            help="Also delete the L2 PVCs and the cached KV blocks in them; kept by default.",
        ),
    ] = False,
    delete_volumes: Annotated[
        bool,
        typer.Option(
            "--delete-volumes",
            help="Also delete the master's metadata/journal volumes (EBS); kept by default.",
        ),
    ] = False,
) -> None:
    """Delete the L2 StorageClass and uninstall both charts, after confirmation.

    The L2 PVCs (cached KV data) and the master's EBS volumes stay unless --delete-data or
    --delete-volumes names them.
    """
    cli = state(ctx)
    stage = _stage(ctx)
    plan = stage.plan_remove(delete_data=delete_data, delete_volumes=delete_volumes)
    emit_plan_and_apply(cli, [plan], stage.remove, verb="remove")
