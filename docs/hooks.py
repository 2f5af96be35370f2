"""MkDocs hook: show benchmarks/RESULTS.md and the plots under benchmarks/results/ in the site, without copies.

``results.md`` (the page "Benchmark results") is generated from ``benchmarks/RESULTS.md`` at build time, and every
picture of ``benchmarks/results/`` is served as ``results/<name>``, where that page's links (and the other pages'
``results/...`` / ``../results/...`` links) find it. Run ``python benchmarks/assemble_results.py`` to refresh the
file itself.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
PICTURES = ("*.png", "*.svg", "*.jpg")


def on_files(files: Files, config) -> Files:
    files.append(File.generated(config, "results.md", abs_src_path=str(RESULTS)))
    folder = ROOT / "benchmarks"
    for pattern in PICTURES:
        for path in sorted((folder / "results").glob(pattern)):
            files.append(
                File(
                    path.relative_to(folder).as_posix(),
                    src_dir=str(folder),
                    dest_dir=config["site_dir"],
                    use_directory_urls=config["use_directory_urls"],
                )
            )
    return files
