"""The one Prometheus HTTP client: instant and range queries, a timeout, one error wording.

``gpuforge fleet status --prometheus`` (rack power, :mod:`gpuforge.health.fleet_html`) and
``gpuforge fleet risk --prometheus`` (the scorer's history, :mod:`gpuforge.predict.sources`) ask
through it. Every failure is an :class:`~gpuforge.errors.OperationError` that names the server,
the expression and why (unreachable, timed out, an HTTP status with the start of its body, an
answer that is not JSON, a query Prometheus refused); a URL that is not http(s) is an
:class:`~gpuforge.errors.InputError`. No proxy from the environment is used: the server is on the
management network.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from gpuforge.errors import InputError, OperationError

#: Seconds one request may take unless the caller says otherwise.
DEFAULT_TIMEOUT_S = 30.0
#: Characters of an HTTP error's body quoted in the error.
ERROR_BODY_CHARS = 300


class Prometheus:
    """One Prometheus server's HTTP API (``/api/v1/query`` and ``/api/v1/query_range``)."""

    def __init__(self, base_url: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        parsed = urllib.parse.urlparse(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise InputError(f"--prometheus {base_url!r}: not an http:// or https:// URL")
        self.root = base_url.rstrip("/")
        self.timeout = timeout
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        return self._result("query", expr, {"query": expr})

    def query_range(
        self, expr: str, *, start: float, end: float, step_s: float
    ) -> list[dict[str, Any]]:
        """A range query's result: ``[{"metric": {...}, "values": [[t, "v"], ...]}, ...]``."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}"}
        params["step"] = f"{step_s:g}"
        return self._result("query_range", expr, params)

    def _result(self, endpoint: str, expr: str, params: dict[str, str]) -> list[dict[str, Any]]:
        url = f"{self.root}/api/v1/{endpoint}?{urllib.parse.urlencode(params)}"
        answer = self._get(url, expr)
        if not isinstance(answer, dict) or answer.get("status") != "success":
            error = answer.get("error", answer) if isinstance(answer, dict) else answer
            raise OperationError(f"Prometheus {self.root}: query {expr} failed: {error}")
        data = answer.get("data")
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list):
            raise OperationError(f"Prometheus {self.root}: {expr}: answer has no data.result")
        return result

    def _get(self, url: str, expr: str) -> Any:
        where = f"Prometheus {self.root}: {expr}"
        try:
            with self._opener.open(url, timeout=self.timeout) as response:
                return json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", "replace")[:ERROR_BODY_CHARS]
            raise OperationError(f"{where}: HTTP {exc.code}: {body}") from None
        except (urllib.error.URLError, OSError) as exc:  # TimeoutError is an OSError
            why = getattr(exc, "reason", None) or exc
            raise OperationError(f"{where}: {why}") from None
        except ValueError as exc:
            raise OperationError(f"{where}: answer is not JSON ({exc})") from None
