"""RMA: the evidence bundle a vendor asks for, and the record of a part leaving and returning.

:func:`build_bundle` writes ``<node>-<UTC time>.tar.gz`` and, beside it, the same
``manifest.json`` that opens the archive (schema :data:`SCHEMA`):

* ``hardware``: the system's serial and product (``dmidecode``), the driver and CUDA versions,
  and per GPU its serial, UUID, VBIOS, board part number, InfoROM and GSP firmware versions
  (``nvidia-smi -q -x`` through :mod:`gpuforge.validate.parsers.nvidia_smi_xml`), and per HCA its
  firmware (``ibstat``);
* ``failing_check``: the check the node was drained for, with its raw output (the latest record,
  the failed re-validations, the latest validation reports);
* files: ``nvidia-smi-q-x.xml``, ``ibstat.txt``, ``dmidecode.txt``, ``failing-check.txt``,
  ``xid-history.json`` and ``counter-history.json`` (from the history store),
  ``events.json`` (drains, remediations, RMA steps), ``burnin.json`` and ``nccl.json`` (the last
  burn-in and NCCL results), each with its SHA-256 in the manifest.

Nothing else goes in: no inventory, no host variables, no environment. Every file is passed
through :func:`gpuforge.redact.scrub_file` as well (private keys, secret-named values, HTTP and URL
credentials, password arguments; JSON scrubbed as JSON, so it stays valid), so a secret that
reached a tool's output, a record or a report does not leave with the part.

:func:`mark_out` and :func:`mark_back` record the part leaving (with the ticket) and returning in
the history store; a returned node is drained ``gpuforge:join:validate``
(:data:`gpuforge.admission.JOIN_REASON`) through admission, so it goes through the same admission
tiers as a new node (``gpuforge deploy SPEC --phase N --only NODE --redo``, or ``gpuforge validate
--drain``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import re
import tarfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuforge.admission import JOIN_REASON, Admission, parse_reason
from gpuforge.atomic import atomic_open, write_atomic
from gpuforge.command import CommandResult, CommandRunner
from gpuforge.errors import InputError, OperationError
from gpuforge.health.remediate import EVENT_REMEDIATION, EVENT_RMA, SOURCE
from gpuforge.history import HistoryEvent, HistoryStore
from gpuforge.history.store import iso
from gpuforge.redact import scrub_file, scrub_text
from gpuforge.slurm import control
from gpuforge.slurm.control import NodeAction
from gpuforge.validate.parsers import ibstat, nvidia_smi_xml
from gpuforge.validate.parsers._common import ParseError
from gpuforge.validate.parsers.nvidia_smi_common import reported
from gpuforge.validate.result import CheckResult, NodeVerdict, Status, Verdict

SCHEMA = "gpuforge.rma/1"
#: Seconds each command on the node may take.
COMMAND_TIMEOUT = 60.0
#: Event kinds of the history store the bundle carries.
XID_KINDS = ("xid",)
EVENT_KINDS = ("drain", "resume", "failure", EVENT_REMEDIATION, EVENT_RMA)

_COMMANDS = {
    "nvidia-smi-q-x.xml": "nvidia-smi -q -x",
    "ibstat.txt": "ibstat",
    "dmidecode.txt": (
        "for k in system-manufacturer system-product-name system-serial-number "
        "baseboard-serial-number; do printf '%s: ' $k; dmidecode -s $k; done"
    ),
}


@dataclass(frozen=True)
class Bundle:
    """A written bundle: the archive, the manifest beside it, and the manifest itself."""

    archive: Path
    manifest_path: Path
    manifest: Mapping[str, Any]


@dataclass
class BundleInputs:
    """Where the evidence comes from."""

    runner: CommandRunner
    history: HistoryStore
    #: Directories searched (recursively) for ``validation.json`` reports, newest first wins.
    report_dirs: Sequence[Path] = ()
    clock: Callable[[], float] = time.time
    timeout: float = COMMAND_TIMEOUT
    errors: list[str] = field(default_factory=list)


def build_bundle(
    node: str, out_dir: Path, inputs: BundleInputs, *, check: str = "", why: str = ""
) -> Bundle:
    """Collect the evidence of ``node`` and write the archive and its manifest into ``out_dir``.

    ``check``: the failing check (default: the one in the node's latest RMA or drain event).
    A command that fails on the node is noted in the manifest's ``errors``: the bundle is still
    written with what could be collected.
    """
    now = inputs.clock()
    stamp = dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    files: dict[str, str] = {}
    for name, command in _COMMANDS.items():
        result = _run(inputs, node, command)
        files[name] = result.stdout if result.ok else result.evidence()
        if not result.ok:
            inputs.errors.append(f"{command}: {_why(result)}")
    history = inputs.history
    events = history.events(node=node, kinds=EVENT_KINDS)
    check = check or _check_from_events(events)
    reports = _reports(node, inputs.report_dirs, inputs.errors)
    files["failing-check.txt"] = _failing_output(node, check, history, events, reports)
    xids = history.events(node=node, kinds=XID_KINDS)
    files["xid-history.json"] = _json([e.to_dict() for e in xids])
    files["counter-history.json"] = _json(
        [
            {"at": iso(c.at), "tier": c.tier, "verdict": c.verdict, "counters": dict(c.counters)}
            for c in history.counters(node)
        ]
    )
    files["events.json"] = _json([e.to_dict() for e in events])
    files["burnin.json"] = _json(_latest_results(node, "burnin.", reports, events))
    files["nccl.json"] = _json(_latest_results(node, "nccl.", reports, events))
    clean = {name: scrub_file(name, text) for name, text in files.items()}
    manifest: dict[str, Any] = {
        "schema": SCHEMA,
        "node": node,
        "created": dt.datetime.fromtimestamp(now, dt.UTC).isoformat(timespec="seconds"),
        "check": check,
        "why": scrub_text(why),
        "hardware": hardware(
            node, files["nvidia-smi-q-x.xml"], files["ibstat.txt"], files["dmidecode.txt"]
        ),
        "failing_check": {"check": check, "file": "failing-check.txt"},
        "files": [
            {
                "name": name,
                "bytes": len(text.encode()),
                "sha256": hashlib.sha256(text.encode()).hexdigest(),
            }
            for name, text in sorted(clean.items())
        ],
        "errors": [scrub_text(e) for e in inputs.errors],
    }
    manifest_text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    base = f"{node}-{stamp}"
    archive = out_dir / f"{base}.tar.gz"
    manifest_path = out_dir / f"{base}.json"
    _write_tar(archive, base, {"manifest.json": manifest_text, **clean}, now)
    write_atomic(manifest_path, manifest_text, mode=None)
    return Bundle(archive, manifest_path, manifest)


def _run(inputs: BundleInputs, node: str, command: str) -> CommandResult:
    return inputs.runner.run(node, command, timeout=inputs.timeout)


def _why(result: CommandResult) -> str:
    if result.timed_out:
        return "timed out"
    if result.unreachable:
        return "node unreachable"
    return f"rc {result.rc}: {(result.stderr or result.stdout).strip()[-300:]}"


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"


def _write_tar(path: Path, base: str, files: Mapping[str, str], now: float) -> None:
    with (
        atomic_open(path, binary=True, mode=None) as raw,
        tarfile.open(fileobj=raw, mode="w:gz") as tar,
    ):
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{base}/{name}")
            info.size = len(data)
            info.mtime = int(now)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))


def hardware(node: str, smi_xml: str, ibstat_text: str, dmi_text: str) -> dict[str, Any]:
    """Serial numbers, UUIDs and firmware versions from the three tools' outputs."""
    out: dict[str, Any] = {"node": node, "system": _dmi(dmi_text), "gpus": [], "hcas": []}
    try:
        report = nvidia_smi_xml.parse(smi_xml)
    except ParseError as exc:
        out["nvidia_smi_error"] = str(exc)
    else:
        out["driver_version"] = report.driver_version
        out["cuda_version"] = report.cuda_version
        for gpu in report.gpus:
            f = gpu.fields
            out["gpus"].append(
                {
                    "index": gpu.minor_number,
                    "pci_bus_id": gpu.pci_bus_id,
                    "product_name": gpu.product_name,
                    "serial": gpu.serial,
                    "uuid": gpu.uuid,
                    "vbios_version": gpu.vbios_version,
                    "board_part_number": reported(f.get("board_part_number")),
                    "inforom": {
                        key: reported(f.get(f"inforom_version/{key}"))
                        for key in ("img_version", "oem_object", "ecc_object", "pwr_object")
                    },
                    "gsp_firmware_version": reported(f.get("gsp_firmware_version")),
                }
            )
    try:
        ib = ibstat.parse(ibstat_text)
    except ParseError as exc:
        out["ibstat_error"] = str(exc)
    else:
        out["hcas"] = [
            {
                "name": ca.name,
                "ca_type": ca.ca_type,
                "firmware_version": ca.firmware_version,
                "hardware_version": ca.hardware_version,
                "node_guid": ca.node_guid,
            }
            for ca in ib.cas
        ]
    return out


def _dmi(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(": ")
        if sep and re.fullmatch(r"[a-z-]+", key) and value.strip():
            out[key.replace("-", "_")] = value.strip()
    return out


def _check_from_events(events: Sequence[HistoryEvent]) -> str:
    """The check of the newest event that names one (a drain, a remediation, an escalation)."""
    for e in reversed(events):
        if e.check:
            return e.check
        reason = parse_reason(str((e.data or {}).get("reason") or ""))
        if reason is not None:
            return reason.check
    return ""


def _reports(
    node: str, dirs: Sequence[Path], errors: list[str]
) -> list[tuple[float, Path, dict[str, Any]]]:
    """Validation reports that judged ``node``, newest first: (mtime, path, node entry)."""
    found: list[tuple[float, Path, dict[str, Any]]] = []
    for root in dirs:
        if not root.is_dir():
            continue
        for path in root.rglob("validation.json"):
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                errors.append(f"{path}: unreadable report ({exc})")
                continue
            for entry in doc.get("nodes") or []:
                if isinstance(entry, dict) and entry.get("node") == node:
                    found.append((path.stat().st_mtime, path, entry))
    found.sort(key=lambda t: t[0], reverse=True)
    return found


def _latest_results(
    node: str,
    prefix: str,
    reports: Sequence[tuple[float, Path, dict[str, Any]]],
    events: Sequence[HistoryEvent],
) -> dict[str, Any]:
    """The newest results whose check starts with ``prefix``: a report or a re-validation."""
    candidates: list[tuple[float, str, list[dict[str, Any]]]] = []
    for mtime, path, entry in reports:
        rows = [r for r in entry.get("results") or [] if str(r.get("check", "")).startswith(prefix)]
        if rows:
            candidates.append((mtime, str(path), rows))
    for e in events:
        verdict = (e.data or {}).get("verdict") or {}
        rows = [
            r for r in verdict.get("results") or [] if str(r.get("check", "")).startswith(prefix)
        ]
        if rows:
            candidates.append((e.at, f"history: {e.kind} {iso(e.at)}: {e.detail}", rows))
    if not candidates:
        return {"node": node, "source": None, "results": []}
    at, source, rows = max(candidates, key=lambda t: t[0])
    return {
        "node": node,
        "source": source,
        "at": dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="seconds"),
        "results": rows,
    }


def _failing_output(
    node: str,
    check: str,
    history: HistoryStore,
    events: Sequence[HistoryEvent],
    reports: Sequence[tuple[float, Path, dict[str, Any]]],
) -> str:
    """Every raw output the store and the reports hold for the failing check (and failures)."""
    parts = [f"# {node}: raw output of the failing check {check or '(unknown)'}"]
    # The records that changed the node's verdict, newest first: the failing one is among them
    # (the store keeps every verdict change whole; latest() would read the whole fleet's rows).
    for record in list(reversed(history.changes(node)))[:20]:
        for c in record.get("checks") or []:
            if isinstance(c, Mapping) and (
                c.get("check") == check or (not check and c.get("status") == "fail")
            ):
                parts.append(_section(f"{record.get('tier')} record {record.get('started')}", c))
    for e in events:
        verdict = (e.data or {}).get("verdict") or {}
        for r in verdict.get("results") or []:
            if r.get("status") == "fail":
                parts.append(_section(f"re-validation {iso(e.at)}", r))
    for _mtime, path, entry in reports[:3]:
        for r in entry.get("results") or []:
            if r.get("status") == "fail" or r.get("check") == check:
                parts.append(_section(f"report {path}", r))
    if len(parts) == 1:
        parts.append("(no raw output of this check is stored)")
    return "\n\n".join(parts) + "\n"


def _section(title: str, result: Mapping[str, Any]) -> str:
    head = (
        f"## {title}: {result.get('check')} {result.get('status')}"
        f" measured={result.get('measured')!r} expected={result.get('expected')!r}"
    )
    body = str(result.get("evidence") or result.get("detail") or result.get("message") or "")
    return head + "\n" + body


# -- a part leaving and returning ----------------------------------------------------------------


def mark_out(admission: Admission, history: HistoryStore, node: str, ticket: str) -> str:
    """Record that ``node``'s part left under ``ticket``; the node must be drained."""
    if not ticket.strip():
        raise InputError("--ticket: give the RMA ticket (the vendor's case number)")
    (state,) = control.node_states(admission.slurm, [node], timeout=admission.timeout)
    if not state.drained:
        raise InputError(
            f"{node} is in service ({state.state_text}): drain it first "
            "(gpuforge remediate escalates, or gpuforge slurm drain)"
        )
    reason = parse_reason(state.reason)
    history.add_event(
        node,
        EVENT_RMA,
        at=admission.clock(),
        check=reason.check if reason else "",
        action="rma",
        source=SOURCE,
        detail=f"part out, ticket {ticket}",
        data={"step": "out", "ticket": ticket, "reason": state.reason},
    )
    return state.reason


def open_ticket(history: HistoryStore, node: str) -> str | None:
    """The ticket of ``node``'s part that left and has not come back, or None."""
    ticket: str | None = None
    for e in history.events(node=node, kinds=[EVENT_RMA]):
        data = e.data or {}
        if data.get("step") == "out":
            ticket = str(data.get("ticket") or "")
        elif data.get("step") == "back":
            ticket = None
    return ticket


def mark_back(admission: Admission, history: HistoryStore, node: str) -> NodeAction:
    """Record the part's return and drain ``node`` ``gpuforge:join:validate`` through admission.

    An operator's drain stays (admission never touches it); the event is recorded either way.
    """
    ticket = open_ticket(history, node)
    if ticket is None:
        raise OperationError(f"{node}: no RMA recorded out (gpuforge rma out {node} --ticket T)")
    reason = parse_reason(JOIN_REASON)
    if reason is None:
        raise OperationError(f"admission.JOIN_REASON {JOIN_REASON!r} is not a gpuforge reason")
    result = CheckResult(
        node=node,
        check=reason.check,
        status=Status.FAIL,
        message=f"part back from RMA {ticket}: not validated yet",
        action=reason.action,
    )
    verdict = NodeVerdict(node, Verdict.QUARANTINE, (reason.check,), (), (result,))
    (action,) = admission.admit([verdict], actions={node: reason.action})
    history.add_event(
        node,
        EVENT_RMA,
        at=admission.clock(),
        check=reason.check,
        action=reason.action,
        source=SOURCE,
        detail=f"part back, ticket {ticket}: {action.action} {action.reason or action.detail}",
        data={"step": "back", "ticket": ticket, "reason": action.reason},
    )
    return action
