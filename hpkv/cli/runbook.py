"""``hpkv init``, ``hpkv up`` and ``hpkv down``: the whole runbook in one command."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hpkv.cli._common import CliState, confirm_changes, is_interactive, state
from hpkv.errors import Aborted, UsageError
from hpkv.stages import stage_names

if TYPE_CHECKING:
    from hpkv.runbook import Runbook, StageEvent, StageRun
    from hpkv.runbook.init import Account

StageName = enum.StrEnum("StageName", [(n, n) for n in stage_names()])  # type: ignore[misc]

_STAGE_LIST = ", ".join(stage_names())
FromOpt = Annotated[
    StageName | None,
    typer.Option(
        "--from",
        metavar="STAGE",
        help=f"Start at this stage (in run order: {_STAGE_LIST}).",
        show_default=False,
    ),
]
ThroughOpt = Annotated[
    StageName | None,
    typer.Option("--through", metavar="STAGE", help="Stop after this stage.", show_default=False),
]

_EVENT_STYLE = {
    "planning": "dim",
    "deferred": "yellow",
    "done": "green",
    "failed": "red",
    "planned": "cyan",
}


# --- progress ------------------------------------------------------------------------------------
class StageProgress:
    """Renders runbook events on stderr: rich styling on a terminal, plain lines otherwise."""

    def __init__(self, cli: CliState) -> None:
        self.console = cli.reporter.console
        self.tty = cli.reporter.interactive

    def __call__(self, event: StageEvent) -> None:
        if not self.tty:
            self.console.print(event.line(), markup=False, highlight=False, soft_wrap=True)
            return
        from rich.markup import escape

        if event.kind == "applying":
            self.console.rule(f"[bold]{event.index}/{event.total} {escape(event.stage)}[/bold]")
        mark = {"done": "✓ ", "failed": "✗ "}.get(event.kind, "")
        style = _EVENT_STYLE.get(event.kind, "")
        text = escape(f"{mark}{event.line()}")
        self.console.print(f"[{style}]{text}[/{style}]" if style else text)


# --- shared rendering ----------------------------------------------------------------------------
def _show_plan(cli: CliState, book: Runbook, *, header: str | None = None) -> None:
    out = cli.output
    if out.structured:
        return
    from hpkv.output import plan_renderable

    if header:
        out.text(header)
    for run in book.runs:
        out.console.print(
            f"stage {run.index}/{len(book.runs)}: {run.name}: {run.stage.title}", markup=False
        )
        if run.deferred is not None:
            out.console.print(
                f"  will be planned after stage {run.deferred.after} runs: {run.deferred.reason}",
                markup=False,
            )
        elif run.plan is not None:
            out.console.print(plan_renderable([run.plan]))
    deferred = len(book.deferred)
    summary = f"{book.changes} change(s) in {len(book.runs)} stage(s)"
    if deferred:
        summary += f"; {deferred} stage(s) planned after earlier ones run"
    out.text(summary)


def _confirm(cli: CliState, book: Runbook, verb: str) -> bool:
    plans = [r.plan for r in book.runs if r.plan is not None]
    asking = is_interactive() and not (cli.options.yes or cli.options.dry_run)
    if book.direction == "down" and asking:
        removed = [f"{p.stage}: {a.target}: {a.summary}" for p in plans for a in p.changes]
        kept = [f"{p.stage}: {k}" for p in plans for k in p.kept]
        if removed:
            cli.output.note("hpkv down will remove:\n  " + "\n  ".join(removed))
        if kept:
            cli.output.note("and keep:\n  " + "\n  ".join(kept))
    return confirm_changes(cli, plans, verb=verb, deferred=len(book.deferred))


def _confirm_more(cli: CliState, run: StageRun) -> None:
    """A re-planned stage deletes data the confirmed plan did not show: ask again."""
    if cli.options.yes:
        return
    assert run.plan is not None
    names = "; ".join(f"{a.target}: {a.summary}" for a in run.plan.destructive)
    if not is_interactive():
        from hpkv.errors import ConfirmationRequired

        raise ConfirmationRequired(
            f"stage {run.name} now plans to delete data: {names}",
            fix="review it with --dry-run, then rerun with --yes",
        )
    cli.output.note(f"[red]This deletes data:[/red] {names}")
    if not typer.confirm(f"Continue with stage {run.name}?", default=False, err=True):
        raise Aborted(
            f"stopped before stage {run.name}; earlier stages stay applied",
            fix="rerun when ready (it continues where it stopped)",
        )


def _outcome(cli: CliState, book: Runbook, *, applied: bool, extra: dict[str, Any]) -> None:
    out = cli.output
    failed = next((r for r in book.runs if r.state == "failed"), None)
    payload = {
        "command": book.direction,
        "dryRun": cli.options.dry_run,
        **extra,
        "applied": applied,
        "changes": book.changes,
        "failed": failed.name if failed else None,
        "stages": [r.to_dict() for r in book.runs],
    }
    if out.structured:
        out.data(payload)
        return
    if failed is not None:
        if failed.findings:
            out.checks(failed.findings, title=f"{failed.name}: diagnose findings")
        else:
            out.text(f"{failed.name}: diagnose found nothing more")
        return
    if cli.options.dry_run:
        out.text("dry run: nothing was changed")
        return
    out.data(payload, lambda: _results_table(book))


def _results_table(book: Runbook) -> Any:
    from rich.table import Table

    table = Table(title=f"hpkv {book.direction}", expand=False)
    for column in ("#", "STAGE", "RESULT", "CHANGES MADE", "VERIFICATION"):
        table.add_column(column)
    for run in book.runs:
        result = run.result
        made = str(len(result.performed)) if result else "-"
        checks = ", ".join(f"{c.name} {c.state.value}" for c in result.checks) if result else ""
        table.add_row(str(run.index), run.name, run.state, made, checks or "-")
    return table


def _execute(cli: CliState, book: Runbook, *, verb: str, extra: dict[str, Any]) -> None:
    from hpkv.runbook import StageFailed

    try:
        book.plan()
    except StageFailed:
        _outcome(cli, book, applied=False, extra=extra)
        raise
    _show_plan(cli, book)
    proceed = _confirm(cli, book, verb)
    if proceed or (book.changes == 0 and not book.deferred and not cli.options.dry_run):
        # converged stages still run: their apply verifies without writing
        try:
            book.run(confirm_more=lambda run: _confirm_more(cli, run))
        except StageFailed:
            _outcome(cli, book, applied=proceed, extra=extra)
            raise
        except KeyboardInterrupt:
            cli.output.note(f"interrupted: rerun 'hpkv {book.direction}' to continue")
            raise
    _outcome(cli, book, applied=proceed, extra=extra)


# --- commands ------------------------------------------------------------------------------------
def up(
    ctx: typer.Context,
    first: FromOpt = None,
    last: ThroughOpt = None,
    bench: Annotated[
        bool, typer.Option("--bench", help="Also run the benchmark stage at the end.")
    ] = False,
    offline: Annotated[
        bool,
        typer.Option(
            "--offline",
            help="With --dry-run: plan for an example cluster, calling no API (no credentials).",
        ),
    ] = False,
    cluster_profile: Annotated[
        str | None,
        typer.Option(
            "--cluster-profile",
            metavar="FILE",
            help="With --offline: the cluster to plan for (default: the embedded example).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run every stage in order: show the combined plan, ask once, apply, verify.

    Stops at the first failed stage and prints its diagnose findings; running it again continues
    where it stopped (every stage is idempotent). Waits for each stage unless --no-wait.
    """
    cli = state(ctx)
    if cluster_profile is not None and not offline:
        raise UsageError(
            "--cluster-profile is only used with --offline",
            fix="add --offline --dry-run, or drop --cluster-profile",
        )
    if offline and not cli.options.dry_run:
        raise UsageError(
            "--offline only plans (it calls no API)", fix="run 'hpkv up --offline --dry-run'"
        )
    from hpkv.runbook import Runbook

    book = Runbook(
        cli.ctx,
        "up",
        first=first.value if first else None,
        last=last.value if last else None,
        bench=bench,
        events=StageProgress(cli),
    )
    if offline:
        _offline(cli, book, cluster_profile)
        return
    if cli.options.wait is None:
        cli.ctx.options.wait = True  # a runbook waits for busy resources and for each stage
    book.preflight()
    _execute(cli, book, verb="apply", extra={"offline": False})


