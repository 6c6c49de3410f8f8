"""``gpuforge fleet export-telemetry`` and ``gpuforge fleet risk`` (docs/predictive.md).

``export-telemetry`` writes the history store's counters and events in the documented telemetry
format (JSON Lines; ``export-history``, its earlier name, is a hidden alias); ``risk`` reads
telemetry (a file, the history store, or Prometheus), ranks the nodes with reasons,
reports facility findings, and optionally drains the top nodes (``--drain-top``) or scores past
predictions (``--scorecard``); ``--report-dir`` and ``--textfile`` keep what the nightly run
found (its report, its node_exporter metrics).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import IO

import click
import hostlist

from gpuforge.admission import record_path
from gpuforge.atomic import atomic_open
from gpuforge.cli.common import (
    echo_json,
    json_option,
    max_fraction_option,
    on_services_host,
    report_dir_option,
    state_option,
)
from gpuforge.cli.health import cluster_dir, inventory_option, open_history, slurm_client
from gpuforge.errors import InputError, OperationError
from gpuforge.health.fleet import Fleet
from gpuforge.history.store import HistoryStore
from gpuforge.predict import act, calibration, nightly, policy
from gpuforge.predict.score import RiskReport, score_telemetry
from gpuforge.predict.signals import Window
from gpuforge.predict.sources import from_prometheus, from_store
from gpuforge.predict.telemetry import (
    OnError,
    Telemetry,
    format_time,
    parse_time,
    read_lines,
    read_telemetry,
    write_telemetry,
)
from gpuforge.textfile import write as write_textfile

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
parse_duration = policy.parse_duration


def _labels(root: Path | None) -> tuple[str | None, dict[str, dict[str, str]], Fleet | None]:
    """The cluster name, rack/leaf labels per node, and the fleet, from the inventory if any."""
    if root is None:
        return None, {}, None
    fleet = Fleet.load(root)
    labels: dict[str, dict[str, str]] = {}
    for node in fleet.nodes:
        tags = {}
        rack = fleet.placement.get(node, {}).get("rack")
        if rack:
            tags["rack"] = str(rack)
        if fleet.leaves.get(node):
            tags["leaf"] = fleet.leaves[node]
        labels[node] = tags
    return fleet.name, labels, fleet


def _root(cluster: str | None, inventory: Path | None, *, required: bool) -> Path | None:
    if cluster is None and inventory is None and not required:
        return None
    return cluster_dir(cluster, inventory)


@click.command("export-telemetry")
@click.argument("cluster", required=False)
@inventory_option
@state_option
@click.option("--since", default="30d", show_default=True, help="How far back (e.g. 30d, 12h).")
@click.option(
    "--out",
    "out_path",
    default="-",
    show_default=True,
    help="File to write (JSON Lines; - for stdout).",
)
def export_telemetry(
    cluster: str | None, inventory: Path | None, state_dir: Path, since: str, out_path: str
) -> None:
    """Write the history store's counters and events as telemetry (docs/predictive.md)."""
    root = _root(cluster, inventory, required=False)
    name, labels, _ = _labels(root)
    start = time.time() - parse_duration(since, "--since")
    with open_history(state_dir, name or cluster) as store:
        telemetry = from_store(store, since=start, labels=labels, source=str(store.path))
    if out_path == "-":
        lines = write_telemetry(telemetry, sys.stdout)
    else:
        target = Path(out_path)
        with atomic_open(target, mode=None) as handle:
            lines = write_telemetry(telemetry, handle)
    click.echo(
        f"exported {lines} lines: {len(telemetry.series)} series, {len(telemetry.events)} events",
        err=True,
    )


#: ``export-telemetry`` under its earlier name, for existing scripts: the same options and code,
#: left out of ``--help``.
export_history = click.Command(
    "export-history",
    params=export_telemetry.params,
    callback=export_telemetry.callback,
    help="The earlier name of export-telemetry (the same command).",
    hidden=True,
)


def _read_file(path: str, on_error: OnError) -> Telemetry:
    if path == "-":
        return read_lines(sys.stdin, source="<stdin>", on_error=on_error)
    return read_telemetry(Path(path), on_error=on_error)


