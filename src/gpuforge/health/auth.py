"""Who may speak for a node: the munge credential a record carries (docs/health.md,
"Authentication").

The node checker, as root, sends each record with a munge credential (header
:data:`~gpuforge.node.output.MUNGE_HEADER`) whose payload is ``{"v": 1, "node": ..., "sha256":
..., "seq": ...}``: the node, the sha256 of the exact body and the node's sequence number. The
collector decodes it with ``unmunge`` (here, or on ``--via HOST`` over SSH where the collector's
machine runs no munged with the cluster's key, as in the lab) and accepts the record only when

* munged says the credential is valid: the cluster's key, not expired (its time-to-live, 300 s by
  default), not replayed (munged's replay cache);
* it was encoded by uid 0 (or the configured uid): a user's job cannot encode one;
* it was encoded on the node's management address (munge's ``ENCODE_HOST``);
* its payload names the node and the body's digest;
* its sequence is above the last one accepted from that node (kept in a file, so a restart of
  the collector or of munged does not reopen a replay inside the time-to-live).

The source-address check of the collector stays in front of this one: both must hold.
Policy ``required`` refuses anything else with ``401`` (the node keeps the record and sends it
again with a new credential); ``optional`` accepts it and counts why (rolling munge out).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import shlex
import subprocess
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from gpuforge.command import CommandRunner
from gpuforge.node.output import MUNGE_HEADER, MUNGE_PAYLOAD_VERSION
from gpuforge.node.state import write_atomic

log = logging.getLogger(__name__)

POLICIES = ("required", "optional")
#: Seconds one ``unmunge`` may take (milliseconds locally; an SSH round trip in the lab).
UNMUNGE_TIMEOUT_S = 5.0
#: The name of the per-node sequence file under the collector's state directory.
SEQUENCE_FILE = "munge-sequence.log"
#: munge's error numbers (``munge.h``) that unmunge reports as ``STATUS:``.
MUNGE_ERRORS = {
    1: "internal error (EMUNGE_SNAFU)",
    2: "invalid argument (EMUNGE_BAD_ARG)",
    3: "too long (EMUNGE_BAD_LENGTH)",
    6: "munged not reachable (EMUNGE_SOCKET)",
    8: "not a credential (EMUNGE_BAD_CRED)",
    9: "unknown credential version (EMUNGE_BAD_VERSION)",
    10: "unknown cipher (EMUNGE_BAD_CIPHER)",
    11: "unknown MAC (EMUNGE_BAD_MAC)",
    12: "unknown compression (EMUNGE_BAD_ZIP)",
    13: "unknown security realm (EMUNGE_BAD_REALM)",
    14: "invalid: not the cluster's key (EMUNGE_CRED_INVALID)",
    15: "expired (EMUNGE_CRED_EXPIRED)",
    16: "encoded in the future: clocks differ (EMUNGE_CRED_REWOUND)",
    17: "replayed (EMUNGE_CRED_REPLAYED)",
    18: "not for this decoder (EMUNGE_CRED_UNAUTHORIZED)",
}
#: Errors of the decoding side, not of the credential: the node sends the record again later.
DECODER_ERRORS = frozenset({1, 5, 6, 7})
_CREDENTIAL = re.compile(r"MUNGE:[A-Za-z0-9+/=]{1,8192}:")
_META = re.compile(r"^([A-Z_]+):\s*(.*)$")


@dataclass(frozen=True, slots=True)
class Decoded:
    """What ``unmunge --numeric`` said about one credential."""

    status: int
    uid: int | None
    gid: int | None
    encode_host: str
    encode_time: int | None
    ttl: int | None
    payload: bytes


class DecodeError(Exception):
    """``unmunge`` gave no answer (not installed, munged down, timed out)."""


def parse_unmunge(stdout: bytes) -> Decoded:
    """``unmunge --numeric``'s output: ``KEY: value`` metadata lines, a blank line, the payload.

    Raises ValueError when the output has no ``STATUS:`` line.
    """
    head, sep, payload = stdout.partition(b"\n\n")
    meta: dict[str, str] = {}
    for line in head.decode("ascii", "replace").splitlines():
        m = _META.match(line)
        if m:
            meta[m.group(1)] = m.group(2).strip()
    if "STATUS" not in meta:
        raise ValueError("no STATUS line")

    def number(key: str) -> int | None:
        value = meta.get(key, "")
        return int(value) if value.isdigit() else None

    status = number("STATUS")
    if status is None:
        raise ValueError(f"STATUS {meta['STATUS']!r} is not a number")
    return Decoded(
        status=status,
        uid=number("UID"),
        gid=number("GID"),
        encode_host=meta.get("ENCODE_HOST", ""),
        encode_time=number("ENCODE_TIME"),
        ttl=number("TTL"),
        payload=payload if sep else b"",
    )


@dataclass(frozen=True)
class Unmunge:
    """Decodes credentials with ``unmunge``, the credential on its stdin: here as a direct
    subprocess (``runner`` None: no shell, the cheapest), or through a command runner (SSH to a
    host that runs munged with the cluster's key, as in the lab)."""

    runner: CommandRunner | None = None
    host: str = "localhost"
    socket: Path | None = None
    timeout_s: float = UNMUNGE_TIMEOUT_S

    def decode(self, credential: str) -> Decoded:
        """Decode ``credential`` (already matched against munge's armour).

        Raises :class:`DecodeError` when unmunge gave no answer.
        """
        argv = ["unmunge", "--numeric"]
        if self.socket is not None:
            argv += ["--socket", str(self.socket)]
        if self.runner is None:
            rc, stdout, stderr = self._here(argv, credential)
        else:
            line = f"printf '%s\\n' {shlex.quote(credential)} | {shlex.join(argv)}"
            result = self.runner.run(self.host, line, timeout=self.timeout_s)
            if result.timed_out:
                raise DecodeError(f"unmunge timed out after {self.timeout_s:g} s on {self.host}")
            rc, stdout, stderr = result.rc, result.stdout.encode(), result.stderr
        try:
            return parse_unmunge(stdout)
        except ValueError:
            why = (stderr.strip().splitlines() or [f"rc={rc}"])[-1][:200]
            # unmunge exits with munge's error number: one of the credential's (a bad
            # armour, a bad version) is the credential's fault, anything else the decoder's.
            if rc is not None and rc in MUNGE_ERRORS and rc not in DECODER_ERRORS:
                return Decoded(rc, None, None, "", None, None, b"")
            raise DecodeError(f"unmunge on {self.host}: {why}") from None

    def _here(self, argv: list[str], credential: str) -> tuple[int | None, bytes, str]:
        try:
            done = subprocess.run(
                argv,
                input=credential.encode() + b"\n",
                capture_output=True,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise DecodeError(f"unmunge timed out after {self.timeout_s:g} s") from None
        except OSError as exc:
            raise DecodeError(f"unmunge: {exc.strerror or exc}") from None
        return done.returncode, done.stdout, done.stderr.decode(errors="replace")


@dataclass(frozen=True, slots=True)
class Authentication:
    """One record's authentication: ``status`` 200 (go on), 401 or 503 with ``error``.

    ``sent``: when the node encoded the credential, on the node's clock (munge's
    ``ENCODE_TIME``; the node encodes it as it sends the record, a spooled one too), for an
    authenticated record: with the record's ``started`` (the same clock) it gives the record's
    age whatever the node's clock is off by (the collector's stale-request rule).
    """

    status: int
    error: str = ""
    sequence: int | None = None
    authenticated: bool = False
    sent: float | None = None

    @property
    def ok(self) -> bool:
        """The collector goes on with the record."""
        return self.status == HTTPStatus.OK


class Sequences:
    """The last sequence accepted per node, in memory and in an append-only file.

    One ``NODE SEQ`` line per accepted record (no fsync: a collector killed keeps what the kernel
    has); read back at start, the highest per node wins, and rewritten compactly (temporary file
    and rename) at start and when the file holds ten lines per node.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.last: dict[str, int] = {}
        self._lines = 0
        self._fh: Any = None
        if path is not None:
            self._load(path)
            self._compact()

    def _load(self, path: Path) -> None:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return
        for line in text.splitlines():
            node, _, seq = line.partition(" ")
            if node and seq.isdigit() and len(seq) <= 20:
                self.last[node] = max(self.last.get(node, 0), int(seq))

    def _compact(self) -> None:
        assert self.path is not None  # noqa: S101 - only with a file
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        text = "".join(f"{n} {s}\n" for n, s in sorted(self.last.items()))
        write_atomic(self.path, text, mode=0o600)
        self._lines = len(self.last)
        self._fh = self.path.open("a", encoding="utf-8", buffering=1)

    def accept(self, node: str, seq: int) -> int | None:
        """Record ``seq`` for ``node`` when it is above the last one; else that last one."""
        last = self.last.get(node, 0)
        if seq <= last:
            return last
        self.last[node] = seq
        if self._fh is not None:
            try:
                self._fh.write(f"{node} {seq}\n")
                self._lines += 1
                if self._lines > 10 * max(len(self.last), 100):
                    self._compact()
            except OSError as exc:  # a full disk: munged's replay cache still holds
                log.warning("%s: sequence not saved: %s", self.path, exc.strerror or exc)
        return None

    def close(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None


class Authenticator:
    """Checks the munge credential of records; thread-safe (unmunge runs outside the lock)."""

    def __init__(
        self,
        policy: str = "required",
        *,
        uid: int = 0,
        unmunge: Unmunge | None = None,
        sequence_path: Path | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"auth policy {policy!r}: one of {', '.join(POLICIES)}")
        self.policy = policy
        self.uid = uid
        self.unmunge = unmunge or Unmunge()
        self._lock = threading.Lock()
        self.sequences = Sequences(sequence_path)
        #: Records accepted with a valid credential.
        self.authenticated = 0
        #: Why records were not authenticated (refused under ``required``, let in under
        #: ``optional``), by reason class.
        self.failures: Counter[str] = Counter()

    def close(self) -> None:
        """Close the sequence file."""
        self.sequences.close()

    def stats(self) -> dict[str, Any]:
        """Counts for the collector's health answer and metrics."""
        with self._lock:
            return {
                "policy": self.policy,
                "authenticated": self.authenticated,
                "not_authenticated": dict(sorted(self.failures.items())),
            }

    def check(self, node: str, address: str, body: bytes, credential: str | None) -> Authentication:
        """Authenticate a record for ``node`` (management ``address``) whose exact body is
        ``body``, sent with ``credential`` (the header's value, None when absent)."""
        verdict = self._check(node, address, body, credential)
        if verdict.ok:
            if verdict.authenticated:
                with self._lock:
                    self.authenticated += 1
            return verdict
        kind = verdict.error.partition(":")[0]
        with self._lock:
            self.failures[kind] += 1
        if verdict.status == HTTPStatus.SERVICE_UNAVAILABLE:
            log.error("%s: record not authenticated: %s", node, verdict.error)
        elif self.policy == "optional":
            log.debug("%s: accepted without authentication: %s", node, verdict.error)
        else:
            log.warning("%s: refused a record: %s", node, verdict.error)
        if self.policy == "optional":
            return Authentication(HTTPStatus.OK, verdict.error, verdict.sequence)
        return verdict

    def _check(
        self, node: str, address: str, body: bytes, credential: str | None
    ) -> Authentication:
        try:
            cred = self._decode(credential)
            seq = self._judge(cred, node, address, body)
        except _RefusedError as exc:
            return Authentication(exc.status, exc.error)
        with self._lock:
            last = self.sequences.accept(node, seq)
        if last is not None:
            return Authentication(
                HTTPStatus.UNAUTHORIZED,
                f"old sequence: {seq} is not above {last}, the last accepted (a replay)",
            )
        sent = float(cred.encode_time) if cred.encode_time is not None else None
        return Authentication(HTTPStatus.OK, sequence=seq, authenticated=True, sent=sent)

    def _decode(self, credential: str | None) -> Decoded:
        if not credential:
            raise _RefusedError(f"no credential: the record has no {MUNGE_HEADER} header")
        credential = credential.strip()
        if not _CREDENTIAL.fullmatch(credential):
            raise _RefusedError("malformed credential: not munge's MUNGE:...: armour")
        try:
            cred = self.unmunge.decode(credential)
        except DecodeError as exc:
            raise _RefusedError(f"decoder: {exc}", HTTPStatus.SERVICE_UNAVAILABLE) from None
        why = MUNGE_ERRORS.get(cred.status, f"munge error {cred.status}")
        if cred.status in DECODER_ERRORS:
            raise _RefusedError(f"decoder: {why}", HTTPStatus.SERVICE_UNAVAILABLE)
        if cred.status != 0:
            name = {15: "expired", 16: "rewound", 17: "replayed"}.get(cred.status, "invalid")
            raise _RefusedError(f"{name} credential: {why}")
        return cred

    def _judge(self, cred: Decoded, node: str, address: str, body: bytes) -> int:
        """The credential's sequence when it vouches for this body from this node's root."""
        if cred.uid != self.uid:
            raise _RefusedError(
                f"wrong uid: the credential is uid {cred.uid}'s, records are uid {self.uid}'s"
            )
        if cred.encode_host != address:
            raise _RefusedError(
                f"wrong origin: the credential was encoded on {cred.encode_host or '?'}, "
                f"not on {node}'s management address {address} (munged --origin on the node)"
            )
        payload = _payload(cred.payload)
        if payload is None:
            raise _RefusedError("bad payload: not a gpuforge record credential")
        if payload.get("node") != node:
            raise _RefusedError(f"wrong node: the credential speaks for {payload.get('node')!r}")
        if payload.get("sha256") != hashlib.sha256(body).hexdigest():
            raise _RefusedError("wrong digest: the credential is for another body")
        return int(payload["seq"])


class _RefusedError(Exception):
    def __init__(self, error: str, status: int = HTTPStatus.UNAUTHORIZED) -> None:
        super().__init__(error)
        self.error = error
        self.status = status


def _payload(raw: bytes) -> Mapping[str, Any] | None:
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("v") != MUNGE_PAYLOAD_VERSION:
        return None
    seq = doc.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 < seq < 1 << 63:
        return None
    return doc
