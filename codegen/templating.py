"""The one jinja2 set-up every generator uses: strict (a missing value is an error, never an empty string),
whitespace-exact, no HTML escaping (we write code)."""
from __future__ import annotations

import jinja2


def environment(templates: str) -> jinja2.Environment:
    """An environment over `codegen/<templates>/`."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("edgetrain.codegen", templates),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
