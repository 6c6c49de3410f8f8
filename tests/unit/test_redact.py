"""Secrets cut from text and JSON: each pattern the RMA bundle must never carry, and what stays."""

from __future__ import annotations

import json

import pytest

from gpuforge.redact import REDACTED, is_secret_key, scrub_file, scrub_json, scrub_text

#: (text with a secret, the secret) for every pattern the scrubber is for.
SALTED = [
    ("password=hunter2", "hunter2"),
    ('{"password": "hunter2"}', "hunter2"),
    ('token=abc123"', "abc123"),
    ("api_key: 'abc def'", "abc def"),
    ("MUNGE_KEY='abc def'", "abc def"),
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig", "eyJhbGciOiJIUzI1NiJ9"),
    ("Authorization: Basic dXNlcjpodW50ZXIy", "dXNlcjpodW50ZXIy"),
    ("curl https://admin:hunter2@bmc.example.net/redfish/v1", "hunter2"),
    ("ipmitool -I lanplus -H 10.1.0.5 -U admin -P hunter2 chassis status", "hunter2"),
    ("sshpass -p hunter2 ssh root@gpu01", "hunter2"),
    ("mysqldump -uslurm -phunter2 slurm_acct_db", "hunter2"),
    ("slurmdbd --password=hunter2", "hunter2"),
    ("ansible_become_pass: hunter2", "hunter2"),
    ("StoragePass=hunter2", "hunter2"),
    ('client_secret = "s3cr3t"', "s3cr3t"),
    ("munge_key: |\n  AAAAB3NzaC1yc2EAAAADAQABAAABAQ\n  ZZZZmungekeyline2\nother: 1", "AAAAB3Nza"),
    ("munge_key:\n    AAAAB3NzaC1yc2EAAAADAQABAAABAQ\nother: 1", "AAAAB3Nza"),
    ("secrets:\n  - db_password: !vault |\n      $ANSIBLE_VAULT;1.1;AES256\n      3961", "3961"),
    (
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXkt\n-----END OPENSSH PRIVATE KEY-----",
        "b3BlbnNzaC1rZXkt",
    ),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA (cut)", "MIIEowIBAAKCAQEA"),
]


@pytest.mark.parametrize(("text", "secret"), SALTED)
def test_each_pattern_is_cut(text: str, secret: str) -> None:
    out = scrub_text(text)
    assert secret not in out
    assert REDACTED in out


def test_json_inside_text_stays_json() -> None:
    doc = json.dumps({"data": 'curl -H "token=abc123"', "password": "hunter2", "n": 3})
    out = scrub_text(doc)
    assert "abc123" not in out
    assert "hunter2" not in out
    assert json.loads(out)["n"] == 3


def test_json_is_scrubbed_as_json() -> None:
    data = {
        "events": [{"code": 79, "data": {"message": 'token=abc123"', "ansible_become_pass": "x1"}}],
        "pass": 4,
        "auth": {"user": "u", "pass": "p4ss"},
    }
    text = scrub_file("events.json", json.dumps(data))
    parsed = json.loads(text)  # still valid JSON
    assert "abc123" not in text
    assert parsed["events"][0]["data"]["ansible_become_pass"] == REDACTED
    assert parsed["events"][0]["code"] == 79
    assert parsed["pass"] == 4  # a count of passing checks, not a secret
    assert parsed["auth"] == {"user": "u", "pass": REDACTED}
    assert scrub_json(None) is None


def test_a_file_named_json_that_does_not_parse_is_scrubbed_as_text() -> None:
    assert "hunter2" not in scrub_file("x.json", '{"password": "hunter2"')


@pytest.mark.parametrize(
    "text",
    [
        "GPU 3: Xid 79, fallen off the bus\nSerial Number: 1650522003820\n",
        "NVRM: Xid (PCI:0000:91:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
        "status: pass\nverdict: fail\nhttp://ctl01:9477/v1/records\n",
        "Basic test passed\nbypass: false\n",
    ],
)
def test_ordinary_text_is_kept(text: str) -> None:
    assert scrub_text(text) == text


def test_secret_key_names() -> None:
    assert all(
        is_secret_key(k) for k in ("password", "DB_PASSWD", "ansible_become_pass", "MUNGE_KEY")
    )
    assert not any(is_secret_key(k) for k in ("pass", "passive", "status", "node", "compass"))