def _echo_report(report: RiskReport, limit: int, out: IO[str] | None = None) -> None:
    def say(line: str) -> None:
        click.echo(line, file=out)

    scored, thin = report.ranked, report.insufficient
    at_risk = [r for r in scored if r.score > 0]
    say(
        f"fleet risk at {format_time(report.at)} (window {_dur(report.window_s)}, horizon "
        f"{_dur(report.horizon_s)}) from {report.source or '-'}: {len(scored)} nodes scored, "
        f"{len(at_risk)} with findings, {len(thin)} with too little data"
        + (f", {report.skipped_lines} malformed lines skipped" if report.skipped_lines else "")
    )
    for rank, risk in enumerate(at_risk[:limit], start=1):
        say(f"{rank:>4}  {risk.node:<14} {risk.score:5.2f}  {risk.top_signal}")
        for f in risk.findings:
            say(f"        {f.signal:<22} {f.subject:<10} {f.detail}")
    if len(at_risk) > limit:
        say(f"      ... {len(at_risk) - limit} more nodes with findings (--limit, --json)")
    for g in report.groups:
        nodes = hostlist.collect_hostlist(list(g.nodes))
        say(f"facility  {g.kind} {g.scope} {g.group}: {g.detail} [{nodes}]")
    if thin:
        nodes = hostlist.collect_hostlist([r.node for r in thin])
        say(f"too little data ({len(thin)}, not scored, not safe): {nodes}")
        for risk in thin[:limit]:
            say(f"        {risk.node}: {risk.note}")


def _dur(seconds: float) -> str:
    for unit in ("d", "h", "m"):
        size = _UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


@click.command("risk")
@on_services_host(when=lambda params: bool(params["from_store"]), local_files=("policy_file",))
@click.argument("cluster", required=False)
@inventory_option
@state_option
@click.option("--telemetry", "telemetry_file", metavar="FILE", help="Telemetry file (- for stdin).")
@click.option("--history", "history_alias", metavar="FILE", hidden=True,
              help="The earlier name of --telemetry.")  # fmt: skip
@click.option("--from-store", is_flag=True, help="Read the cluster's state store.")
@click.option("--prometheus", metavar="URL", help="Prometheus base URL (range queries).")
@click.option(
    "--on-error",
    type=click.Choice(["skip", "fail"]),
    default="fail",
    show_default=True,
    help="A malformed telemetry line: refuse the file (exit 2) or skip it (counted, reported).",
)
@click.option(
    "--at",
    "at_text",
    metavar="TIME",
    help="Score as of TIME (RFC 3339; default: now, or the end of a telemetry file).",
)
@click.option("--window", default="7d", show_default=True, help="Look-back window.")
@click.option("--horizon", default="7d", show_default=True, help="Prediction horizon.")
@click.option("--step", default="5m", show_default=True, help="Prometheus query step.")
@click.option("--timeout", type=click.FloatRange(min=1), default=30.0, show_default=True,
              help="Seconds per Prometheus query.")  # fmt: skip
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True,
              help="Nodes listed in the text output.")  # fmt: skip
@click.option("--drain-top", type=click.IntRange(min=1), help="Drain the N top nodes (idle only).")
@click.option("--include-busy", is_flag=True, help="With --drain-top: drain busy nodes too (they "
              "leave service when their job ends).")  # fmt: skip
@click.option(
    "--min-score",
    type=click.FloatRange(0, 1),
    default=act.MIN_DRAIN_SCORE,
    show_default=True,
    help="With --drain-top: never drain below this score.",
)
@click.option("--via", metavar="HOST", help="Run scontrol on HOST over SSH (the controller).")
@click.option("--shadow", is_flag=True, help="With --drain-top: decide and record, change nothing.")
@max_fraction_option()
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Drain per a policy file (threshold, max per night, idle only, shadow; "
    "docs/predictive.md): the nightly ranking's command.",
)
@click.option("--scorecard", is_flag=True, help="Report the precision of past predictions, and "
              "the calibration on labelled telemetry (failures after --at).")  # fmt: skip
