"""Where a node's simulator state lives: the one module the others read it from.

A leaf: it imports nothing of the simulator, so :mod:`.state` (the runtime view of the file)
and :mod:`.lifecycle` (what cleared which fault, in ``cleared.json`` beside it) both use it
without importing each other both ways.
"""

from __future__ import annotations

import os
from pathlib import Path

STATE_PATH = Path("/var/lib/gpuforge-sim/state.json")
# Test-only override, read by the simulator alone (never by gpuforge's production code).
ENV_STATE = "GPUFORGE_SIM_STATE"


def state_path() -> Path:
    """The state file: ``$GPUFORGE_SIM_STATE`` when set, else :data:`STATE_PATH`."""
    return Path(os.environ.get(ENV_STATE) or STATE_PATH)
