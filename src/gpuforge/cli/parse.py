"""``gpuforge parse KIND FILE``: read a GPU/IB tool's saved output and print the typed result."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from gpuforge.cli.common import echo_json, json_option
from gpuforge.errors import InputError
from gpuforge.validate.parsers import PARSERS, ParseError, nvidia_smi_csv, to_jsonable

_WIDE = 16  # elements with more columns than this print as key: value blocks, not a table
# A 48 MB kernel log holds 500,000 Xid lines: text output shows the first rows and the counts;
# --json carries everything.
MAX_ROWS = 50
MAX_MESSAGES = 50
_RAW_FIELDS = ("fields", "values", "unavailable", "params")  # too big for a table cell
# Derived values (properties) worth a line in the text output.
_SUMMARIES = (
    "passed",
    "failed",
    "gpu_count",
    "max_busbw_gbps",
    "max_bw_average_gbps",
    "xid_counts",
)


def _read(file: str) -> tuple[str, str]:
    if file == "-":
        return "<stdin>", sys.stdin.read()
    path = Path(file)
    try:
        return file, path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{file}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{file}: not UTF-8 text (byte {exc.start})") from None


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (tuple, list)):
        return ", ".join(_cell(v) for v in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_cell(v)}" for k, v in value.items()) or "-"
    return str(value)


def _is_records(value: Any) -> bool:
    return (
        isinstance(value, tuple)
        and bool(value)
        and all(dataclasses.is_dataclass(v) and not isinstance(v, type) for v in value)
    )


def _flatten(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Scalar columns of one record; nested records become ``outer.inner`` columns."""
    out: list[tuple[str, Any]] = []
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        name = f"{prefix}{field.name}"
        if field.name in _RAW_FIELDS:
            continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.extend(_flatten(value, f"{name}."))
        elif not _is_records(value):
            out.append((name, value))
    return out


def _rows(obj: Any) -> list[list[tuple[str, Any]]]:
    """One row per record, or per nested record (a CA's ports) with the parent's columns."""
    own = _flatten(obj)
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if _is_records(value):
            return [own + [(f"{field.name}.{k}", v) for k, v in _flatten(child)] for child in value]
    return [own]


def _echo_scalars(result: Any) -> list[tuple[str, tuple[Any, ...]]]:
    """Print the top-level values and derived summaries; return the record lists for tables."""
    lists: list[tuple[str, tuple[Any, ...]]] = []
    for field in dataclasses.fields(result):
        value = getattr(result, field.name)
        if _is_records(value):
            lists.append((field.name, value))
        elif field.name not in ("warnings", "errors", *_RAW_FIELDS):
            click.echo(f"{field.name}: {_cell(value)}")
    for name in _SUMMARIES:
        if hasattr(result, name):
            value = getattr(result, name)
            if _is_records(value):
                value = tuple(getattr(v, "name", v) for v in value)
            click.echo(f"{name}: {_cell(value)}")
    return lists


def _render(kind: str, source: str, result: Any) -> None:
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    click.echo(f"{kind}: {source}")
    for name, records in _echo_scalars(result):
        rows = [row for record in records[:MAX_ROWS] for row in _rows(record)][:MAX_ROWS]
        columns = [column for column, _ in rows[0]]
        shown = "" if len(records) <= MAX_ROWS else f", the first {MAX_ROWS} shown; --json for all"
        click.echo(f"\n{name} ({len(records)}{shown}):")
        if len(columns) > _WIDE:
            for row in rows:
                click.echo("  " + "  ".join(f"{k}={_cell(v)}" for k, v in row if v is not None))
            continue
        table = Table(*columns, show_lines=False)
        for row in rows:
            table.add_row(*(_cell(v) for _, v in row))
        console.print(table)
    for name in ("errors", "warnings"):
        messages = getattr(result, name, ())
        if messages:
            click.echo(f"\n{name}:")
            for message in messages[:MAX_MESSAGES]:
                click.echo(f"  - {message}")
            if len(messages) > MAX_MESSAGES:
                click.echo(f"  ... and {len(messages) - MAX_MESSAGES} more (--json for all)")


@click.command("parse")
@click.argument("kind", type=click.Choice(sorted(PARSERS)))
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--fields",
    help="nvidia-smi-csv without a header row: the --query-gpu field list, comma-separated.",
)
@json_option
def parse(kind: str, file: str, fields: str | None, as_json: bool) -> None:
    """Parse FILE (or - for stdin) as the output of the tool KIND and print the typed result.

    Exits 2 naming the line that broke the parser when FILE is not such output.
    """
    source, text = _read(file)
    try:
        if kind == "nvidia-smi-csv" and fields:
            result = nvidia_smi_csv.parse(text, fields=fields.split(","))
        else:
            if fields:
                raise click.UsageError("--fields applies to nvidia-smi-csv only")
            result = PARSERS[kind](text)
    except ParseError as exc:
        raise InputError(f"{source}: cannot read as {kind}: {exc}") from None
    if as_json:
        echo_json(to_jsonable(result))
        return
    _render(kind, source, result)
    sys.stdout.flush()