@report_dir_option(
    "Also write the --json document to DIR/risk-<UTC time>.json (its path on stderr); a "
    "path on the machine the command runs on (the services host with --from-store).",
    default=None,
    dest="risk_report_dir",
)
@click.option(
    "--textfile",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the run's Prometheus textfile metrics here (node_exporter's textfile "
    "directory, a .prom name; a path on the machine the command runs on).",
)
@json_option
def risk(  # noqa: PLR0917 - one parameter per CLI option
    cluster: str | None,
    inventory: Path | None,
    state_dir: Path,
    telemetry_file: str | None,
    history_alias: str | None,
    from_store: bool,
    prometheus: str | None,
    on_error: OnError,
    at_text: str | None,
    window: str,
    horizon: str,
    step: str,
    timeout: float,
    limit: int,
    drain_top: int | None,
    include_busy: bool,
    min_score: float,
    via: str | None,
    shadow: bool,
    max_fraction: float,
    policy_file: Path | None,
    scorecard: bool,
    risk_report_dir: Path | None,
    textfile: Path | None,
    as_json: bool,
) -> None:
    """Rank the nodes most likely to fail within the horizon, with reasons.

    Exactly one source: --telemetry FILE, --from-store, or --prometheus URL. Nodes with too
    little data are listed as such; a rack warming together is a facility finding, not N nodes.
    """
    telemetry_file = _one_source(telemetry_file, history_alias, from_store, prometheus)
    if policy_file is not None and drain_top is not None:
        raise InputError("give --policy FILE or --drain-top N, not both")
    if scorecard and (risk_report_dir is not None or textfile is not None):
        raise InputError("--report-dir and --textfile keep a ranking: not with --scorecard")
    started = time.time()
    rules = policy.load(policy_file) if policy_file is not None else None
    window_s = rules.window_s if rules else parse_duration(window, "--window")
    horizon_s = rules.horizon_s if rules else parse_duration(horizon, "--horizon")
    at = _at(at_text)
    acting = drain_top is not None or rules is not None
    root = _root(cluster, inventory, required=from_store or acting)
    name, labels, fleet = _labels(root)
    telemetry = _load(
        telemetry_file, prometheus, state_dir, name, labels, at, window_s,
        on_error=on_error, step_s=parse_duration(step, "--step"), timeout=timeout,
        all_events=scorecard,
    )  # fmt: skip
    if at is None:
        at = telemetry.end if telemetry_file and telemetry.end is not None else time.time()
    if scorecard:
        admitted = record_path(state_dir, name) if name else None
        card, labelled = nightly.scorecard(
            telemetry, admitted, Window(at, window_s), horizon_s=horizon_s, threshold=min_score
        )
        _echo_scorecard(card, labelled, as_json)
        return
    report = score_telemetry(telemetry, Window(at, window_s), horizon_s=horizon_s)
    for line in telemetry.skipped:
        click.echo(f"warning: {telemetry.source}: {line} (skipped)", err=True)
    outcomes: list[act.DrainOutcome] = []
    already = 0
    if acting and fleet is not None and root is not None:
        request = nightly.DrainRequest(
            top=drain_top or 0, min_score=min_score, include_busy=include_busy,
            shadow=shadow, max_fraction=max_fraction,
        )  # fmt: skip
        already, outcomes = nightly.act_on(
            report, fleet, slurm_client(via, root), state_dir,
            policy=rules.drain if rules else None, request=request,
        )  # fmt: skip
    data = report.to_dict()
    if acting:
        data["drains"] = [o.to_dict() for o in outcomes]
    if rules is not None:
        data["policy"] = {"file": rules.source, "drained_tonight_before": already}
    # the --json document, byte for byte (echo_json's form)
    document = json.dumps(data, indent=2, sort_keys=True, default=str)
    _keep(
        document, report, outcomes, risk_report_dir, textfile,
        shadow=rules.drain.shadow if rules is not None else shadow, limit=limit, now=started,
    )  # fmt: skip
    if as_json:
        click.echo(document)
        return
    _echo_report(report, limit)
    if rules is not None:
        d = rules.drain
        click.echo(
            f"policy {rules.source}: threshold {d.threshold}, {already} of {d.max_per_night} "
            f"predicted drains made in the last 24 h, "
            f"{'idle only' if d.idle_only else 'busy too'}{', shadow' if d.shadow else ''}"
        )
    for o in outcomes:
        click.echo(f"drain-top {o.node}: {o.action} {o.reason} ({o.detail})")


def _one_source(
    telemetry_file: str | None, history_alias: str | None, from_store: bool, prometheus: str | None
) -> str | None:
    """The telemetry file given (``--telemetry``, or ``--history``: its earlier name), if any.

    Exactly one of the three sources must be given, else :class:`InputError` (exit 2).
    """
    if history_alias is not None:
        if telemetry_file is not None:
            raise InputError("give --telemetry FILE once (--history is its earlier name)")
        telemetry_file = history_alias
    sources = [s for s in (telemetry_file, from_store or None, prometheus) if s]
    if len(sources) != 1:
        raise InputError("give exactly one of --telemetry FILE, --from-store, --prometheus URL")
    return telemetry_file


