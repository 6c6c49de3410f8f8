"""``gpuforge health``: the collector nodes push their records to, and a node's history.

``serve`` runs on the controller (a systemd service; in the lab a background process on the
lab network's gateway); ``history`` reads the store it writes, on the services host when the
cluster directory names one (docs/health.md, "Controller: collector, decisions, history" and
"Where the tools run"); ``store check`` and ``store repair`` check and rebuild that store
(docs/runbooks/history-store-damaged.md).
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import click

from gpuforge.cli.common import (
    cluster_argument,
    cluster_option,
    echo_json,
    inventory_option,
    json_option,
    max_fraction_option,
    on_services_host,
    state_option,
    via_option,
)
from gpuforge.cli.context import (
    ClusterContext,
    cluster_context,
    cluster_root,
    remote_host,
    state_paths,
)
from gpuforge.cli.context import slurm_client as context_slurm_client
from gpuforge.command import SshRunner
from gpuforge.errors import InputError
from gpuforge.health.auth import POLICIES, SEQUENCE_FILE, Authenticator, Unmunge
from gpuforge.health.collector import (
    DEFAULT_PORT,
    Collector,
    claim_history,
    make_server,
    parse_listen,
)
from gpuforge.health.decide import DRAIN_ACTIONS, Decider, DecisionPolicy
from gpuforge.health.fleet import TEXTFILE_DIR
from gpuforge.history.store import HistoryStore, Retention, check_store, iso, repair_store
from gpuforge.inventory.reader import host_vars
from gpuforge.ssh import SshTarget

# What other command modules take from here (fleet risk: the shared options and helpers).
__all__ = [
    "cluster_dir",
    "health",
    "inventory_option",
    "open_history",
    "parse_since",
    "slurm_client",
    "via_option",
]

_SPAN = re.compile(r"^(?P<n>[0-9]+(?:\.[0-9]+)?)(?P<unit>[smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float) -> float:
    """``7d``, ``12h``, ``30m``, ``90s`` (ago) or an ISO 8601 time, as epoch seconds."""
    match = _SPAN.match(text.strip())
    if match:
        return now - float(match.group("n")) * _UNIT[match.group("unit")]
    try:
        stamp = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            f"--since {text!r}: give a span (7d, 12h, 30m) or an ISO time (2026-11-30T19:00Z)"
        ) from None
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()


#: The cluster directory the options name (:func:`gpuforge.cli.context.cluster_root`).
cluster_dir = cluster_root
#: Slurm here or over SSH (:func:`gpuforge.cli.context.slurm_client`).
slurm_client = context_slurm_client


def history_file(state_dir: Path, cluster: str | None) -> Path:
    """The history file of ``cluster``, or of the only cluster under ``state_dir`` that has one."""
    if cluster:
        return state_paths(state_dir, cluster).history_db
    found = sorted(state_dir.glob("*/history.db"))
    if len(found) != 1:
        names = ", ".join(p.parent.name for p in found) or "none"
        raise InputError(f"give --cluster: histories under {state_dir}: {names}")
    return found[0]


def open_history(state_dir: Path, cluster: str | None) -> HistoryStore:
    """The history of ``cluster``, or of the only cluster under ``state_dir`` that has one."""
    return HistoryStore.open(history_file(state_dir, cluster), create=False)


@click.group("health")
def health() -> None:
    """Node health on the controller: the collector and node history."""


#: ``--auth off``: records are taken on their source address alone, as before credentials.
AUTH_OFF = "off"


def _authenticator(
    ctx: ClusterContext, policy: str, uid: int, via: str | None, munge_socket: Path | None
) -> Authenticator:
    """The collector's munge check: unmunge here, or on ``via`` over SSH."""
    unmunge = Unmunge(socket=munge_socket)
    host = remote_host(via)
    if host is not None:  # this machine runs no munged with the cluster's key
        target = SshTarget.from_hostvars(host, host_vars(ctx.path, host))
        unmunge = Unmunge(SshRunner({host: target}), host, munge_socket)
    sequences = ctx.state.root / SEQUENCE_FILE
    try:
        return Authenticator(policy, uid=uid, unmunge=unmunge, sequence_path=sequences)
    except OSError as exc:
        raise InputError(f"{sequences}: {exc.strerror or exc}") from None