def _offline(cli: CliState, book: Runbook, cluster_profile: str | None) -> None:
    from hpkv.runbook.profile import load_profile

    profile = load_profile(cluster_profile)
    book.plan_offline(profile)
    _show_plan(
        cli,
        book,
        header=f"offline plan for {profile.summary()}\n(from {profile.source}; no API was called)",
    )
    _outcome(
        cli,
        book,
        applied=False,
        extra={"offline": True, "profile": profile.to_dict()},
    )


def down(
    ctx: typer.Context,
    first: FromOpt = None,
    last: ThroughOpt = None,
    delete_data: Annotated[
        bool,
        typer.Option("--delete-data", help="Also delete cached KV data (Curvine data, PVCs)."),
    ] = False,
    delete_volumes: Annotated[
        bool,
        typer.Option("--delete-volumes", help="Also delete the EBS volumes stages created."),
    ] = False,
    delete_iam: Annotated[
        bool,
        typer.Option("--delete-iam", help="Also delete the IAM roles and policies stages created."),
    ] = False,
) -> None:
    """Remove the stages in reverse order, after one confirmation listing what goes.

    Cached data, EBS volumes and IAM roles stay unless --delete-data, --delete-volumes or
    --delete-iam names them.
    """
    cli = state(ctx)
    from hpkv.runbook import Runbook

    book = Runbook(
        cli.ctx,
        "down",
        first=first.value if first else None,
        last=last.value if last else None,
        remove_options={
            "delete_data": delete_data,
            "delete_volumes": delete_volumes,
            "delete_iam": delete_iam,
        },
        events=StageProgress(cli),
    )
    for flag in book.unused_remove_flags():
        cli.reporter.warn(f"{flag}: no stage in this run deletes that; it changes nothing")
    if cli.options.wait is None:
        cli.ctx.options.wait = True
    book.preflight()
    _execute(
        cli,
        book,
        verb="remove",
        extra={"deleteData": delete_data, "deleteVolumes": delete_volumes, "deleteIam": delete_iam},
    )