def _keep(
    document: str,
    report: RiskReport,
    outcomes: list[act.DrainOutcome],
    report_dir: Path | None,
    textfile: Path | None,
    *,
    shadow: bool,
    limit: int,
    now: float,
) -> None:
    """The run's report (``--report-dir``) and textfile metrics (``--textfile``), when asked.

    Both paths are on the machine the command runs on: a delegated run (the services host's
    history) gets them unchanged, as given (the nightly unit runs on the services host itself).
    A file that cannot be written is an error (exit 1) after the drains were made and recorded.
    """
    if report_dir is not None:
        try:
            path = nightly.write_report(report_dir, document, now=now)
        except OSError as exc:
            raise OperationError(f"--report-dir {report_dir}: {exc.strerror or exc}") from None
        click.echo(f"risk report: {path}", err=True)
    if textfile is not None:
        families = nightly.metrics(report, outcomes, shadow=shadow, limit=limit, now=now)
        try:
            write_textfile(textfile, families)
        except OSError as exc:
            raise OperationError(f"--textfile {textfile}: {exc.strerror or exc}") from None


def _load(  # noqa: PLR0917 - the sources' inputs
    telemetry_file: str | None,
    prometheus: str | None,
    state_dir: Path,
    cluster: str | None,
    labels: dict[str, dict[str, str]],
    at: float | None,
    window_s: float,
    *,
    on_error: OnError,
    step_s: float,
    timeout: float,
    all_events: bool = False,
) -> Telemetry:
    """The telemetry from the one source given, with the inventory's labels filled in."""
    end = at if at is not None else time.time()
    if telemetry_file:
        telemetry = _read_file(telemetry_file, on_error)
    elif prometheus:
        telemetry = from_prometheus(
            prometheus, start=end - window_s, end=end, step_s=step_s, timeout=timeout
        )
    else:
        with open_history(state_dir, cluster) as store:
            if all_events:  # the scorecard judges every prediction the store holds
                telemetry = from_store(store, labels=labels, source=str(store.path))
            else:
                telemetry = from_store_window(store, end - window_s, at, labels)
    for node, tags in labels.items():
        for key, value in tags.items():
            telemetry.labels.setdefault(node, {}).setdefault(key, value)
    return telemetry


def from_store_window(
    store: HistoryStore, start: float, at: float | None, labels: dict[str, dict[str, str]]
) -> Telemetry:
    """The history store's counters and events in the window, as telemetry."""
    return from_store(store, since=start, until=at, labels=labels, source=str(store.path))


def _at(text: str | None) -> float | None:
    if text is None or text == "now":
        return None if text is None else time.time()
    try:
        return parse_time(text, "--at")
    except ValueError as exc:
        raise InputError(str(exc)) from None


def _echo_scorecard(
    card: act.Scorecard, labelled: calibration.Evaluation | None, as_json: bool
) -> None:
    if as_json:
        data = card.to_dict()
        if labelled is not None:
            data["calibration"] = labelled.to_dict()
        echo_json(data)
        return
    if labelled is not None:
        e = labelled
        shown = "n/a" if e.precision_flagged is None else f"{e.precision_flagged:.2f}"
        click.echo(
            f"calibration on the labelled telemetry ({e.failures} nodes failed within the "
            f"horizon): precision@{e.k} {e.precision_at_k:.2f}, recall@{e.k} "
            f"{e.recall_at_k:.2f}; score >= {e.threshold:g}: {e.flagged} nodes, precision "
            f"{shown}, recall {e.recall_flagged:.2f}; Brier {e.brier:.3f}"
        )
        for line in calibration.format_bins(e.bins):
            click.echo(f"  {line}")
    counts = card.counts()
    precision = card.precision()
    shown = f"{precision:.0%}" if precision is not None else "n/a (none concluded yet)"
    click.echo(
        f"scorecard (horizon {_dur(card.horizon_s)}): {len(card.predictions)} predicted drains: "
        f"{counts['confirmed']} confirmed, {counts['false_alarm']} false alarms, "
        f"{counts['pending']} pending, {counts['no_outcome']} without outcome; precision {shown}"
    )
    for signal in sorted({p.signal for p in card.predictions}):
        c = card.counts(signal)
        p = card.precision(signal)
        click.echo(
            f"  {signal:<22} confirmed {c['confirmed']}  false alarms {c['false_alarm']}  "
            f"precision {f'{p:.0%}' if p is not None else 'n/a'}"
        )
    for pred in card.predictions:
        click.echo(
            f"  {format_time(pred.time)} {pred.node:<14} {pred.signal:<22} {pred.outcome}"
            + (f" ({pred.evidence})" if pred.evidence else "")
        )
