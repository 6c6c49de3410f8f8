"""The list of OS releases (roles/_common/vars/main.yml) matches the roles; preflight obeys it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ROLES_DIR = REPO / "roles"
RELEASES: list[dict[str, Any]] = yaml.safe_load(
    (ROLES_DIR / "_common" / "vars" / "main.yml").read_text()
)["__common_os_releases"]
#: Roles that load their OS variables through _common's os_vars routine.
OS_VARS_ROLES = sorted(
    {
        p.parents[1].name
        for p in ROLES_DIR.glob("*/tasks/*.yml")
        if "tasks_from: os_vars.yml" in p.read_text() and p.parents[1].name != "_common"
    }
)
#: A point release of each listed release, as Ansible's facts spell it.
FACTS = {
    "Debian 12": ("Debian", "12.8", "12", "Debian"),
    "Ubuntu 22.04": ("Ubuntu", "22.04", "22", "Debian"),
    "Ubuntu 24.04": ("Ubuntu", "24.04", "24", "Debian"),
    "Rocky 9": ("Rocky", "9.4", "9", "RedHat"),
    "RHEL 9": ("RedHat", "9.4", "9", "RedHat"),
}


def _maps(role: str, facts: tuple[str, str, str, str]) -> bool:
    """Whether _common's first_found would find a vars file of ``role`` for these facts."""
    distribution, version, major, family = facts
    candidates = [
        f"{distribution}-{version}",
        f"{distribution}-{major}",
        f"{family}-{major}",
        family,
    ]
    return any((ROLES_DIR / role / "vars" / f"{c}.yml").is_file() for c in candidates)


def test_only_debian_12_is_tested() -> None:
    assert [r["name"] for r in RELEASES if r["tested"]] == ["Debian 12"]
    assert {r["name"] for r in RELEASES} == set(FACTS)


def test_every_role_with_os_differences_loads_them_through_common() -> None:
    with_os_vars = {
        p.parents[1].name
        for p in ROLES_DIR.glob("*/vars/*.yml")
        if p.name not in ("main.yml", "spec_rules.yml")  # spec_rules: the spec loader's rules
    }
    assert set(OS_VARS_ROLES) == with_os_vars
    assert len(OS_VARS_ROLES) == 16


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r["name"])
def test_the_list_says_exactly_which_roles_map_a_release(release: dict[str, Any]) -> None:
    mapped = {role for role in OS_VARS_ROLES if _maps(role, FACTS[release["name"]])}
    assert mapped == set(OS_VARS_ROLES) - set(release["unmapped_roles"])


def test_an_unlisted_release_is_mapped_by_no_role() -> None:
    assert not any(_maps(role, ("CentOS", "7.9", "7", "RedHat")) for role in OS_VARS_ROLES)
    # munge and slurm map the whole Debian family (vars/Debian.yml); preflight still refuses 11.
    assert {role for role in OS_VARS_ROLES if _maps(role, ("Debian", "11.9", "11", "Debian"))} == {
        "munge",
        "slurm",
    }


@pytest.mark.slow
def test_preflight_check_passes_tested_warns_untested_and_fails_unmapped(tmp_path: Path) -> None:
    hosts = {
        "deb12": FACTS["Debian 12"],
        "noble": FACTS["Ubuntu 24.04"],
        "rocky": FACTS["Rocky 9"],
        "centos7": ("CentOS", "7.9", "7", "RedHat"),
    }
    inventory = {
        "all": {
            "hosts": {
                name: {
                    "ansible_connection": "local",
                    "ansible_python_interpreter": sys.executable,
                    "fake_facts": dict(
                        zip(
                            (
                                "distribution",
                                "distribution_version",
                                "distribution_major_version",
                                "os_family",
                            ),
                            facts,
                            strict=True,
                        )
                    ),
                }
                for name, facts in hosts.items()
            }
        }
    }
    (tmp_path / "hosts.yml").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Check the release as preflight does",
                    "hosts": "all",
                    "gather_facts": False,
                    "tasks": [
                        {"ansible.builtin.set_fact": {"ansible_facts": "{{ fake_facts }}"}},
                        {
                            "ansible.builtin.include_role": {
                                "name": "_common",
                                "tasks_from": "os_support.yml",
                            }
                        },
                    ],
                }
            ]
        )
    )
    env = {
        **os.environ,
        "ANSIBLE_ROLES_PATH": str(ROLES_DIR),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
    }
    env.pop("ANSIBLE_CONFIG", None)
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(tmp_path / "hosts.yml"),
            str(tmp_path / "play.yml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    out = json.loads(proc.stdout)
    stats = out["stats"]
    assert {h for h, s in stats.items() if s["failures"]} == {"centos7"}
    results = {
        task["task"]["name"]: task["hosts"] for play in out["plays"] for task in play["tasks"]
    }
    warned = {
        host
        for host, result in results[
            "_common : Warn that this OS release is mapped but untested"
        ].items()
        if not result.get("skipped")
    }
    assert warned == {"noble", "rocky"}
    warn_rocky = results["_common : Warn that this OS release is mapped but untested"]["rocky"][
        "msg"
    ]
    assert "Rocky 9 is mapped but untested" in warn_rocky
    assert (
        "Not mapped by the alertmanager, dcgm_exporter, health, munge, node_exporter, prometheus,"
        " slurm roles" in warn_rocky
    )
    failure = results["_common : Assert that the roles map this OS release"]["centos7"]["msg"]
    assert failure.startswith("CentOS 7.9 is not mapped by gpuforge's roles. Tested: Debian 12;")