def init(
    ctx: typer.Context,
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite an existing config file.")
    ] = False,
) -> None:
    """Discover the cluster and write a commented hpkv.yaml (--config FILE to choose the path).

    Asks only what it cannot discover (on a terminal); --yes takes the defaults. --dry-run prints
    the file instead of writing it.
    """
    cli = state(ctx)
    cli.options.read_config = False  # init writes the file; an old or broken one must not matter
    path = Path(cli.options.config or "hpkv.yaml").expanduser()
    asking = is_interactive() and not cli.options.yes
    if path.exists() and not force and not cli.options.dry_run and not asking:
        raise UsageError(
            f"{path} already exists", fix="pass --force to overwrite it, or --config OTHER.yaml"
        )
    from hpkv.runbook import init as discovery

    _ensure_region(cli, asking)
    account = discovery.discover_account(cli.ctx)
    name = _choose_cluster(cli, account, asking)
    facts = discovery.discover_cluster(cli.ctx, name)
    if facts.eks_name is None:
        from hpkv.errors import PreconditionFailed

        raise PreconditionFailed(
            f"HyperPod cluster '{name}' is not orchestrated by EKS",
            fix="hpkv supports EKS-orchestrated HyperPod clusters; pass --cluster for one",
        )
    answers = discovery.InitAnswers(
        profile=cli.settings.profile,
        kubeconfig=cli.options.kubeconfig,
        sections=_ask_sections(facts, asking),
    )
    text = discovery.render_config(account, facts, answers)
    written = False
    if not cli.options.dry_run:
        if (
            path.exists()
            and not force
            and not typer.confirm(f"{path} exists; overwrite it?", default=False, err=True)
        ):
            raise Aborted(f"kept {path}; nothing was written", fix="rerun with --force")
        _write(path, text)
        written = True
    _render_init(cli, path, written, account, facts, text)


