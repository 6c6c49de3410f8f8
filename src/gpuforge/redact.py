"""Secrets out of what leaves the cluster: RMA bundles, and any text gpuforge hands to a person.

:func:`scrub_text` cuts, from free text (a tool's output, a log excerpt, YAML, a command line):

* private-key blocks (``-----BEGIN ... PRIVATE KEY-----`` to its end, or to the end of the text);
* the value of every key that names a secret (``password``, ``passwd``, ``passphrase``,
  ``*_pass``, ``secret``, ``token``, ``api_key``, ``private_key``, ``munge_key``, ``credential``
  and the like; see :data:`KEY_NAMES`), whether written ``key=value``, ``key: value``,
  ``"key": "value"`` (JSON inside text stays JSON: only the string's content is replaced) or as a
  YAML block (``munge_key: |`` or ``munge_key:`` and the indented lines after it);
* HTTP credentials: ``Authorization: Bearer <token>`` / ``Basic <base64>``;
* the password of a URL's user information (``https://user:pass@host`` keeps ``user``);
* the password argument of the tools that take one on their command line (``ipmitool -P``,
  ``sshpass -p``, ``mysql -p…``, any ``--password``/``--passwd`` option).

:func:`scrub_json` does the same on parsed JSON: a value under a secret-named key is replaced
whole, any other string is scrubbed as text, so the document stays valid JSON. :func:`scrub_file`
picks one by the file's name.

Redaction errs on the side of cutting: a value that only looks like a secret is cut too. What is
never cut: the keys themselves (so a reader sees that a password was there) and text that names
no secret.
"""

from __future__ import annotations

import json
import re
from typing import Any

REDACTED = "[redacted by gpuforge]"

#: Key names that hold a secret, matched case-insensitively anywhere in the key
#: (``ansible_become_pass``, ``DB_PASSWORD``, ``client_secret``, ``MUNGE_KEY``).
KEY_NAMES = (
    r"[A-Za-z0-9_.-]*(?:passw(?:or)?d|passphrase|[_.-]pass|storage[_-]?pass|secret|token"
    r"|api[_-]?key|apikey|private[_-]?key|munge[_-]?key|credential|auth[_-]?key|access[_-]?key"
    r"|session[_-]?key)"
    r"[A-Za-z0-9_.-]*"
)
_SECRET_NAME = re.compile(rf"(?i)^{KEY_NAMES}$")

_PEM = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----"
    r".*?(?:-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|\Z)",
    re.DOTALL,
)
# key, an optional closing quote of the key, the separator, then a quoted or a bare value. A bare
# value stops at white space, a quote or a delimiter, so ``token=abc123"`` inside a JSON string
# keeps its closing quote.
_KEY_VALUE = re.compile(
    rf"""(?ix)
    (?P<key>\b{KEY_NAMES})
    (?P<sep>["']?[ \t]*[=:][ \t]*)
    (?:
        "(?P<dq>(?:[^"\\\n]|\\.)*)"
      | '(?P<sq>[^'\n]*)'
      | (?P<bare>(?![|>]\s*$)[^\s"'\\,;&}}\]]+)
    )
    """,
    re.MULTILINE,
)
# A YAML key naming a secret whose value is a block: ``key: |``, ``key: >-``, ``key: !vault |``
# or ``key:`` alone, followed by more-indented lines.
_YAML_BLOCK_KEY = re.compile(
    rf"(?i)^(?P<indent>[ \t]*-?[ \t]*)(?P<key>{KEY_NAMES})[ \t]*:"
    r"[ \t]*(?:!\S+[ \t]*)?(?:[|>][-+0-9]*)?[ \t]*(?:#.*)?$"
)
_AUTH = re.compile(r"(?i)\b(?P<scheme>bearer|basic)(?P<sp>\s+)[A-Za-z0-9._~+/-]{8,}=*")
_URL_USERINFO = re.compile(r"(?i)\b(?P<head>[a-z][a-z0-9+.-]*://[^\s/:@\"']+):[^\s/@\"']+@")
# Tools that take a password as an argument: the argument after -P (ipmitool) / -p (sshpass),
# attached to -p (mysql, mariadb, mysqldump), or after --password / --passwd.
_PASSWORD_ARG = (
    re.compile(r"(?P<head>\bipmitool\b[^\n]*?\s-P\s*)(?P<value>\S+)"),
    re.compile(r"(?P<head>\bsshpass\b[^\n]*?\s-p\s*)(?P<value>\S+)"),
    re.compile(r"(?P<head>\b(?:mysql|mariadb|mysqldump|mysqladmin)\b[^\n]*?\s-p)(?P<value>\S+)"),
    re.compile(r"(?i)(?P<head>--passw(?:or)?d(?:=|\s+))(?P<value>[^\s\"']+)"),
)


