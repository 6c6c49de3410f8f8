"""Records authenticated with munge, against a real munged: forged records refused, good taken.

munged runs as the test's user with its own key, socket, pid, log and seed files; the socket's
directory is world-traversable (munged insists, and the non-root encoder must reach it). A
machine without munge fails these tests with the reason: ``make setup`` installs it.
"""

from __future__ import annotations

import fcntl
import http.client
import json
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

import pytest

from gpuforge.command import LocalRunner
from gpuforge.health.auth import Authenticator, Sequences, Unmunge, parse_unmunge
from gpuforge.health.collector import Collector, make_server
from gpuforge.health.decide import DecisionPolicy
from gpuforge.health.fleet import Fleet
from gpuforge.node import config as cfg
from gpuforge.node import output

from ..history.records import T0, record
from .conftest import MakeDecider

LOCAL = "127.0.0.1"
NOBODY = 65534


@dataclass(frozen=True)
class Munged:
    """A running munged: its socket, and encoding with it."""

    socket: Path

    def encode(self, payload: str, *, as_uid: int | None = None, ttl: int | None = None) -> str:
        argv = ["munge", "--socket", str(self.socket), "--string", payload]
        if ttl is not None:
            argv += ["--ttl", str(ttl)]
        if as_uid is not None:
            argv = ["setpriv", f"--reuid={as_uid}", f"--regid={as_uid}", "--clear-groups", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def unmunge(self) -> Unmunge:
        return Unmunge(socket=self.socket)


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is not installed: install Debian's munge package (make setup)")
    return path


@pytest.fixture(scope="module")
def munged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Munged]:
    for tool in ("munged", "mungekey", "munge", "unmunge", "setpriv"):
        _need(tool)
    files = tmp_path_factory.mktemp("munged")
    # The socket's directory and every one above it must be traversable by all (munged checks
    # it; the non-root encoder needs it): pytest's own tmp root is 0700, so a directory of /tmp.
    run_dir = Path(tempfile.mkdtemp(prefix="gpuforge-munge-"))
    run_dir.chmod(0o755)
    key = files / "munge.key"
    made = subprocess.run(
        ["mungekey", "--create", f"--keyfile={key}", "--bits=1024"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if made.returncode != 0:
        pytest.fail(f"mungekey could not create a key: {made.stderr.strip()}")
    socket = run_dir / "munge.socket"
    argv = [
        "munged", f"--socket={socket}", f"--key-file={key}", f"--pid-file={files / 'munged.pid'}",
        f"--log-file={files / 'munged.log'}", f"--seed-file={files / 'munged.seed'}",
        f"--origin={LOCAL}", "--force",
    ]  # fmt: skip
    started = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if started.returncode != 0:
        log = (files / "munged.log").read_text() if (files / "munged.log").exists() else ""
        pytest.fail(f"munged did not start: {started.stderr.strip()} {log[-500:]}")
    try:
        yield Munged(socket)
    finally:
        subprocess.run(
            ["munged", f"--socket={socket}", "--stop"], capture_output=True, timeout=30, check=False
        )
        shutil.rmtree(run_dir, ignore_errors=True)


def body_of(node: str = "gpu01", **kw: object) -> bytes:
    return json.dumps(record(node, **kw)).encode()  # type: ignore[arg-type]


def auth(munged: Munged, policy: str = "required", path: Path | None = None) -> Authenticator:
    return Authenticator(policy, unmunge=munged.unmunge(), sequence_path=path)


def test_a_root_credential_for_the_body_is_accepted(munged: Munged) -> None:
    body = body_of()
    cred = munged.encode(output.munge_payload("gpu01", body, 7))
    verdict = auth(munged).check("gpu01", LOCAL, body, cred)
    assert verdict.ok and verdict.authenticated and verdict.sequence == 7


def test_no_credential_is_refused_when_required_and_counted_when_optional(munged: Munged) -> None:
    required = auth(munged).check("gpu01", LOCAL, body_of(), None)
    assert required.status == HTTPStatus.UNAUTHORIZED
    assert "no credential" in required.error
    optional = auth(munged, "optional")
    verdict = optional.check("gpu01", LOCAL, body_of(), None)
    assert verdict.ok and not verdict.authenticated
    assert optional.stats()["not_authenticated"] == {"no credential": 1}


def test_a_credential_of_a_non_root_user_is_refused(munged: Munged) -> None:
    # What a user's job on the node can make: munge encodes its real uid, not root's.
    body = body_of()
    cred = munged.encode(output.munge_payload("gpu01", body, 8), as_uid=NOBODY)
    verdict = auth(munged).check("gpu01", LOCAL, body, cred)
    assert verdict.status == HTTPStatus.UNAUTHORIZED
    assert f"uid {NOBODY}" in verdict.error


def test_a_credential_for_another_body_is_refused(munged: Munged) -> None:
    cred = munged.encode(output.munge_payload("gpu01", body_of(verdict="pass"), 9))
    verdict = auth(munged).check("gpu01", LOCAL, body_of(verdict="fail"), cred)
    assert verdict.status == HTTPStatus.UNAUTHORIZED
    assert "another body" in verdict.error


def test_a_credential_for_another_node_or_origin_is_refused(munged: Munged) -> None:
    body = body_of("gpu02")
    other_node = munged.encode(output.munge_payload("gpu01", body, 10))
    refused = auth(munged).check("gpu02", LOCAL, body, other_node)
    assert refused.status == HTTPStatus.UNAUTHORIZED and "gpu01" in refused.error
    cred = munged.encode(output.munge_payload("gpu02", body, 11))
    elsewhere = auth(munged).check("gpu02", "10.231.0.12", body, cred)
    assert elsewhere.status == HTTPStatus.UNAUTHORIZED
    assert "encoded on 127.0.0.1" in elsewhere.error


def test_a_replayed_credential_is_refused(munged: Munged) -> None:
    body = body_of()
    cred = munged.encode(output.munge_payload("gpu01", body, 12))
    first = auth(munged).check("gpu01", LOCAL, body, cred)
    # A fresh Authenticator (a restarted collector): munged's replay cache still refuses it.
    again = auth(munged).check("gpu01", LOCAL, body, cred)
    assert first.ok
    assert again.status == HTTPStatus.UNAUTHORIZED
    assert "replayed" in again.error


def test_an_older_sequence_is_refused_across_a_restart(munged: Munged, tmp_path: Path) -> None:
    path = tmp_path / "lab" / "munge-sequence.log"
    body = body_of()
    new = munged.encode(output.munge_payload("gpu01", body, 1000))
    old = munged.encode(output.munge_payload("gpu01", body, 999))
    same = munged.encode(output.munge_payload("gpu01", body, 1000))
    first = auth(munged, path=path)
    assert first.check("gpu01", LOCAL, body, new).ok
    first.close()
    # Each is a new credential (munged has not seen it): only the sequence can refuse them.
    restarted = auth(munged, path=path)
    for cred in (old, same):
        verdict = restarted.check("gpu01", LOCAL, body, cred)
        assert verdict.status == HTTPStatus.UNAUTHORIZED
        assert "not above 1000" in verdict.error
    restarted.close()


def test_an_expired_credential_is_refused(munged: Munged) -> None:
    body = body_of()
    cred = munged.encode(output.munge_payload("gpu01", body, 13), ttl=1)
    time.sleep(2.1)
    verdict = auth(munged).check("gpu01", LOCAL, body, cred)
    assert verdict.status == HTTPStatus.UNAUTHORIZED
    assert "expired" in verdict.error


def test_garbage_and_a_dead_munged(munged: Munged, tmp_path: Path) -> None:
    garbage = auth(munged).check("gpu01", LOCAL, body_of(), "MUNGE:AAAA:")
    assert garbage.status == HTTPStatus.UNAUTHORIZED
    malformed = auth(munged).check("gpu01", LOCAL, body_of(), "pass; rm -rf /")
    assert malformed.status == HTTPStatus.UNAUTHORIZED and "malformed" in malformed.error
    # The collector's munged is down: not the record's fault, so the node keeps it (503).
    cred = munged.encode(output.munge_payload("gpu01", body_of(), 14))
    dead = Authenticator(unmunge=Unmunge(socket=tmp_path / "none.socket"))
    verdict = dead.check("gpu01", LOCAL, body_of(), cred)
    assert verdict.status == HTTPStatus.SERVICE_UNAVAILABLE, verdict.error


def test_unmunge_through_a_command_runner(munged: Munged) -> None:
    # How --via decodes on the controller over SSH (the lab): a shell line on that host.
    body = body_of()
    cred = munged.encode(output.munge_payload("gpu01", body, 15))
    remote = Unmunge(LocalRunner(), "ctl01", munged.socket)
    verdict = Authenticator(unmunge=remote).check("gpu01", LOCAL, body, cred)
    assert verdict.ok and verdict.sequence == 15
    nobody = munged.encode(output.munge_payload("gpu01", body, 16), as_uid=NOBODY)
    assert "wrong uid" in Authenticator(unmunge=remote).check("gpu01", LOCAL, body, nobody).error


def test_parse_unmunge_reads_the_metadata() -> None:
    out = (
        b"STATUS:          0\nENCODE_HOST:     10.231.0.11\nENCODE_TIME:     1796174257\n"
        b'TTL:             300\nUID:             0\nGID:             0\n\n{"v":1}'
    )
    got = parse_unmunge(out)
    assert (got.status, got.uid, got.gid, got.encode_host, got.ttl) == (0, 0, 0, "10.231.0.11", 300)
    assert got.encode_time == 1796174257 and got.payload == b'{"v":1}'
    with pytest.raises(ValueError, match="STATUS"):
        parse_unmunge(b"unmunge: Error: Failed to match armor prefix\n")


def test_sequences_file_keeps_the_highest_and_compacts(tmp_path: Path) -> None:
    path = tmp_path / "seq.log"
    path.write_text("gpu01 5\ngpu01 9\ngpu02 3\nbad line\ngpu01 7\n")
    seqs = Sequences(path)
    assert seqs.last == {"gpu01": 9, "gpu02": 3}
    assert path.read_text() == "gpu01 9\ngpu02 3\n"
    assert seqs.accept("gpu01", 9) == 9
    assert seqs.accept("gpu01", 10) is None
    seqs.close()
    again = Sequences(path)
    assert again.last["gpu01"] == 10
    again.close()


# --- node and collector over HTTP -----------------------------------------------------------------


@pytest.fixture
def served(
    make_decider: MakeDecider, munged: Munged, tmp_path: Path
) -> Iterator[tuple[str, Collector]]:
    leaves = {"gpu01": "leaf-a"}
    decider, _, store = make_decider(leaves, DecisionPolicy(max_fraction=1.0))
    fleet = Fleet("lab", ("gpu01",), {"gpu01": LOCAL}, leaves, {})
    authenticator = auth(munged, path=tmp_path / "lab" / "munge-sequence.log")
    collector = Collector(fleet, store, decider, clock=lambda: T0, auth=authenticator)
    collector.start()
    server = make_server(collector, LOCAL, 0)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://{LOCAL}:{server.server_address[1]}", collector
    server.shutdown()
    server.server_close()
    collector.stop()
    authenticator.close()


def node_config(url: str, state_dir: Path) -> cfg.HealthConfig:
    text = f"version: 1\nnode: gpu01\nstate_dir: {state_dir}\ncollector: {{url: '{url}'}}\n"
    return cfg.parse(text)


def _spool(config: cfg.HealthConfig, body: bytes, name: str) -> None:
    folder = output.spool_dir(config)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}-passive.json").write_bytes(body)


def test_the_node_sends_authenticated_records(
    served: tuple[str, Collector], munged: Munged, tmp_path: Path
) -> None:
    url, collector = served
    config = node_config(url, tmp_path / "node")
    _spool(config, body_of(), "00000000000000000001")
    _spool(config, body_of(at=T0 + 60), "00000000000000000002")
    delivery = output.deliver(config, deadline=time.monotonic() + 10, munge_socket=munged.socket)
    assert (delivery.sent, delivery.error, delivery.unsigned) == (2, "", "")
    assert output.spooled(config) == []
    assert collector.auth is not None and collector.auth.authenticated == 2
    seq = int((config.state_dir / output.SEQUENCE).read_text())
    assert collector.auth.sequences.last["gpu01"] == seq
    assert collector.healthz()["auth"] == {
        "policy": "required", "authenticated": 2, "not_authenticated": {}
    }  # fmt: skip


def test_authenticated_records_are_ordered_by_their_sequence_not_their_dates(
    served: tuple[str, Collector], munged: Munged, tmp_path: Path
) -> None:
    """A node whose clock jumped a day back: its next records still change its verdict, and
    the store keeps the sequence their credentials carried; the delivery measured the clock."""
    url, collector = served
    config = node_config(url, tmp_path / "node")
    _spool(config, body_of(at=T0), "00000000000000000001")
    _spool(config, body_of(at=T0 - 86400, verdict="fail", failed=(("gpu.xid", "reboot"),)),
           "00000000000000000002")  # fmt: skip
    sent_at = time.time()
    delivery = output.deliver(config, deadline=time.monotonic() + 10, munge_socket=munged.socket)
    assert (delivery.sent, delivery.error) == (2, "")
    assert collector.store.latest()["gpu01"].verdict == "fail"
    assert [e.check for e in collector.store.events(kinds=["failure"])] == ["gpu.xid"]
    with collector.store.read() as db:
        (seq,) = db.execute("SELECT seq FROM latest WHERE node = 'gpu01'").fetchone()
    assert seq == int((config.state_dir / output.SEQUENCE).read_text())
    # The collector's clock is fixed at T0: the node is that far off it (within the round trip).
    assert delivery.clock is not None
    assert delivery.clock.offset_s == pytest.approx(T0 - sent_at, abs=5)
    assert 0 <= delivery.clock.rtt_s < 5


def test_a_forged_post_is_refused_and_an_unsigned_record_stays_spooled(
    served: tuple[str, Collector], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    url, _ = served
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", "/v1/records", body=body_of(verdict="fail"))
    resp = conn.getresponse()
    assert resp.status == HTTPStatus.UNAUTHORIZED
    assert "no credential" in json.loads(resp.read())["error"]
    conn.close()
    # A node whose munged is down: sent without a credential, refused, kept for the next run.
    config = node_config(url, tmp_path / "node")
    _spool(config, body_of(), "00000000000000000001")
    delivery = output.deliver(
        config, deadline=time.monotonic() + 10, munge_socket=tmp_path / "no.socket"
    )
    assert delivery.sent == 0 and "HTTP 401: no credential" in delivery.error
    assert delivery.unsigned.startswith("munge: exit status")
    assert delivery.clock is not None  # a refusal carries the collector's clock too
    assert len(output.spooled(config)) == 1
    assert "records sent without a credential: munge" in capfd.readouterr().err


@pytest.mark.parametrize("behind", [1200.0, -240.0], ids=["behind-20min", "ahead-4min"])
def test_an_authenticated_request_is_aged_by_munges_encode_time(
    make_decider: MakeDecider, munged: Munged, behind: float
) -> None:
    """This machine's munged is the node's, its clock ``behind`` the collector's: a fresh FAIL
    drains; a record spooled an hour before its credential was encoded is not acted on, even
    with a send-time header that says it is fresh (the credential's time wins over a header
    that could be changed in flight)."""
    leaves = {"gpu01": "leaf-a"}
    decider, slurm, store = make_decider(leaves, DecisionPolicy(max_fraction=1.0))
    fleet = Fleet("lab", ("gpu01",), {"gpu01": LOCAL}, leaves, {})
    node_now = time.time()
    collector = Collector(fleet, store, decider, clock=lambda: node_now + behind,
                          auth=auth(munged))  # fmt: skip
    drain = {"op": "drain", "check": "gpu.xid", "action": "reboot", "more": 0}
    failing = {"verdict": "fail", "failed": (("gpu.xid", "reboot"),), "request": drain}
    collector.start()
    try:
        old = body_of(at=node_now - 3600, **failing)
        cred = munged.encode(output.munge_payload("gpu01", old, 1))
        late = collector.receive(old, LOCAL, cred, sent=f"{node_now - 3599:.3f}")
        fresh = body_of(at=node_now - 2, **failing)
        cred = munged.encode(output.munge_payload("gpu01", fresh, 2))
        now = collector.receive(fresh, LOCAL, cred)
    finally:
        collector.stop()
    assert late.status == now.status == HTTPStatus.OK
    assert late.body["decision"]["done"] == "none"
    assert "stale request: the record is 36" in late.body["decision"]["detail"]
    assert now.body["decision"]["done"] == "drained", now.body["decision"]
    assert slurm.nodes["gpu01"] == ("IDLE+DRAIN", "gpuforge:gpu.xid:reboot")


def test_the_node_sends_its_clock_with_each_record(tmp_path: Path) -> None:
    """The X-Gpuforge-Sent header: the node's epoch as it sends (a spooled record too)."""
    seen: list[dict[str, str]] = []

    def fake_post(url: str, body: bytes, timeout: float, headers: dict[str, str]) -> dict[str, str]:
        seen.append(dict(headers))
        return {}

    config = node_config("http://127.0.0.1:1", tmp_path / "node")
    _spool(config, body_of(at=T0 - 3600), "00000000000000000001")
    before = time.time()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(output, "post", fake_post)
        delivery = output.deliver(config, deadline=time.monotonic() + 5,
                                  munge_socket=tmp_path / "no.socket")  # fmt: skip
    assert delivery.sent == 1
    [headers] = seen
    assert before <= float(headers[output.SENT_HEADER]) <= time.time()
    assert output.MUNGE_HEADER not in headers  # munged unreachable: sent without a credential


def test_the_sequence_rises_and_survives_a_wiped_state_dir(tmp_path: Path) -> None:
    config = node_config("http://127.0.0.1:1", tmp_path / "node")
    first = output.next_sequence(config, now=100.0)
    assert first == 100_000
    assert output.next_sequence(config, now=50.0) == first + 1  # the clock went back
    (config.state_dir / output.SEQUENCE).unlink()
    assert output.next_sequence(config, now=200.0) == 200_000


def test_one_sender_at_a_time(tmp_path: Path) -> None:
    # Two runs of the checker at once (passive and a prolog): the second waits for the first,
    # then gives up at its deadline, so the node's sequence reaches the collector in order.
    config = node_config("http://127.0.0.1:1", tmp_path / "node")
    _spool(config, body_of(), "00000000000000000001")
    with (config.state_dir / output.SEND_LOCK).open("w") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        delivery = output.deliver(config, deadline=time.monotonic() + 0.3)
    assert (delivery.sent, delivery.error) == (0, "another run is sending the spool")
    assert len(output.spooled(config)) == 1
