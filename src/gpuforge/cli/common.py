"""What command modules share: the click options every command takes, JSON output, the spec.

One definition per option (``--inventory``, ``--cluster``/CLUSTER, ``--via``, ``--state-dir``,
``--json``, ``--here``); the cluster they select is built by :mod:`gpuforge.cli.context`.
:func:`on_services_host` is the one line a command that reads the services' history adds to run
on the cluster's services host (docs/health.md, "Where the tools run").
"""

from __future__ import annotations

import functools
import json
import os
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

import click
from click.core import ParameterSource

from gpuforge import services
from gpuforge.errors import InputError, Interrupted
from gpuforge.resources import project_path
from gpuforge.state_paths import STATE_DIR_ENV, default_state_dir

DEFAULT_SPEC = project_path("examples", "topologies", "lab.yaml")


def echo_json(data: Any) -> None:
    """Print ``data`` as stable, indented JSON."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


@contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C and SIGTERM end the run as "interrupted" (recorded), never half-written."""

    def on_term(_signum: int, _frame: object) -> None:
        raise Interrupted("interrupted by SIGTERM")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted("interrupted by SIGINT (Ctrl-C)") from None
    finally:
        signal.signal(signal.SIGTERM, previous)


json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")

state_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=default_state_dir,
    show_default=f"state/ or ${STATE_DIR_ENV}",
    help="Where the rollout and admission records (SQLite) and the lock live, per cluster.",
)

inventory_option = click.option(
    "-i",
    "--inventory",
    "inventory",
    type=click.Path(file_okay=False, path_type=Path),
    help="Cluster directory: generated/ and site/ (a lab's: .lab/<lab>/inventory); "
    "default inventory/CLUSTER.",
)

cluster_option = click.option(
    "--cluster",
    help="Cluster name: its directory is inventory/CLUSTER, its state <state-dir>/CLUSTER.",
)

cluster_argument = click.argument("cluster", required=False)

via_option = click.option(
    "--via",
    metavar="HOST|local",
    help="Where Slurm's commands run: 'local' on this machine, else HOST (a controller or "
    "login node) over SSH with the inventory's connection settings.",
)


def report_dir_option(
    help: str,
    *,
    default: Path | None = Path("reports"),
    dest: str = "report_dir",
) -> Callable[[_Command], _Command]:
    """``--report-dir``: the one definition, each command saying what goes there."""
    return click.option(
        "--report-dir",
        dest,
        type=click.Path(file_okay=False, path_type=Path),
        default=default,
        show_default=default is not None,
        help=help,
    )


def max_fraction_option(
    help: str = "Circuit breaker: most of the fleet drained per window.",
    *,
    default: float | None = 0.01,
) -> Callable[[_Command], _Command]:
    """``--max-fraction``: the circuit breaker's share of the fleet (or, in ``upgrade``, of a
    partition's GPUs) out of service at once."""
    return click.option(
        "--max-fraction",
        type=click.FloatRange(0, 1, min_open=True),
        default=default,
        show_default=default is not None,
        help=help,
    )


here_option = click.option(
    "--here",
    is_flag=True,
    help="Run on this machine with this machine's state, though the cluster directory names a "
    f"services host ({services.GROUP}) that holds the history.",
)

_Command = TypeVar("_Command", bound=Callable[..., Any])
#: What the services host's own values replace when a command runs there.
_LOCAL_OPTIONS = frozenset({"cluster", "inventory", "state_dir", "report_dir", "here"})


def on_services_host(
    *,
    when: Callable[[Mapping[str, Any]], bool] | None = None,
    local_files: Sequence[str] = (),
    timeout_s: Callable[[Mapping[str, Any]], float] | None = None,
) -> Callable[[_Command], _Command]:
    """Run the command on the cluster's services host, unless it is to run here (:func:`remote`).

    Adds ``--here``. ``when``: only for these parameters (``fleet risk``: ``--from-store``).
    ``local_files``: parameters that name a file on this machine, refused when the command
    would run there. ``timeout_s``: how long it may take there (default 10 minutes).
    """

    def decorate(command: _Command) -> _Command:
        @functools.wraps(command)
        def run(*args: Any, here: bool, **kwargs: Any) -> Any:
            ctx = click.get_current_context()
            host = None if here or (when and not when(ctx.params)) else remote(ctx)
            if host is not None:
                _refuse_local_files(ctx, local_files, host)
                limit = timeout_s(ctx.params) if timeout_s else services.DEFAULT_TIMEOUT_S
                services.run_there(host, remote_argv(ctx, host), timeout_s=limit)
            return command(*args, **kwargs)

        return cast("_Command", here_option(run))

    return decorate


