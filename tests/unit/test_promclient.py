"""The one Prometheus client: instant and range queries, and every failure as one clear error."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from gpuforge.errors import InputError, OperationError
from gpuforge.promclient import Prometheus


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        expr = query["query"][0]
        status, body = 200, ""
        if expr == "slow":
            time.sleep(2)
        if expr == "http500":
            status, body = 500, "internal trouble " * 40
        elif expr == "notjson":
            body = "<html>"
        elif expr == "refused":
            body = json.dumps({"status": "error", "error": "parse error at char 3"})
        elif url.path.endswith("/query_range"):
            values = [[float(query["start"][0]), "1"], [float(query["end"][0]), "2"]]
            result = [{"metric": {"node": "gpu01"}, "values": values, "step": query["step"][0]}]
            body = json.dumps({"status": "success", "data": {"result": result}})
        else:
            result = [{"metric": {"rack": "r1"}, "value": [0, "5"]}]
            body = json.dumps({"status": "success", "data": {"result": result}})
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/"
    srv.shutdown()
    srv.server_close()


def test_instant_and_range_queries(server: str) -> None:
    prom = Prometheus(server, timeout=5)
    assert prom.root == server.rstrip("/")
    assert prom.query("up") == [{"metric": {"rack": "r1"}, "value": [0, "5"]}]
    [series] = prom.query_range("up", start=100.0, end=400.0, step_s=300.0)
    assert series["values"] == [[100.0, "1"], [400.0, "2"]]
    assert series["step"] == "300"


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("http500", r"http500: HTTP 500: internal trouble"),
        ("notjson", r"notjson: answer is not JSON"),
        ("refused", r"query refused failed: parse error at char 3"),
    ],
)
def test_failures_name_server_expression_and_why(server: str, expr: str, why: str) -> None:
    with pytest.raises(OperationError, match=r"^Prometheus http://127\.0\.0\.1:\d+: .*") as exc:
        Prometheus(server, timeout=5).query(expr)
    assert re.search(why, str(exc.value)), str(exc.value)
    assert len(str(exc.value)) < 400  # an error body is quoted, not dumped


def test_timeout_and_unreachable(server: str) -> None:
    with pytest.raises(OperationError, match=r"slow: .*timed out"):
        Prometheus(server, timeout=0.5).query("slow")
    with pytest.raises(OperationError, match=r"^Prometheus http://127\.0\.0\.1:9: up: "):
        Prometheus("http://127.0.0.1:9", timeout=2).query("up")


def test_only_http_urls() -> None:
    for url in ("file:///etc/passwd", "127.0.0.1:9090", "http://"):
        with pytest.raises(InputError, match="not an http"):
            Prometheus(url)
