"""``python3 -m gpuforge_sim TOOL ARGS...``: run a simulated tool (tests and debugging)."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
