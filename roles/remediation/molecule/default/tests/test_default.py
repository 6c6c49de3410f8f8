"""Verify the remediation role's GPU reset on the Molecule instance: one fact per test."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CLEARED = "/var/lib/gpuforge-sim/cleared.json"


def _cleared(host):
    return json.loads(host.file(CLEARED).content_string)["node01"]


def test_reset_cleared_the_named_gpus_fault(host):
    assert _cleared(host)["molecule-ecc-gpu1"]["by"] == "reset"


def test_a_gpu_not_named_was_not_reset(host):
    assert "molecule-ecc-gpu2" not in _cleared(host)


def test_the_service_holding_the_gpus_was_stopped_and_started_again(host):
    # one start in prepare, one after the reset
    starts = host.file("/var/lib/gpuforge-molecule-gpu-client.starts").content_string
    assert starts.split() == ["start", "start"]


def test_the_service_holding_the_gpus_runs_again(host):
    assert host.service("gpuforge-molecule-gpu-client").is_running
