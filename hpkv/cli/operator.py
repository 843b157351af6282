"""``hpkv operator status|apply|remove`` — stage 2."""

from __future__ import annotations

from typing import Annotated

import typer

from hpkv.cli._common import emit_plan_and_apply, exit_with, state

app = typer.Typer(
    help="Stage 2: the HyperPod Inference Operator EKS add-on, its dependency add-ons and IAM.",
    no_args_is_help=True,
)


def _stage(ctx: typer.Context):
    from hpkv.stages.operator import OperatorStage

    return OperatorStage(state(ctx).ctx)


@app.command()
def status(ctx: typer.Context) -> None:
    """Show the OIDC provider, IAM roles, add-ons (health issues) and the operator in Kubernetes."""
    cli = state(ctx)
    checks = _stage(ctx).status()
    cli.output.checks(checks, title="operator")
    from hpkv.stages.base import worst_state

    exit_with(worst_state(c.state for c in checks).exit_code)


@app.command()
def apply(ctx: typer.Context) -> None:
    """Create or converge the OIDC provider, IAM roles, TLS bucket and add-ons, then verify.

    A trust policy that differs from what the operator needs is shown as drift and rewritten only
    with --yes.
    """
    cli = state(ctx)
    stage = _stage(ctx)
    plan = stage.plan()
    emit_plan_and_apply(cli, [plan], stage.apply)


@app.command()
def remove(
    ctx: typer.Context,
    delete_iam: Annotated[
        bool,
        typer.Option(
            "--delete-iam",
            help="Also delete the IAM roles and the TLS bucket hpkv created (the OIDC provider "
            "is kept).",
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Remove even while InferenceEndpointConfigs exist (they are left)."
        ),
    ] = False,
) -> None:
    """Delete the add-ons hpkv created, in reverse order, after confirmation."""
    cli = state(ctx)
    stage = _stage(ctx)
    plan = stage.plan_remove(delete_iam=delete_iam, force=force)
    emit_plan_and_apply(cli, [plan], stage.remove, verb="remove")
