"""The lab webhook sink (roles/alertmanager/files/gpuforge-alert-sink.py) on a real socket."""

from __future__ import annotations

import importlib.util
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import HTTPServer
from pathlib import Path
from types import ModuleType

import pytest

from ..conftest import REPO

SINK = REPO / "roles" / "alertmanager" / "files" / "gpuforge-alert-sink.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpuforge_alert_sink", SINK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    out = tmp_path / "alerts" / "alerts.jsonl"
    out.parent.mkdir()
    server = HTTPServer(("127.0.0.1", 0), _module().handler_for(out))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/alerts", out
    finally:
        server.shutdown()
        server.server_close()


def _post(url: str, body: bytes) -> int:
    assert url.startswith("http://127.0.0.1:")
    request = urllib.request.Request(  # noqa: S310 - a local http:// URL, checked above
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_each_notification_is_one_json_line(sink: tuple[str, Path]) -> None:
    url, out = sink
    firing = {"status": "firing", "alerts": [{"labels": {"alertname": "GpuXid", "node": "gpu01"}}]}
    resolved = {"status": "resolved", "alerts": [{"labels": {"alertname": "GpuXid"}}]}
    assert _post(url, json.dumps(firing).encode()) == 200
    assert _post(url, json.dumps(resolved).encode()) == 200
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["payload"] for line in lines] == [firing, resolved]
    assert all(isinstance(line["received"], float) for line in lines)


def test_a_body_that_is_not_json_is_refused_and_not_written(sink: tuple[str, Path]) -> None:
    url, out = sink
    assert _post(url, b"{not json") == 400
    assert not out.exists()


def test_a_full_file_is_rotated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module()
    out = tmp_path / "alerts.jsonl"
    out.write_text("x" * 100)
    monkeypatch.setattr(module, "MAX_FILE", 50)
    module.append(out, {"status": "firing"}, now=1.0)
    assert (tmp_path / "alerts.jsonl.1").read_text() == "x" * 100
    assert json.loads(out.read_text()) == {"received": 1.0, "payload": {"status": "firing"}}
