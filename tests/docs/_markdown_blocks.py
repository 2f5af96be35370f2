"""The fenced code blocks of a markdown page, as the documentation tests run them.

A block is a fence (three or more backticks or tildes, indented as in a list item) whose info string starts with
``python`` or ``py``. An HTML comment on the line before the fence, invisible on the rendered page, tells the
tests something about the block:

* ``<!-- docs-test: skip REASON -->``: not run (the page itself must say why to its reader); only compiled.
* ``<!-- docs-test: shared-logits -->``: reads the real-logit files of the project's shared data folder, which the
  tests put in the page's working folder; skipped, with the rest of its page, where that folder is absent.
* ``<!-- docs-test: hub -->``: pushes to or loads from the Hub (the page must say so to its reader); run against a
  local stand-in for the Hub. Every other block runs without it, as a reader without the Hub runs it.
* ``<!-- docs-test: run -->`` before a shell block: its commands run, in the page's order among its python blocks, in
  the page's working folder (shell blocks are otherwise only read: installs, usage lines, multi-GPU launches).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PYTHON = ("python", "py", "python3")
SHELL = ("bash", "sh", "shell", "console")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<kind>skip|shared-logits|hub|run)\b\s*(?P<reason>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the block's first code line
    code: str  # dedented to the fence's indentation
    marker: str | None = None  # "skip" | "shared-logits" | "hub" | "run" | None
    reason: str = ""
    language: str = "python"  # the fence's info string's first word


def page_blocks(page: Path) -> list[Block]:
    """What the tests run of a page, in its order: every python block, and the shell blocks marked ``run``."""
    shell = [b for b in code_blocks(page, SHELL) if b.marker == "run"]
    return sorted(python_blocks(page) + shell, key=lambda b: b.line)


def python_blocks(page: Path) -> list[Block]:
    """The page's python blocks in order; other fences (bash, text, ...) are stepped over whole."""
    return code_blocks(page, PYTHON)


def code_blocks(page: Path, languages: tuple[str, ...]) -> list[Block]:
    """The page's fenced blocks in one of ``languages``, in order; other fences are stepped over whole."""
    lines = Path(page).read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None or (opening["fence"][0] == "`" and "`" in opening["info"]):
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        words = opening["info"].strip().lstrip("{.").split()
        language = words[0].rstrip("}").lower() if words else ""
        body, j = [], i + 1
        while j < len(lines):
            closing = FENCE.match(lines[j])
            if (
                closing
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
            ):
                break
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        if j == len(lines):
            raise ValueError(f"{page}:{i + 1}: a ``` fence that is never closed")
        if language in languages:
            marker, reason = None, ""
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            found = MARKER.match(lines[k]) if k >= 0 else None
            if found:
                marker, reason = found["kind"], found["reason"]
                if marker == "skip" and not reason:
                    raise ValueError(f"{page}:{k + 1}: `docs-test: skip` needs a reason")
            blocks.append(Block(Path(page), i + 2, "\n".join(body) + "\n", marker, reason, language))
        i = j + 1
    return blocks
