"""``hpkv l2 status|apply|remove`` — stage 4: wire the inference pods to the Curvine L2."""

from __future__ import annotations

from typing import Annotated

import typer

from hpkv.cli._common import emit_plan_and_apply, exit_with, state

app = typer.Typer(
    help="Stage 4: wire inference pods to the Curvine L2 (LMCache fs connector), durably.",
    no_args_is_help=True,
)

EndpointOption = Annotated[
    list[str] | None,
    typer.Option(
        "--endpoint",
        "-e",
        metavar="NAME",
        help="InferenceEndpointConfig NAME or NAMESPACE/NAME (repeatable; default: all).",
        show_default=False,
    ),
]
ModeOption = Annotated[
    str | None,
    typer.Option(
        "--mode",
        metavar="policy|patch",
        help="policy: mutate pods at admission (survives operator re-renders); patch: the "
        "published Deployment patch, undone by the next re-render (default from hpkv.yaml, "
        "else policy).",
        show_default=False,
    ),
]
RestartOption = Annotated[
    str | None,
    typer.Option(
        "--restart",
        metavar="auto|rollout|pod-by-pod|none",
        help="How pods are re-created: auto picks pod-by-pod when no GPU is free for a surge pod.",
        show_default=False,
    ),
]


def _stage(ctx: typer.Context):
    from hpkv.stages.l2 import L2Stage

    return L2Stage(state(ctx).ctx)


@app.command()
def status(
    ctx: typer.Context,
    endpoint: EndpointOption = None,
    probe: Annotated[
        bool | None,
        typer.Option(
            "--probe/--no-probe",
            help="Exec a write/read probe in each pod's mount and scan LMCache's start-up log "
            "(default from hpkv.yaml l2.probe, else on).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Per endpoint and pod: env, mount, PVC, probe, replica consistency, stale pods."""
    from hpkv.stages.base import worst_state

    cli = state(ctx)
    checks = _stage(ctx).status(endpoint, probe=probe)
    cli.output.checks(checks, title="l2")
    exit_with(worst_state(c.state for c in checks).exit_code)


@app.command()
def apply(
    ctx: typer.Context,
    endpoint: EndpointOption = None,
    mode: ModeOption = None,
    restart: RestartOption = None,
    install_kyverno: Annotated[
        bool,
        typer.Option(
            "--install-kyverno",
            help="Where MutatingAdmissionPolicy is not served and Kyverno is absent, install "
            "the kyverno/kyverno Helm chart.",
        ),
    ] = False,
) -> None:
    """Wire the endpoints' pods to the L2, then re-create pods created before the wiring."""
    cli = state(ctx)
    stage = _stage(ctx)
    plan = stage.plan(
        endpoints=endpoint, mode=mode, restart=restart, install_kyverno=install_kyverno
    )
    emit_plan_and_apply(cli, [plan], stage.apply)


@app.command()
def remove(
    ctx: typer.Context,
    endpoint: EndpointOption = None,
    mode: Annotated[
        str | None,
        typer.Option(
            "--mode",
            metavar="policy|patch",
            help="Remove only the admission policy or only the Deployment patch (default: both).",
            show_default=False,
        ),
    ] = None,
    restart: RestartOption = None,
) -> None:
    """Delete the policy (or revert the patch), re-create the pods, confirm they are unwired."""
    cli = state(ctx)
    stage = _stage(ctx)
    plan = stage.plan_remove(endpoints=endpoint, mode=mode, restart=restart)
    emit_plan_and_apply(cli, [plan], stage.remove, verb="remove")
