"""Griffe extension for the API reference: read a Google-style ``Example:`` section as ``Examples:``.

The docstrings' examples are doctests under ``Example:``, which griffe would render as a note of plain text
(``>>>`` lines as prose, ``[...]`` outputs as broken links); as an ``Examples:`` section they render as code.
"""

from __future__ import annotations

import re

from griffe import Extension

_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)


class ExampleSections(Extension):
    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