@health.command("serve")
@cluster_argument
@inventory_option
@click.option(
    "--listen",
    default=f"0.0.0.0:{DEFAULT_PORT}",
    show_default=True,
    help="ADDR:PORT to listen on (the collector.url in the nodes' health.yaml).",
)
@via_option
@state_option
@max_fraction_option("Circuit breaker: most of the fleet taken out of service per window.")
@click.option(
    "--max-per-leaf",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Circuit breaker: most nodes under one leaf switch (rail 0) per window; 0: no limit.",
)
@click.option(
    "--window",
    type=click.FloatRange(min=1),
    default=600.0,
    show_default=True,
    help="Circuit breaker window, seconds.",
)
@click.option(
    "--resume-action",
    "resume_actions",
    multiple=True,
    type=click.Choice(sorted(DRAIN_ACTIONS)),
    default=("quarantine",),
    show_default=True,
    help="Drain actions a passing health check may lift (repeat); the others are lifted by "
    "`gpuforge remediate` after re-validation.",
)
@click.option("--shadow", is_flag=True, help="Decide and record, but change nothing in Slurm.")
@click.option(
    "--auth",
    "auth_policy",
    type=click.Choice([*POLICIES, AUTH_OFF]),
    default="required",
    show_default=True,
    help="Records without a valid munge credential of the node's root: refused (401), or "
    "accepted and counted (optional, while munge is rolled out); off: the source address alone "
    "(no unmunge per record). With --via, unmunge runs there over SSH.",
)
@click.option("--auth-uid", type=click.IntRange(min=0), default=0, show_default=True,
              help="The uid whose munge credentials may speak for a node.")  # fmt: skip
@click.option("--munge-socket", type=click.Path(dir_okay=False, path_type=Path),
              help="munged's socket for unmunge (default: munge's own).")  # fmt: skip
