"""The collector as a real ``gpuforge health serve`` process (issue 28 items 3-4).

One writer per history: a second collector on the same state directory refuses to start, naming
the first; SIGKILL leaves no lock behind. Restart safety across processes: every record answered
2xx before a SIGKILL mid-burst is in the store after the restart (group commit: a record is
answered only once committed). The in-process burst is ``test_collector.py``'s; this one runs the
CLI in a subprocess, as systemd does.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpuforge.generate import write_cluster_inventory
from gpuforge.history import HistoryStore, history_path
from gpuforge.rollout.lock import holder
from gpuforge.state_paths import StatePaths
from gpuforge.topology import load_cluster

from ..conftest import LAB, REPO
from ..history.records import T0, record

#: Each GPU node posts from its own loopback address (the collector takes a node's records only
#: from its management address).
BASE = 11


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("svc") / "lab"
    write_cluster_inventory(load_cluster(LAB), root)
    topo_file = root / "generated" / "topology.json"
    topo = json.loads(topo_file.read_text())
    gpus = [n for n in topo["nodes"] if n.get("role") == "gpu"]
    for i, n in enumerate(gpus):
        n["mgmt_address"] = f"127.0.0.{BASE + i}"
    topo_file.write_text(json.dumps(topo))
    return root


def nodes_of(cluster_dir: Path) -> dict[str, str]:
    topo = json.loads((cluster_dir / "generated" / "topology.json").read_text())
    return {n["hostname"]: n["mgmt_address"] for n in topo["nodes"] if n.get("role") == "gpu"}


class Serve:
    """One ``gpuforge health serve`` subprocess and its banner's port."""

    def __init__(self, cluster_dir: Path, state: Path) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "lab" / "sim")]),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuforge", "health", "serve", "--inventory", str(cluster_dir),
             "--state-dir", str(state), "--listen", "127.0.0.1:0", "--auth", "off",
             "--metrics-dir", str(state / "textfile")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.lines: list[str] = []
        self.port = 0
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.lines.append(line.rstrip("\n"))
                found = re.search(r"on http://127\.0\.0\.1:(\d+)/v1/records", line)
                if found:
                    self.port = int(found.group(1))
                    ready.set()
            ready.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        ready.wait(60)

    def wait(self, timeout: float = 30) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return rc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.wait()


@pytest.fixture
def serve(cluster_dir: Path, tmp_path: Path) -> Iterator[list[Serve]]:
    started: list[Serve] = []
    yield started
    for s in started:
        s.stop()


def start(started: list[Serve], cluster_dir: Path, state: Path) -> Serve:
    s = Serve(cluster_dir, state)
    started.append(s)
    return s


def post_from(address: str, port: int, body: bytes) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(address, 0))
    try:
        conn.request("POST", "/v1/records", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def traceback_free(lines: list[str]) -> None:
    assert not [line for line in lines if "Traceback" in line], lines


def test_a_second_collector_on_the_same_history_refuses_naming_the_first(
    cluster_dir: Path, tmp_path: Path, serve: list[Serve]
) -> None:
    first = start(serve, cluster_dir, tmp_path)
    assert first.port, first.lines
    second = start(serve, cluster_dir, tmp_path)
    assert second.wait() == 2
    (line,) = [x for x in second.lines if x.strip()]
    assert line.startswith("error: ") and "has a collector already" in line
    assert f"pid {first.proc.pid} " in line and " since 20" in line, line
    assert first.proc.poll() is None  # the first goes on serving
    lock = StatePaths(tmp_path, "lab").collector_lock
    assert holder(lock) is not None
    first.proc.kill()  # SIGKILL: no clean-up ran; the kernel dropped the flock
    first.wait()
    assert holder(lock) is None
    third = start(serve, cluster_dir, tmp_path)
    assert third.port and third.proc.poll() is None, third.lines
    traceback_free(first.lines + second.lines + third.lines)


def test_every_record_answered_before_a_sigkill_mid_burst_is_stored_after_the_restart(
    cluster_dir: Path, tmp_path: Path, serve: list[Serve]
) -> None:
    nodes = nodes_of(cluster_dir)
    per_node = 25
    bodies = []
    for k in range(per_node):
        for node, address in nodes.items():
            xid = {"time": f"2026-11-18T10:{k // 60:02d}:{k % 60:02d}Z", "gpu": 0,
                   "event": "xid", "code": 13, "detail": f"burst {k}"}  # fmt: skip
            bodies.append((node, address, k, json.dumps(record(node, at=T0 + k, events=[xid]))))
    first = start(serve, cluster_dir, tmp_path)
    assert first.port, first.lines
    answered: list[tuple[str, int]] = []
    lock = threading.Lock()
    kill_after = len(bodies) // 3

    def one(item: tuple[str, str, int, str]) -> None:
        node, address, k, body = item
        try:
            status = post_from(address, first.port, body.encode())
        except (OSError, http.client.HTTPException):
            return  # no answer, or part of one: the node keeps the record in its spool
        if 200 <= status < 300:
            with lock:
                answered.append((node, k))
                if len(answered) == kill_after:
                    first.proc.kill()  # mid-burst: workers still hold requests

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, bodies))
    assert first.wait() == -signal.SIGKILL
    assert kill_after <= len(answered) < len(bodies)  # it died mid-burst
    lock_file = StatePaths(tmp_path, "lab").collector_lock
    assert holder(lock_file) is None  # nothing left locked

    again = start(serve, cluster_dir, tmp_path)  # as systemd's Restart=on-failure does
    assert again.port and again.proc.poll() is None, again.lines
    with HistoryStore.open(history_path(tmp_path, "lab"), readonly=True) as store:
        stored = {(e.node, e.detail) for e in store.events(kinds=["xid"])}
    missing = [(n, k) for n, k in answered if (n, f"burst {k}") not in stored]
    assert missing == []
    # the nodes' spools drain into the restarted collector: every record is taken once more
    left = [b for b in bodies if (b[0], f"burst {b[2]}") not in stored]
    assert all(post_from(a, again.port, body.encode()) == 200 for _, a, _, body in left)
    again.stop()
    assert again.proc.returncode == 0
    with HistoryStore.open(history_path(tmp_path, "lab"), readonly=True) as store:
        assert len(store.events(kinds=["xid"])) == len(bodies)
    assert holder(lock_file) is None
    traceback_free(first.lines + again.lines)
