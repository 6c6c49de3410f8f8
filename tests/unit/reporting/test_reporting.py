"""The one renderer: every page on the same layout, escaped; the one JUnit writer's counts."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from gpuforge.reporting import environment, render_page
from gpuforge.reporting.junit import Case, Suite, to_junit


def test_every_page_extends_the_one_layout() -> None:
    env = environment()
    pages = [t for t in env.list_templates() if t.endswith(".html.j2")]
    assert sorted(pages) == [
        "base.html.j2",
        "charts.html.j2",
        "conformance.html.j2",
        "fleet.html.j2",
        "macros.html.j2",
        "phase.html.j2",
        "validation.html.j2",
    ]
    for name in pages:
        if name not in {"base.html.j2", "charts.html.j2", "macros.html.j2"}:
            source = env.loader.get_source(env, name)[0]  # type: ignore[union-attr]
            assert source.startswith('{% extends "base.html.j2" %}'), name


def test_values_are_escaped_and_undefined_ones_refused() -> None:
    r = {
        "cluster": "<b>c</b>", "phase": 1, "run_id": "x", "stage_seconds": {}, "nodes": [],
        "gate": {"passed": True, "detail": "&"}, "notes": [], "reports": [],
    }  # fmt: skip
    page = render_page("phase.html.j2", r=r, problems=[], racks=[])
    assert "&lt;b&gt;c&lt;/b&gt;" in page and "<b>c</b>" not in page
    with pytest.raises(Exception, match="undefined"):
        render_page("phase.html.j2", r=r)


def test_junit_counts_per_suite_and_in_total() -> None:
    text = to_junit(
        "all",
        [
            Suite(
                "n1",
                [
                    Case("c", "ok", text="PASS", time_s=0.5),
                    Case("c", "bad", "failure", "too slow", "fail", "measured 1", time_s=1.0),
                    Case("c", "odd", "error", "no answer", time_s=0.25),
                    Case("c", "na", "skipped", "not applicable", time_s=0.0),
                ],
            ),
            Suite("fabric", [Case("f", "leaf1", "failure", "down", "link", "evidence")]),
        ],
    )
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<testsuites')
    root = ET.fromstring(text)  # noqa: S314 - our own text
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == (
        "5", "2", "1", "1",
    )  # fmt: skip
    n1, fabric = root
    assert n1.get("time") == "1.750" and fabric.get("time") is None
    bad = n1.find("testcase[@name='bad']/failure")
    assert bad is not None and bad.get("type") == "fail" and bad.text == "measured 1"
    assert n1.find("testcase[@name='ok']/system-out").text == "PASS"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="outcome"):
        Case("c", "x", "broken")
