"""The one report renderer: Jinja2 templates on one HTML layout, and one JUnit writer.

Every HTML page gpuforge writes (the validation report, the phase report, the conformance report
and the fleet heat map) is a template in ``gpuforge/reporting/templates/`` that extends
``base.html.j2``: one layout, one style sheet, values escaped by Jinja's autoescape, no file
loaded from the network. :func:`render_page` renders one; :mod:`gpuforge.reporting.junit` writes
the JUnit XML of the validation and conformance runs.
"""

from __future__ import annotations

import functools
from typing import Any

import jinja2


@functools.cache
def environment() -> jinja2.Environment:
    """The templates' environment (built once: loading it costs a few milliseconds)."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("gpuforge.reporting", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render_page(template: str, **context: Any) -> str:
    """``templates/<template>`` rendered with ``context``."""
    return environment().get_template(template).render(**context)
