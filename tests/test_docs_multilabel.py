"""docs/multilabel.md: its ```python blocks run as written, in order, in one namespace (as a reader would paste them)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

DOC = Path(__file__).resolve().parents[1] / "docs" / "multilabel.md"


def test_python_blocks_run(capsys):
    torch.set_num_threads(1)
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 5
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{DOC.name}[block {i}]", "exec"), namespace)  # noqa: S102 - the page's own code
    out = capsys.readouterr().out
    assert "pooled (micro)" in out and "false_negative_rate" in out
