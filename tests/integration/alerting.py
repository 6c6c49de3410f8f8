"""The lab's alert path as a test sees it: inject a fault, read Prometheus and the webhook sink.

Used by the day-2 lab test (test_day2.py): a fault file loaded with ``gpuforge lab faults`` must
make the right alert reach Alertmanager's webhook sink on the controller (roles/alertmanager,
``alertmanager_webhook_sink``) with its labels and runbook link, and clearing it must resolve it.
Timing comes from the spec's ``monitoring:`` section, so a lab with other intervals needs no edit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gpuforge.lab import lifecycle
from gpuforge.lab.paths import CONTAINERS_CONF
from gpuforge.topology.load import load_spec

GPUFORGE = str(Path(sys.executable).parent / "gpuforge")
#: roles/alertmanager defaults: where the lab sink appends notifications on the controller.
SINK_FILE = "/var/lib/gpuforge/alerts/alerts.jsonl"
PROMETHEUS_PORT = 9090
RUNBOOK_RE = r"https://\S+/docs/runbooks/{name}\.md"
#: Slack for SSH, podman and the simulator's state being read (seconds).
SLACK_S = 20.0

T = TypeVar("T")


def seconds(duration: str) -> float:
    """A Prometheus duration (``30s``, ``1m30s``, ``2h``) in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"(\d+)(ms|[smhdwy])", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(int(n) * units[u] for n, u in parts)


@dataclass(frozen=True)
class Notification:
    """One alert of one webhook notification the sink recorded."""

    received: float
    status: str  # firing | resolved
    labels: Mapping[str, str]
    annotations: Mapping[str, str]


