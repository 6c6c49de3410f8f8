"""Build ``gpuforge-node.pyz``: the node checker as one zipapp, run by the node's ``python3``.

The archive holds exactly the modules the node needs (:data:`MODULES`, package-relative paths
under ``src/gpuforge``), each with its hash-checked bytecode, and the Xid catalogue's data file,
read through the package loader so it works from inside the zip. Nodes need only Python 3.11 and
PyYAML (Debian's python3-yaml): no pip, no network. ``python -m gpuforge.node.bundle OUT`` is
what the health role runs on the controller; a unit test imports every module from the archive
with ``python3 -I``.
"""

from __future__ import annotations

import py_compile
import subprocess
import sys
import tempfile
import zipapp
import zipfile
from pathlib import Path

from gpuforge.errors import OperationError

NAME = "gpuforge-node.pyz"
SRC = Path(__file__).resolve().parents[1]  # src/gpuforge
INTERPRETER = "/usr/bin/python3"

#: What the node imports, relative to src/gpuforge (docs/architecture.md).
MODULES = (
    "__init__.py",
    "atomic.py",
    "textfile.py",
    "errors.py",
    "yamlbound.py",
    "validate/__init__.py",
    "validate/catalogue.py",
    "validate/checks.py",
    "validate/flaps.py",
    "validate/result.py",
    "validate/xid_catalogue.py",
    "validate/data/xid_catalogue.yaml",
    "validate/parsers/*.py",
    "node/*.py",
)

_MAIN = """\
import sys

from gpuforge.node.__main__ import main

sys.exit(main())
"""


def files() -> list[Path]:
    """Every source file the archive holds, relative to src/gpuforge (the bundler excluded)."""
    out: list[Path] = []
    for pattern in MODULES:
        found = sorted(SRC.glob(pattern))
        if not found:
            raise FileNotFoundError(f"{SRC / pattern}: missing from the source tree")
        out += [p.relative_to(SRC) for p in found if p.name != "bundle.py"]
    return out


def _add(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    # A fixed timestamp: the same sources give the same archive (the role's `copy` then reports
    # no change).
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    zf.writestr(info, data)


def _bytecode(source: bytes, name: str) -> bytes:
    """``source`` compiled to a hash-checked .pyc (PEP 552).

    zipimport cannot write bytecode, so without it every run would compile every module (a third
    of a run's start-up CPU). The hash ties the .pyc to its source, not to a timestamp; a node
    whose Python has another bytecode magic number ignores it and compiles the source.
    """
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "module.py"
        src.write_bytes(source)
        target = Path(tmp) / "module.pyc"
        py_compile.compile(
            str(src),
            cfile=str(target),
            dfile=name,
            doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
        )
        return target.read_bytes()


def build(out: Path) -> Path:
    """Write ``out/gpuforge-node.pyz`` (``out`` may also be the archive's path) and return it."""
    target = out if out.suffix == ".pyz" else out / NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for rel in files():
            name = f"gpuforge/{rel.as_posix()}"
            source = (SRC / rel).read_bytes()
            _add(zf, name, source)
            if rel.suffix == ".py":
                _add(zf, name + "c", _bytecode(source, name))
        main = zipfile.ZipInfo("__main__.py", date_time=(2020, 1, 1, 0, 0, 0))
        main.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(main, _MAIN)
    zipapp.create_archive(tmp, target, interpreter=INTERPRETER)
    tmp.unlink()
    target.chmod(0o755)
    return target


#: The health role's variable naming a prebuilt checker on the machine that runs Ansible.
ROLE_VAR = "health_bundle_src"
BUILD_TIMEOUT_S = 120


def ship(project: Path) -> str:
    """Build the checker into a play's ``project`` and return the ``health_bundle_src`` that
    names it there (a :class:`gpuforge.execution.sharded.ProjectInput` for plays run on
    execution hosts, whose runner has no gpuforge to build it with).

    ``python -m gpuforge.node.bundle`` in a fresh interpreter, as the health role runs it: built
    inside this process the archive's bytecode differs with what the process has imported
    (marshal marks objects by their reference counts), so every run would install a "changed"
    checker on every node (seen on d2exec: 1 change per converged node).
    """
    try:
        subprocess.run(
            [sys.executable, "-m", "gpuforge.node.bundle", str(project / NAME)],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=True,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise OperationError(f"building the node checker took over {BUILD_TIMEOUT_S} s") from None
    except subprocess.CalledProcessError as exc:
        raise OperationError(
            f"building the node checker failed: {exc.stderr.strip()[-300:]}"
        ) from None
    return "{{ playbook_dir }}/../" + NAME


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuforge.node.bundle OUT``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m gpuforge.node.bundle OUT_DIR_OR_FILE.pyz\n")
        return 2
    path = build(Path(args[0]))
    sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
