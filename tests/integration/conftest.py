"""Integration-test guard: a module's shared lab must stay on one xdist worker.

``make test-lab`` runs the lab modules three at a time with ``--dist loadgroup``; every test of a
module that shares one lab carries ``xdist_group``. If the grouping silently stops working (it
did with pytest 9.2 and pytest-xdist 3.8, pytest-xdist#1386), each worker brings up and tears
down the same lab under the others. This check fails the module before its lab starts instead.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", autouse=True)
def _one_worker_per_lab(request: pytest.FixtureRequest) -> None:
    """Before a module's lab comes up: fail if its grouped tests were spread over workers."""
    if not getattr(request.config.option, "loadgroup", False):
        return  # not an xdist worker of a --dist loadgroup run
    lost = [
        item.nodeid
        for item in request.session.items
        if getattr(item, "module", None) is request.module
        and item.get_closest_marker("xdist_group") is not None
        and "@" not in item.nodeid
    ]
    if lost:
        pytest.fail(
            "--dist loadgroup did not group these tests (pytest / pytest-xdist mismatch, see "
            f"pytest-xdist#1386): {', '.join(lost[:3])}"
        )