@dataclass
class AlertLab:
    """A running lab with the monitoring roles applied."""

    lab: str
    spec: Path
    controller: str  # hostname of the node running Prometheus and Alertmanager
    #: The simulator's time_scale for the fault files (the day-2 lab's tools run at 0.02).
    time_scale: float | None = None

    @property
    def prometheus(self) -> str:
        node = lifecycle.load_plan(self.lab).node(self.controller)
        return f"http://{node.address.split('/')[0]}:{PROMETHEUS_PORT}"

    def timing(self, severity: str) -> dict[str, float]:
        """scrape, evaluation, group_wait and group_interval of ``severity``'s route, seconds."""
        mon = load_spec(self.spec).monitoring
        route = next(r for r in mon.routes if r.severity == severity)
        return {
            "scrape": seconds(mon.scrape_interval),
            "evaluation": seconds(mon.evaluation_interval),
            "group_wait": seconds(route.group_wait),
            "group_interval": seconds(route.group_interval),
        }

    def inject(self, faults: Sequence[Mapping[str, Any]], workdir: Path) -> float:
        """Load ``faults`` (replacing every fault of the lab); returns when it was loaded."""
        path = workdir / f"faults-{time.monotonic_ns()}.yaml"
        doc: dict[str, Any] = {"version": 1, "faults": list(faults)}
        if self.time_scale is not None:
            doc["time_scale"] = self.time_scale
        path.write_text(yaml.safe_dump(doc))
        env = dict(os.environ, CONTAINERS_CONF=str(CONTAINERS_CONF))
        proc = subprocess.run(
            [GPUFORGE, "lab", "faults", "--lab", self.lab, str(path)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return time.time()

    def query(self, path: str, **params: str) -> Any:
        """GET one Prometheus API path; the ``data`` of a successful answer."""
        url = f"{self.prometheus}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - http to the lab
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def rule_alerts(self, name: str) -> list[dict[str, Any]]:
        """Prometheus's pending and firing alerts named ``name``."""
        alerts: list[dict[str, Any]] = self.query("/api/v1/alerts")["alerts"]
        return [a for a in alerts if a["labels"].get("alertname") == name]

    def notifications(self, since: float) -> list[Notification]:
        """Every alert of every notification the sink received after ``since`` (unix time)."""
        proc = lifecycle.ssh_run(
            self.lab, self.controller, ["sh", "-c", f"cat {SINK_FILE} 2>/dev/null || true"]
        )
        out = []
        for line in proc.stdout.decode().splitlines():
            entry = json.loads(line)
            if entry["received"] < since:
                continue
            for alert in entry["payload"].get("alerts", []):
                out.append(
                    Notification(
                        entry["received"],
                        alert["status"],
                        alert.get("labels", {}),
                        alert.get("annotations", {}),
                    )
                )
        return out

    def wait_notification(
        self, name: str, status: str, since: float, timeout: float, **labels: str
    ) -> Notification:
        """The first ``status`` notification of alert ``name`` with ``labels`` after ``since``."""

        def found() -> Notification | None:
            for n in self.notifications(since):
                if (
                    n.status == status
                    and n.labels.get("alertname") == name
                    and all(n.labels.get(k) == v for k, v in labels.items())
                ):
                    return n
            return None

        return wait(found, timeout, f"{status} {name} {labels} at the sink")


def wait(probe: Callable[[], T | None], timeout: float, what: str, poll: float = 2.0) -> T:
    """Poll ``probe`` until it returns something; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(poll)


def check_alert(n: Notification, name: str, severity: str) -> None:
    """The labels and annotations every gpuforge alert must carry."""
    assert n.labels["severity"] == severity
    assert re.fullmatch(RUNBOOK_RE.format(name=name), n.annotations["runbook_url"]), n.annotations
    assert n.labels["node" if "node" in n.labels else "rack"] in n.annotations["summary"]
    for label in ("cluster", "rack"):
        assert n.labels.get(label), f"{name}: no {label} label: {n.labels}"


@dataclass(frozen=True)
class Scenario:
    """One fault the lab test injects and the alert it must raise."""

    alert: str
    severity: str
    faults: tuple[Mapping[str, Any], ...]
    labels: Mapping[str, str]  # labels the notification must carry
    for_s: float = 0.0  # the rule's `for`


def xid79(node: str, gpu: int = 3) -> Scenario:
    """A GPU falls off the bus: GpuFellOffBus (critical, action reboot) names node and GPU."""
    return Scenario(
        "GpuFellOffBus",
        "critical",
        ({"node": node, "kind": "xid", "gpu": gpu, "code": 79},),
        {"node": node, "action": "reboot"},
    )


def ib_port_down(node: str, rail: int = 0, device: str = "mlx5_0") -> Scenario:
    """A compute rail port goes down: IbPortDown (critical, for 2m) names node, device, port."""
    return Scenario(
        "IbPortDown",
        "critical",
        ({"node": node, "kind": "ib_port_down", "rail": rail},),
        {"node": node, "device": device, "port": "1"},
        for_s=120,
    )


def rack_over_budget(rack: str, nodes: Sequence[str]) -> Scenario:
    """Every GPU node of ``rack`` near its power limit: RackPowerOverBudget (critical, for 5m)."""
    return Scenario(
        "RackPowerOverBudget",
        "critical",
        tuple({"node": n, "kind": "power_high"} for n in nodes),
        {"rack": rack},
        for_s=300,
    )


def fire_and_resolve(lab: AlertLab, scenario: Scenario, workdir: Path) -> dict[str, float]:
    """Inject, see the alert pending within two evaluation intervals and at the sink, then clear.

    Returns the measured seconds: ``pending`` (fault loaded -> alert active in Prometheus),
    ``firing`` (-> notification at the sink), ``resolved`` (fault cleared -> resolved at the sink).
    """
    t = lab.timing(scenario.severity)
    # A scrape must see the fault, then the rule evaluates within two evaluation intervals.
    active_by = t["scrape"] + 2 * t["evaluation"] + SLACK_S
    injected = lab.inject(scenario.faults, workdir)
    try:

        def active() -> dict[str, Any] | None:
            for a in lab.rule_alerts(scenario.alert):
                if all(a["labels"].get(k) == v for k, v in scenario.labels.items()):
                    return a
            return None

        wait(active, active_by, f"{scenario.alert} active in Prometheus")
        pending = time.time() - injected
        note = lab.wait_notification(
            scenario.alert,
            "firing",
            injected,
            active_by + scenario.for_s + t["evaluation"] + t["group_wait"],
            **scenario.labels,
        )
        check_alert(note, scenario.alert, scenario.severity)
        firing = note.received - injected
    finally:
        cleared = lab.inject([], workdir)
    # Alertmanager sends the resolved notification at the group's next group_interval tick.
    done = lab.wait_notification(
        scenario.alert,
        "resolved",
        cleared,
        t["scrape"] + 2 * t["evaluation"] + t["group_interval"] + SLACK_S,
        **scenario.labels,
    )
    return {"pending": pending, "firing": firing, "resolved": done.received - cleared}
