"""benchmarks/RESULTS.md gathers the sections of benchmarks/results/: a plot linked beside its section still shows."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import assemble_results  # noqa: E402


def test_links_to_files_beside_a_section_point_into_results(tmp_path, monkeypatch):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.md").write_text(
        "## a\n\n![plot](curve.png) [raw](runs.json) [web](https://x.org/p.png) [up](../RESULTS.md) "
        "[there](results/b.png) [anchor](#a) ![abs](/tmp/c.png)\n"
    )
    monkeypatch.setattr(assemble_results, "HERE", tmp_path)
    monkeypatch.setattr(assemble_results, "SECTIONS", [("a.md", "a.py"), ("missing.md", "missing.py")])
    assemble_results.main()
    text = (tmp_path / "RESULTS.md").read_text()
    assert (
        "![plot](results/curve.png) [raw](results/runs.json) [web](https://x.org/p.png) [up](../RESULTS.md) "
        "[there](results/b.png) [anchor](#a) ![abs](/tmp/c.png)"
    ) in text
    assert "Not run yet: `python benchmarks/missing.py`." in text


def test_every_link_of_the_committed_results_resolves():
    import re

    text = (BENCHMARKS / "RESULTS.md").read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if not re.match(r"[a-z]+:|#", target):
            assert (BENCHMARKS / target).exists(), target