def remote(ctx: click.Context) -> services.ServicesHost | None:
    """The services host a command with these options runs on; None: it runs here.

    It runs there when given a cluster directory (``--inventory``, or ``--cluster``/CLUSTER
    naming ``inventory/NAME``) whose inventory has a ``gpuforge_services`` host, this machine is
    not that host (``$GPUFORGE_SERVICES_HOST``), and no state directory was chosen: an explicit
    ``--state-dir`` or ``$GPUFORGE_STATE_DIR`` names this machine's state, so it runs here.
    """
    given_state = ctx.get_parameter_source("state_dir") is ParameterSource.COMMANDLINE
    if given_state or os.environ.get(STATE_DIR_ENV):
        return None
    # Here, not at the top: the context pulls in admission, the history and the fleet, which
    # the commands without a cluster directory (topology check, inventory generate) never use.
    from gpuforge.cli.context import given_root  # noqa: PLC0415

    root = given_root(ctx.params.get("cluster"), ctx.params.get("inventory"))
    return services.ServicesHost.elsewhere(root)


def remote_argv(ctx: click.Context, host: services.ServicesHost) -> list[str]:
    """The command as given, with the host's cluster directory, state and reports substituted.

    A command that reads Slurm (``--via``) reads it on the services host itself when told to
    read it there (``--via <that host>``), or not told where and that host is a controller.
    """
    path: list[str] = []
    at: click.Context | None = ctx
    while at is not None and at.parent is not None:
        path.insert(0, str(at.info_name))
        at = at.parent
    via = ctx.params.get("via")
    local_slurm = "via" in ctx.params and (
        via == host.hostname or (via is None and host.controller)
    )
    skip = _LOCAL_OPTIONS | {"via"} if local_slurm else _LOCAL_OPTIONS
    positional, options = given_args(ctx, skip)
    extra = ["--inventory", host.cluster_dir, "--state-dir", host.state_dir]
    if "report_dir" in ctx.params:
        extra += ["--report-dir", host.report_dir]
    if local_slurm:
        extra += ["--via", "local"]
    return [*path, *positional, *options, *extra]


def given_args(ctx: click.Context, skip: frozenset[str]) -> tuple[list[str], list[str]]:
    """The arguments and options given on the command line (not defaults), as argv words."""
    positional: list[str] = []
    options: list[str] = []
    for param in ctx.command.params:
        name = param.name
        if name is None or name in skip:
            continue
        if ctx.get_parameter_source(name) is not ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[name]
        values = list(value) if param.multiple or param.nargs != 1 else [value]
        if isinstance(param, click.Argument):
            positional += [str(v) for v in values]
        elif isinstance(param, click.Option):
            options += _option_words(param, values)
    return positional, options


def _option_words(param: click.Option, values: list[Any]) -> list[str]:
    flag = next((o for o in param.opts if o.startswith("--")), param.opts[0])
    if param.count:
        return [flag] * int(values[0])
    if param.is_flag:
        if param.is_bool_flag and not values[0]:
            return param.secondary_opts[:1]
        return [flag] if values[0] == param.flag_value or param.is_bool_flag else []
    return [word for v in values for word in (flag, str(v))]


def _refuse_local_files(
    ctx: click.Context, names: Sequence[str], host: services.ServicesHost
) -> None:
    for name in names:
        if ctx.params.get(name) is not None:
            option = next(p for p in ctx.command.params if p.name == name)
            raise InputError(
                f"{option.opts[-1]} names a file on this machine, but the history is on the "
                f"services host {host.hostname}: run the command there, or give --here with "
                "this machine's state"
            )
