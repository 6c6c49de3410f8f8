"""Where gpuforge finds its own files, from a checkout or from an installed wheel.

The roles, playbooks, validators, the lab (image recipe, package sources, simulator), the example
topologies and ``ansible.cfg`` live at the repository root, beside ``src/``. A wheel carries the
same tree inside the package as ``gpuforge/_project/`` (``pyproject.toml``,
``[tool.hatch.build.targets.wheel.force-include]``). :func:`project_path` is the one place that
knows which of the two applies; nothing else computes the repository root.

What gpuforge writes (the lab's ``build/`` outputs and ``.lab/`` state) goes under
:func:`work_dir`: the checkout when running from one, else the current directory, since an
installed package's directory is no place for state.
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
#: What a wheel carries (force-include in pyproject.toml).
_SHIPPED = _PACKAGE / "_project"
#: src/gpuforge -> the repository root, in a checkout (editable install or PYTHONPATH=src).
_CHECKOUT = _PACKAGE.parents[1]


def _from_checkout() -> bool:
    return not _SHIPPED.is_dir() and (_CHECKOUT / "roles").is_dir()


def project_path(*parts: str) -> Path:
    """A file or directory of the project: ``project_path("roles")``, ``("lab", "sim")``.

    With no argument, the directory that holds ``roles/``, ``playbooks/``, ``validators/``,
    ``lab/``, ``examples/`` and ``ansible.cfg``.
    """
    root = _CHECKOUT if _from_checkout() else _SHIPPED
    return root.joinpath(*parts)


def work_dir() -> Path:
    """Where gpuforge keeps what it builds and its lab state (``build/``, ``.lab/``).

    ``$GPUFORGE_WORK_DIR`` when set; else the checkout's root when running from a checkout (so
    that ``make`` and ``gpuforge`` share one lab); else the current directory.
    """
    env = os.environ.get("GPUFORGE_WORK_DIR")
    if env:
        return Path(env).resolve()
    return _CHECKOUT if _from_checkout() else Path.cwd().resolve()
