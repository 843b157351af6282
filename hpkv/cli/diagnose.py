"""``hpkv diagnose``: known-failure detectors, the IAM preflight (--iam) and support bundles."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from hpkv.cli._common import CliState, exit_with, state
from hpkv.cli.status import CheckTimeoutOpt, DeadlineOpt, StageOpt

if TYPE_CHECKING:
    from hpkv.health.diagnose import DiagnoseReport
    from hpkv.health.iam import IamReport


def diagnose(
    ctx: typer.Context,
    iam: Annotated[
        bool,
        typer.Option(
            "--iam",
            help="IAM preflight instead of the detectors: simulate every action hpkv needs for "
            "the caller (and the EBS CSI driver's role); print what is missing and a "
            "least-privilege policy.",
        ),
    ] = False,
    ebs_csi_role: Annotated[
        str | None,
        typer.Option(
            "--ebs-csi-role",
            metavar="ARN",
            help="With --iam: the EBS CSI driver's role (default: from the IRSA annotation of "
            "kube-system/ebs-csi-controller-sa).",
            show_default=False,
        ),
    ] = None,
    bundle: Annotated[
        str | None,
        typer.Option(
            "--bundle",
            metavar="FILE.tar.gz",
            help="Also write a redacted support bundle (objects, events, logs, findings) here.",
            show_default=False,
        ),
    ] = None,
    max_size: Annotated[
        str,
        typer.Option("--max-size", metavar="SIZE", help="Size cap of the bundle, e.g. 25MiB."),
    ] = "25MiB",
    log_lines: Annotated[
        int,
        typer.Option(
            "--log-lines", min=1, metavar="N", help="Log lines per container in the bundle."
        ),
    ] = 1000,
    list_detectors: Annotated[
        bool, typer.Option("--list", help="List the detectors and their finding ids; read nothing.")
    ] = False,
    stage: StageOpt = None,
    check_timeout: CheckTimeoutOpt = "10s",
    deadline: DeadlineOpt = "60s",
) -> None:
    """Look for known failures (exit 0 none, 1 warnings, 2 critical, 3 a detector could not run)."""
    from hpkv.context import parse_duration
    from hpkv.health import diagnose as core
    from hpkv.health.engine import Limits

    cli = state(ctx)
    if list_detectors:
        _list(cli, core.catalog(cli.ctx, stage))
        return
    max_bytes = None
    if bundle:
        from hpkv.health.bundle import parse_size

        max_bytes = parse_size(max_size)
    limits = Limits(
        item_timeout=parse_duration(check_timeout, default=10.0),
        deadline=parse_duration(deadline, default=60.0),
    )
    report = core.new_report(cli.ctx)
    if iam:
        from hpkv.health.iam import preflight

        report.iam = preflight(cli.ctx, only=stage, ebs_csi_role=ebs_csi_role)
    if not iam or bundle:
        core.run_detectors(cli.ctx, report, only=stage, limits=limits)
    if bundle:
        from hpkv.health.bundle import write_bundle

        assert max_bytes is not None
        report.bundle = write_bundle(
            cli.ctx, bundle, report.to_dict(), max_bytes=max_bytes, log_lines=log_lines
        )
    cli.output.data(report.to_dict(), lambda: _renderable(report))
    exit_with(report.exit_code)


def _list(cli: CliState, detectors: list[Any]) -> None:
    def table() -> Any:
        from rich.table import Table

        view = Table(title="hpkv diagnose: detectors")
        for column in ("ID", "STAGE", "COMPONENT", "TITLE"):
            view.add_column(column, no_wrap=column != "TITLE")
        for d in detectors:
            view.add_row(d.id, d.stage, d.component, d.title)
        return view

    cli.output.data({"detectors": [d.describe() for d in detectors]}, table)


SEVERITY_STYLE = {"critical": "red", "warning": "yellow", "info": "cyan"}


def _renderable(report: DiagnoseReport) -> Any:
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from hpkv.output import STATE_LABEL, STATE_STYLE

    parts: list[Any] = []
    if report.findings:
        table = Table(title=f"hpkv diagnose: cluster {report.cluster}")
        table.add_column("SEVERITY", no_wrap=True)
        table.add_column("ID", no_wrap=True)
        table.add_column("EVIDENCE")
        table.add_column("REMEDIATION")
        for f in report.findings:
            style = SEVERITY_STYLE[f.severity.value]
            table.add_row(
                f"[{style}]{f.severity.value.upper()}[/{style}]",
                f.id,
                escape(f.evidence),
                escape(f.remediation),
            )
        parts.append(table)
    elif report.ran_detectors:
        ran = sum(1 for d in report.detectors if d.result == "ran")
        parts.append(Text(f"no findings: {ran} detectors found nothing wrong"))
    for d in report.detectors:
        if d.result == "failed":
            parts.append(Text(f"could not run {d.detector.id}: {d.error}", style="magenta"))
    skipped = [d.detector.id for d in report.detectors if d.result == "skipped"]
    if skipped:
        parts.append(Text(f"skipped (stage not installed): {', '.join(skipped)}", style="dim"))
    if report.iam is not None:
        parts.extend(_iam_parts(report.iam))
    if report.bundle is not None:
        b = report.bundle
        text = f"support bundle: {b.path} ({_size(b.bytes)}, {len(b.files)} files"
        if b.skipped:
            text += f"; {len(b.skipped)} left out by the size cap"
        if b.errors:
            text += f"; {len(b.errors)} items could not be read, see manifest.json"
        parts.append(Text(text + ")"))
    label, style = STATE_LABEL[report.state.value], STATE_STYLE[report.state.value]
    parts.append(Text.assemble("overall: ", (label, style)))
    return Group(*parts)


def _iam_parts(iam: IamReport) -> list[Any]:
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from hpkv.health.iam import policy_json

    parts: list[Any] = []
    for p in iam.principals:
        who = f"{p.role} {p.arn}".strip()
        if p.error:
            parts.append(Text(f"IAM {who}: cannot check: {p.error}", style="magenta"))
            continue
        if not p.arn:
            parts.append(Text(f"IAM {p.role}: {p.note}", style="dim"))
            continue
        via = f" (simulated as {p.simulated_arn})" if p.simulated_arn not in ("", p.arn) else ""
        if not p.missing:
            note = f"; {p.note}" if p.note and p.role != "caller" else ""
            parts.append(Text(f"IAM {who}{via}: all {p.checked} actions allowed{note}"))
            continue
        table = Table(title=f"IAM {who}{via}: {len(p.missing)} of the needed actions not allowed")
        for column in ("STAGE", "ACTION", "RESOURCE", "DECISION", "NEEDED TO"):
            table.add_column(column, no_wrap=column in ("STAGE", "DECISION"))
        for m in p.missing:
            action = m.need.action
            if m.denied != [action]:
                action += f" ({len(m.denied)} operations)"
            table.add_row(m.group, action, m.resource, m.decision, escape(m.need.why))
        parts.append(table)
        policy = p.policy()
        if policy is not None:
            parts.append(Text(f"Least-privilege policy that grants them ({p.role}):"))
            parts.append(Text(policy_json(policy)))
        if any(m.decision == "explicitDeny" for m in p.missing):
            parts.append(
                Text(
                    "explicitDeny: a Deny statement (or SCP/boundary) blocks these; remove it, "
                    "an Allow cannot override it",
                    style="yellow",
                )
            )
    return parts


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