def _ensure_region(cli: CliState, asking: bool) -> None:
    from hpkv.runbook.init import configured_region

    if configured_region(cli.settings):
        return
    if not asking:
        raise UsageError(
            "no AWS region configured",
            fix="pass --region (e.g. us-west-2), export AWS_REGION, or run on a terminal to be asked",
        )
    answer = typer.prompt("AWS region of the HyperPod cluster (e.g. us-west-2)", err=True)
    from hpkv.config.schema import validate

    validate({"region": answer.strip()}, where="the region you entered")
    cli.settings.data["region"] = answer.strip()


def _choose_cluster(cli: CliState, account: Account, asking: bool) -> str:
    from hpkv.errors import NotFound

    names = account.cluster_names
    wanted = cli.settings.cluster
    if wanted:
        if wanted not in names:
            raise NotFound(
                f"HyperPod cluster '{wanted}' not found in {account.region}",
                fix=f"pass one of: {', '.join(names)}" if names else "check --region",
            )
        return wanted
    if not names:
        raise NotFound(
            f"no HyperPod clusters in {account.region} (account {account.account})",
            fix="pass the --region your cluster is in, or create the cluster first",
        )
    default = account.default_cluster()
    if default and (len(names) == 1 or not asking):
        return default
    if not asking:
        raise UsageError(
            f"{len(names)} HyperPod clusters in {account.region} ({', '.join(names)}) and "
            "none is the obvious choice",
            fix="pass --cluster NAME",
        )
    while True:
        answer = typer.prompt(
            f"HyperPod cluster ({', '.join(names)})", default=default or names[0], err=True
        ).strip()
        if answer in names:
            return answer
        typer.echo(f"'{answer}' is not one of: {', '.join(names)}", err=True)


def _ask_sections(facts: Any, asking: bool) -> dict[str, dict[str, Any]]:
    """Stage settings without a discovered value: asked on a terminal, else their defaults."""
    from hpkv.runbook.init import QUESTIONS, discovered_section_values

    found = discovered_section_values(facts)
    answers: dict[str, dict[str, Any]] = {}
    from hpkv.config.schema import validate

    for key, (question, default) in QUESTIONS.items():
        section, field = key.split(".", 1)
        if field in found.get(section, {}):
            continue
        if not asking:  # --yes, or no terminal: the default answer, written as set
            answers.setdefault(section, {})[field] = default
            continue
        while True:
            value = typer.prompt(question, default=default, type=type(default), err=True)
            try:
                validate({section: {field: value}}, where="your answer")
            except UsageError as exc:
                typer.echo(exc.one_line(), err=True)
                continue
            answers.setdefault(section, {})[field] = value
            break
    return answers


def _write(path: Path, text: str) -> None:
    import os

    from hpkv.errors import ConfigError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(
            f"cannot write {path}: {exc.strerror or exc}",
            fix="choose a writable path with --config",
        ) from None


def _render_init(
    cli: CliState, path: Path, written: bool, account: Account, facts: Any, text: str
) -> None:
    out = cli.output
    payload = {
        "path": str(path),
        "written": written,
        "region": account.region,
        "account": account.account,
        "caller": account.caller,
        "clusters": account.cluster_names,
        "discovered": facts.to_dict(),
        "config": text,
    }
    if out.structured:
        out.data(payload)
        return
    if not written:
        out.stdout.write(text)
        out.stdout.flush()
        cli.output.note(f"dry run: {path} was not written")
        return
    for note in facts.notes:
        cli.reporter.warn(note)
    gpus = ", ".join(f"{n} x {t}" for t, n in facts.gpu_types.items()) or "no GPU nodes"
    out.text(f"wrote {path}: cluster {facts.name} in {account.region}, {gpus}")
    out.text("next: 'hpkv up --dry-run' shows what 'hpkv up' would do")
