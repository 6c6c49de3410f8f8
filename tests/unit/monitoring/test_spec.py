"""The spec's ``monitoring:`` section: each bad setting is refused with its field named."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuforge.topology import SpecError, load_spec

Data = dict[str, Any]


def _load(data: Data, write_spec: Callable[[Data], Path]) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec(write_spec(data))
    return info.value


@pytest.mark.parametrize(
    ("settings", "field", "message"),
    [
        ({"scrape_interval": "0s"}, "monitoring.scrape_interval", "longer than 0"),
        ({"scrape_interval": "0"}, "monitoring.scrape_interval", "not a Prometheus duration"),
        ({"scrape_interval": 30}, "monitoring.scrape_interval", "not a Prometheus duration"),
        ({"scrape_interval": "30 s"}, "monitoring.scrape_interval", "not a Prometheus duration"),
        ({"scrape_interval": ""}, "monitoring.scrape_interval", "not a Prometheus duration"),
        ({"evaluation_interval": "1h30"}, "monitoring.evaluation_interval", "duration"),
        ({"retention": "-1d"}, "monitoring.retention", "duration"),
        ({"routes": [{"severity": "page"}]}, "monitoring.routes[0].severity", "critical"),
        (
            {"routes": [{"severity": "info"}, {"severity": "info"}]},
            "monitoring.routes",
            "more than one route for severity info",
        ),
        (
            {"routes": [{"severity": "warning", "repeat_interval": "0m"}]},
            "monitoring.routes[0].repeat_interval",
            "longer than 0",
        ),
        (
            {"remote_write": [{"name": "lts", "url": "thanos:19291"}]},
            "monitoring.remote_write[0].url",
            "not an http",
        ),
        ({"shards": 2}, "monitoring.shards", "unknown field"),
        ({"servers": "gpu[01-99]"}, "monitoring.servers", "not nodes of this spec: gpu09"),
        ({"servers": "gpu[01-"}, "monitoring.servers", "hostlist"),
    ],
    ids=lambda v: str(v) if isinstance(v, str) else None,
)
def test_bad_monitoring_setting_names_the_field(
    lab_data: Data,
    write_spec: Callable[[Data], Path],
    settings: Data,
    field: str,
    message: str,
) -> None:
    lab_data["monitoring"] = settings
    error = _load(lab_data, write_spec)
    text = str(error)
    assert field in text
    assert message in text
    assert "spec.yaml" in text


def test_unknown_severity_error_has_the_line(
    lab_data: Data, write_spec: Callable[[Data], Path]
) -> None:
    lab_data["monitoring"] = {"routes": [{"severity": "warning"}, {"severity": "page"}]}
    path = write_spec(lab_data)
    line = next(
        i for i, text in enumerate(path.read_text().splitlines(), 1) if "severity: page" in text
    )
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert f"spec.yaml:{line}:" in str(info.value)


def test_defaults_route_every_severity(lab_data: Data, write_spec: Callable[[Data], Path]) -> None:
    spec = load_spec(write_spec(lab_data))
    assert [r.severity for r in spec.monitoring.routes] == ["critical", "warning", "info"]
    assert spec.monitoring.scrape_interval == "30s"


def test_good_settings_are_kept(lab_data: Data, write_spec: Callable[[Data], Path]) -> None:
    lab_data["monitoring"] = {
        "servers": "ctl01,gpu01",
        "scrape_interval": "1m30s",
        "evaluation_interval": "15s",
        "remote_write": [{"name": "mimir", "url": "https://mimir.example/api/v1/push"}],
    }
    spec = load_spec(write_spec(lab_data))
    assert spec.monitoring.servers == "ctl01,gpu01"
    assert spec.monitoring.scrape_interval == "1m30s"
    assert spec.monitoring.remote_write[0].url == "https://mimir.example/api/v1/push"
