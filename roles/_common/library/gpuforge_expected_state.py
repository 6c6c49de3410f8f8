#!/usr/bin/python
"""Ansible module: record a role's desired state for nightly conformance (one task per role)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import tempfile
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: gpuforge_expected_state
short_description: Write /etc/gpuforge/expected/state/<role>.json, the desired state a role left
description:
  - Reads the installed versions of the listed packages (dpkg-query, or rpm on RedHat), the
    sha256 of the listed files (a missing file is not recorded), and writes them with the given
    sysctls, modules, services and limits as one JSON document (schema gpuforge.expected/1) that
    gpuforge's node checker (gpuforge.node.drift) compares the node against.
  - One task instead of a package query, a digest per file, a directory and a copy: on a
    converged site play the record is 2 host-tasks per role and host (docs/scaleout.md).
  - Keeps each listed file's content as the role rendered it (C(content), at most
    content_max_bytes per file, a cut file marked C(truncated)), so that a drifted file is shown
    as a diff, not two sums. Never for a file that can hold a secret (C(omitted) says why):
    munge.key and anything under /etc/munge, ssh keys and other private keys, and any file of
    mode 0600 or tighter (the record is world-readable); nor for a file that is not UTF-8 text.
  - With dpkg, also the packages the role left on hold (C(holds), dpkg's selection C(h) in the
    same query): a pinned package whose hold was released (apt-mark unhold) is drift, since apt
    would move it on the next upgrade. Left out when none is held (rpm has no holds).
  - Changed only when the document differs from the file; check mode writes nothing.
options:
  dir: {type: path, required: true, description: Directory of the records (created, 0755).}
  role: {type: str, required: true, description: The record's name and its role field.}
  package_manager: {type: str, choices: [dpkg, rpm], default: dpkg, description: Reads versions.}
  packages: {type: list, elements: str, default: [], description: Packages whose versions count.}
  files: {type: list, elements: path, default: [], description: Files whose sha256 is recorded.}
  sysctls: {type: dict, default: {}, description: Kernel settings applied live.}
  modules: {type: list, elements: str, default: [], description: Kernel modules to be loaded.}
  services: {type: dict, default: {}, description: Units and their desired state.}
  limits: {type: dict, default: {}, description: Lines per limits.d file.}
  content_max_bytes: {type: int, default: 65536, description: Bytes of a file's content kept.}
"""

SCHEMA = "gpuforge.expected/1"
QUERY_TIMEOUT_S = 60
QUERY = {
    "dpkg": ["dpkg-query", "-W", "-f=${Package}\\t${Version}\\t${db:Status-Abbrev}\\n"],
    "rpm": ["rpm", "-q", "--qf", "%{NAME}\\t%{VERSION}-%{RELEASE}\\tii\\n"],
}


def installed(manager, packages):
    """({name: version} of the installed packages, [the installed ones on hold]): one query."""
    if not packages:
        return {}, []
    proc = subprocess.run(
        QUERY[manager] + list(packages),
        capture_output=True,
        text=True,
        timeout=QUERY_TIMEOUT_S,
        check=False,
    )
    # dpkg-query and rpm exit 1 when a name matches no installed package: it is not recorded.
    if proc.returncode > 1:
        raise RuntimeError(f"{QUERY[manager][0]} exited {proc.returncode}: {proc.stderr.strip()}")
    versions = {}
    holds = []
    for line in proc.stdout.splitlines():
        fields = line.split("\t")
        if len(fields) == 3 and fields[2][1:2] == "i":
            versions[fields[0]] = fields[1]
            if manager == "dpkg" and fields[2][:1] == "h":  # selection "hold" (apt-mark hold)
                holds.append(fields[0])
    return versions, sorted(holds)


def digests(paths):
    out = {}
    for path in paths:
        if not Path(path).is_file():
            continue
        sha = hashlib.sha256()
        with Path(path).open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                sha.update(block)
        out[path] = "sha256:" + sha.hexdigest()
    return out


