#!/usr/bin/python3
"""gpuforge's LAB/TEST webhook sink: appends every Alertmanager notification to a file.

Not a production receiver: it keeps nothing but a JSON-lines file, one line per notification
(``{"received": <unix time>, "payload": <Alertmanager's webhook JSON>}``), which the lab's
alert tests read. It serves one request at a time, so lines never interleave. Standard library
only: it runs on the controller with the system python3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

#: Larger notifications are refused (Alertmanager's hold a group of alerts; 1 MiB is ample).
MAX_BODY = 1 << 20
#: The file is moved to <file>.1 when it grows past this, so a noisy lab never fills the disk.
MAX_FILE = 64 << 20


def append(out: Path, payload: object, now: float | None = None) -> None:
    """Append one notification to ``out`` as a JSON line, rotating a file past MAX_FILE."""
    line = json.dumps({"received": time.time() if now is None else now, "payload": payload})
    try:
        if out.stat().st_size > MAX_FILE:
            out.replace(out.with_name(out.name + ".1"))
    except FileNotFoundError:
        pass
    with out.open("a", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def handler_for(out: Path) -> type[BaseHTTPRequestHandler]:
    """A request handler class that appends POSTed notifications to ``out``."""

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0 or length > MAX_BODY:
                self.send_error(413 if length > MAX_BODY else 411)
                return
            try:
                payload = json.loads(self.rfile.read(length))
            except ValueError:
                self.send_error(400, "body is not JSON")
                return
            append(out, payload)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            sys.stderr.write(f"{self.address_string()} {format % args}\n")

    return Sink


def main(argv: list[str] | None = None) -> int:
    """Serve until stopped: ``--listen HOST:PORT --out FILE``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:9095", help="HOST:PORT to listen on")
    parser.add_argument("--out", required=True, type=Path, help="JSON-lines file to append to")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    server = HTTPServer((host or "127.0.0.1", int(port)), handler_for(args.out))
    server.timeout = 10
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