def is_secret_key(name: str) -> bool:
    """Whether a key (of a mapping, a variable, an option) names a secret."""
    return bool(_SECRET_NAME.match(name.strip().strip("\"'")))


def scrub_text(text: str) -> str:
    """``text`` with every secret value above replaced by :data:`REDACTED`."""
    text = _PEM.sub(REDACTED, text)
    text = _yaml_blocks(text)
    text = _AUTH.sub(lambda m: f"{m['scheme']}{m['sp']}{REDACTED}", text)
    text = _URL_USERINFO.sub(lambda m: f"{m['head']}:{REDACTED}@", text)
    for pattern in _PASSWORD_ARG:
        text = pattern.sub(lambda m: f"{m['head']}{REDACTED}", text)
    return _KEY_VALUE.sub(_key_value, text)


def _key_value(m: re.Match[str]) -> str:
    head = f"{m['key']}{m['sep']}"
    if m["dq"] is not None:
        return f'{head}"{REDACTED}"'
    if m["sq"] is not None:
        return f"{head}'{REDACTED}'"
    return f"{head}{REDACTED}"


def _yaml_blocks(text: str) -> str:
    """Cut the indented lines that follow a YAML key naming a secret with no value on its line."""
    lines = text.split("\n")
    out: list[str] = []
    cutting_below: int | None = None
    for line in lines:
        if cutting_below is not None:
            stripped = line.strip()
            indent = len(line) - len(line.lstrip(" \t"))
            if not stripped or indent > cutting_below:
                if stripped:
                    out.append(line[:indent] + REDACTED)
                    continue
                out.append(line)
                continue
            cutting_below = None
        m = _YAML_BLOCK_KEY.match(line)
        if m:
            cutting_below = len(m["indent"].replace("-", " "))
        out.append(line)
    return "\n".join(out)


def scrub_json(value: Any) -> Any:
    """A copy of parsed JSON with secret-keyed values replaced and every string scrubbed."""
    if isinstance(value, dict):
        return {
            key: REDACTED if _holds_secret(str(key), item) else scrub_json(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [scrub_json(item) for item in value]
    if isinstance(value, str):
        return scrub_text(value)
    return value


def _holds_secret(key: str, item: Any) -> bool:
    if item is None:
        return False
    # A bare "pass" is a secret only as a string (``{"user": "u", "pass": "p"}``); as a number it
    # is a count of passing checks.
    return is_secret_key(key) or (key.lower() == "pass" and isinstance(item, str))


def scrub_file(name: str, text: str) -> str:
    """Scrub a file's text: structurally when ``name`` is ``*.json`` and parses, as text otherwise.

    A JSON file is written back with two-space indentation and sorted keys, as gpuforge writes its
    own; one that does not parse is scrubbed as text.
    """
    if name.endswith(".json"):
        try:
            data = json.loads(text)
        except ValueError:
            return scrub_text(text)
        return json.dumps(scrub_json(data), indent=2, sort_keys=True, default=str) + "\n"
    return scrub_text(text)