#: Paths whose content is never recorded, whatever their mode: they can hold a secret.
SECRET_PATH = re.compile(
    r"(/etc/munge/|/munge\.key$|/\.ssh/|/ssh_host_[^/]*_key$|/id_[a-z0-9]+$"
    r"|\.(key|pem|p12|pfx)$|/(shadow|gshadow)-?$)"
)


def secret_reason(path, mode):
    """Why ``path`` (of ``mode``) can hold a secret, or None."""
    if SECRET_PATH.search(path):
        return "can hold a secret (its path)"
    if not mode & 0o077:
        return f"can hold a secret (mode {stat.S_IMODE(mode):04o})"
    return None


def contents(paths, limit):
    """{path: {"text", "truncated"} or {"omitted": why}} for the files that exist."""
    out = {}
    for path in paths:
        try:
            info = Path(path).stat()
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        why = secret_reason(path, info.st_mode)
        if why is not None:
            out[path] = {"omitted": why}
            continue
        with Path(path).open("rb") as handle:
            data = handle.read(limit + 1)
        truncated = len(data) > limit
        head = data[:limit]
        text = None
        for trim in range(4 if truncated else 1):  # a cut may split a UTF-8 sequence
            try:
                text = head[: len(head) - trim].decode("utf-8")
                break
            except UnicodeDecodeError:
                continue
        if text is None or "\x00" in text:
            out[path] = {"omitted": "not UTF-8 text"}
        elif "PRIVATE KEY-----" in text:
            out[path] = {"omitted": "can hold a secret (a private key)"}
        else:
            out[path] = {"text": text, "truncated": truncated}
    return out


def main():
    module = AnsibleModule(
        argument_spec={
            "dir": {"type": "path", "required": True},
            "role": {"type": "str", "required": True},
            "package_manager": {"type": "str", "choices": ["dpkg", "rpm"], "default": "dpkg"},
            "packages": {"type": "list", "elements": "str", "default": []},
            "files": {"type": "list", "elements": "path", "default": []},
            "sysctls": {"type": "dict", "default": {}},
            "modules": {"type": "list", "elements": "str", "default": []},
            "services": {"type": "dict", "default": {}},
            "limits": {"type": "dict", "default": {}},
            "content_max_bytes": {"type": "int", "default": 65536},
        },
        supports_check_mode=True,
    )
    p = module.params
    if not p["role"]:
        module.fail_json(msg="role is empty: include _common's expected_state.yml from a role")
    try:
        packages, holds = installed(p["package_manager"], p["packages"])
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        module.fail_json(msg=f"reading the installed versions failed: {exc}")
    document = {
        "schema": SCHEMA,
        "role": p["role"],
        "packages": packages,
        "files": digests(p["files"]),
        "content": contents(p["files"], max(p["content_max_bytes"], 0)),
        "sysctls": p["sysctls"],
        "modules": p["modules"],
        "services": p["services"],
        "limits": p["limits"],
    }
    if holds:  # a record without holds keeps its bytes (and its changed=false)
        document["holds"] = holds
    # The same bytes Ansible's to_nice_json(indent=2, sort_keys=true) wrote before this module.
    text = json.dumps(document, indent=2, sort_keys=True, separators=(",", ": "))
    text += "\n"
    path = Path(p["dir"]) / (p["role"] + ".json")
    try:
        current = path.read_text(encoding="utf-8")
    except OSError:
        current = None
    changed = current != text
    if changed and not module.check_mode:
        try:
            write_atomically(path, text)
        except OSError as exc:
            module.fail_json(msg=f"writing {path} failed: {exc}")
    # The record as returned leaves the contents out: the play's output stays a few lines.
    summary = {k: v for k, v in document.items() if k != "content"}
    module.exit_json(changed=changed, path=str(path), record=summary)


def write_atomically(path, text):
    """``path`` holds ``text`` (mode 0644) or, on an error, what it held before: no partial file."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        Path(tmp).chmod(0o644)
        Path(tmp).replace(path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        raise


if __name__ == "__main__":
    main()