@click.option(
    "--metrics-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=TEXTFILE_DIR,
    show_default=True,
    help="node_exporter's textfile directory for the controller's metrics.",
)
@click.option("--snapshot-days", type=click.FloatRange(min=1), default=30.0, show_default=True)
@click.option("--history-days", type=click.FloatRange(min=1), default=400.0, show_default=True)
@click.option("-v", "--verbose", is_flag=True, help="Log every request.")
def serve_cmd(  # noqa: PLR0917 - one parameter per CLI option
    cluster: str | None,
    inventory: Path | None,
    listen: str,
    via: str | None,
    state_dir: Path,
    max_fraction: float,
    max_per_leaf: int,
    window: float,
    resume_actions: tuple[str, ...],
    shadow: bool,
    auth_policy: str,
    auth_uid: int,
    munge_socket: Path | None,
    metrics_dir: Path,
    snapshot_days: float,
    history_days: float,
    verbose: bool,
) -> None:
    """Collect the nodes' health records, store them and act on their requests."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
    )
    ctx = cluster_context(cluster, inventory, state_dir)
    # One writer per history: refused (exit 2) before the history or the sequences are opened.
    held = claim_history(ctx.state.history_db, "gpuforge health serve")
    fleet = ctx.fleet
    host, port = parse_listen(listen)
    policy = DecisionPolicy(
        max_fraction=max_fraction,
        max_per_leaf=max_per_leaf or None,
        window_s=window,
        resume_actions=frozenset(resume_actions),
        shadow=shadow,
    )
    store = HistoryStore.open(ctx.state.history_db)
    admission = ctx.admission(slurm_client(via, ctx.path), "health")
    decider = Decider(admission, policy=policy, leaves=fleet.leaves, store=store)
    auth = None if auth_policy == AUTH_OFF else _authenticator(ctx, auth_policy, auth_uid, via,
                                                                  munge_socket)  # fmt: skip
    collector = Collector(
        fleet,
        store,
        decider,
        metrics_dir=metrics_dir,
        retention=Retention(snapshot_days=snapshot_days, history_days=history_days),
        auth=auth,
    )
    try:
        server = make_server(collector, host, port, held=held)
    except OSError as exc:
        raise InputError(f"--listen {listen}: {exc.strerror or exc}") from None
    collector.start()

    def stop(*_: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    click.echo(
        f"gpuforge collector for {fleet.name} ({len(fleet.nodes)} GPU nodes) on "
        f"http://{host}:{server.server_address[1]}/v1/records; history {store.path}"
        + ("; shadow mode" if shadow else "")
        + f"; munge credentials {auth_policy}",
        err=True,
    )
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        collector.stop()
        if auth is not None:
            auth.close()
        store.close()


@health.command("history")
@on_services_host()
@click.argument("node")
@cluster_option
@inventory_option
@state_option
@click.option("--since", help="Only since: a span (7d, 12h) or an ISO time. Default: all kept.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--counters", is_flag=True, help="Also the counter snapshots.")
@json_option
def history_cmd(  # noqa: PLR0917 - one parameter per CLI option
    node: str,
    cluster: str | None,
    inventory: Path | None,
    state_dir: Path,
    since: str | None,
    limit: int,
    counters: bool,
    as_json: bool,
) -> None:
    """Verdict changes and events of NODE, newest first: in the order the collector received
    them (its clock, first column), with the node's own time beside it where it differs.

    --cluster names the state's cluster; --inventory, a cluster directory (its cluster). Run on
    the services host when the cluster directory names one (docs/health.md).
    """
    start = parse_since(since, time.time()) if since else None
    name = cluster if inventory is None else cluster_context(cluster, inventory, state_dir).name
    with open_history(state_dir, name) as store:
        latest = store.latest_of(node)
        entries = store.node_history(node, since=start, limit=limit)
        snaps = store.counters(node, since=start) if counters else []
    if not latest and not entries:
        raise InputError(f"no history for {node} in {store.path}")
    if as_json:
        echo_json(
            {
                "node": node,
                "latest": {t: r.to_dict() for t, r in latest.items()},
                "history": [e.to_dict() for e in entries],
                "counters": [
                    {"at": iso(s.at), "verdict": s.verdict, "counters": dict(s.counters)}
                    for s in snaps
                ],
            }
        )
        return
    for tier, row in sorted(latest.items()):
        click.echo(
            f"{node} {tier}: {row.verdict} at {iso(row.at)} (node's clock), received "
            f"{iso(row.received)}"
            + (f" ({row.signature})" if row.signature else "")
            + (f" request {dict(row.request)}" if row.request else "")
        )
    for e in entries:
        received = e.received if e.received is not None else e.at
        # The node's own time where it differs from the arrival (what the controller did is
        # dated by the controller's clock: one time).
        own = f"  [node's clock {iso(e.at)}]" if iso(e.at) != iso(received) else ""
        if e.event is None:
            click.echo(
                f"{iso(received)}  {e.tier:<8} {e.previous or '-'} -> {e.verdict}"
                + (f"  {e.checks}" if e.checks else "")
                + own
            )
        else:
            ev = e.event
            what = " ".join(
                x
                for x in (
                    ev.check,
                    ev.action,
                    f"code={ev.code}" if ev.code is not None else "",
                    f"gpu={ev.gpu}" if ev.gpu is not None else "",
                )
                if x
            )
            click.echo(f"{iso(received)}  {ev.kind:<8} {what} {ev.detail}".rstrip() + own)
    for s in snaps:
        moved = {k: v for k, v in s.counters.items() if v}
        click.echo(f"{iso(s.at)}  counters {len(s.counters)} ({len(moved)} non-zero) {moved}")


@health.group("store")
def store_group() -> None:
    """The history store (history.db): check its integrity, rebuild a damaged one."""


def _store_path(cluster: str | None, inventory: Path | None, state_dir: Path) -> Path:
    name = cluster if inventory is None else cluster_context(cluster, inventory, state_dir).name
    return history_file(state_dir, name)


@store_group.command("check")
@on_services_host()
@cluster_option
@inventory_option
@state_option
@json_option
def store_check_cmd(
    cluster: str | None, inventory: Path | None, state_dir: Path, as_json: bool
) -> None:
    """Check history.db with SQLite's full integrity check; read-only.

    Exit 0 when sound, 2 when damaged (``FILE: damaged (...)``). Run on the services host when
    the cluster directory names one.
    """
    path = _store_path(cluster, inventory, state_dir)
    why = check_store(path)
    if as_json:
        echo_json({"file": str(path), "ok": why is None, "damaged": why})
    if why is not None:
        raise InputError(f"{path}: damaged ({why}); see `gpuforge health store repair`")
    if not as_json:
        click.echo(f"{path}: ok (integrity_check)")


@store_group.command("repair")
@on_services_host()
@cluster_option
@inventory_option
@state_option
@json_option
def store_repair_cmd(
    cluster: str | None, inventory: Path | None, state_dir: Path, as_json: bool
) -> None:
    """Rebuild a damaged history.db from every row that can be read, after a backup.

    Refused (exit 2) while a collector holds the history's lock: stop it first. A copy is kept
    as history.db.vN.bak; the rows kept and lost are reported per table. Exit 0 when the
    rebuilt file is sound (or the file needed nothing), 1 when it could not be rebuilt.
    """
    path = _store_path(cluster, inventory, state_dir)
    with claim_history(path, "gpuforge health store repair"):
        why = check_store(path)
        if why is None:
            if as_json:
                echo_json({"file": str(path), "repaired": False, "ok": True})
            else:
                click.echo(f"{path}: ok (integrity_check), nothing to repair")
            return
        salvage = repair_store(path)
    lost = "unknown" if salvage.lost is None else str(salvage.lost)
    if as_json:
        echo_json(
            {
                "file": str(path),
                "repaired": True,
                "was": why,
                "backup": str(salvage.backup),
                "kept": salvage.kept,
                "lost": salvage.lost,
                "tables": {
                    t.table: {"kept": t.kept, "lost": t.lost, "damaged": t.damaged}
                    for t in salvage.tables
                },
            }
        )
        return
    click.echo(f"{path}: was damaged ({why}); a copy is kept as {salvage.backup}")
    for t in salvage.tables:
        gone = "unknown" if t.lost is None else str(t.lost)
        click.echo(f"  {t.table}: kept {t.kept}, lost {gone}" + (" (damaged)" if t.damaged else ""))
    click.echo(f"{path}: rebuilt: kept {salvage.kept} rows, lost {lost}; integrity_check ok")
