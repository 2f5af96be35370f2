"""benchmarks/cold_start.py reads its targets as the speed issue states them: ECE's first call within 1 s, the TS / SVS /
SMS first fits (import included, on both sides) within 2x probmetrics', every other first call within 3x its warm call;
the demo's first run within 1.5x its second."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

cold_start = pytest.importorskip("cold_start")


def _row(table: str, case: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(f"| {case} |"))


def test_the_targets_are_read_as_the_issue_states_them():
    ours = {"import": 1.5, "first": 2.5, "warm": 0.01, "compiles": {"k": 2.0}}
    results = {
        "cases": {
            "ece 1e4 x 100": {"ours": {**ours, "first": 0.9}},
            "temperature_scaling 5e3 x 100": {
                "ours": ours,  # 4.0 s from the import against 2.1 s: 1.9x, met
                "peer": {"import": 2.0, "first": 0.1, "warm": 0.05},
                "peer_name": "probmetrics",
            },
            "svs 5e3 x 100": {
                "ours": ours,  # 4.0 s against 1.9 s: 2.1x, not met
                "peer": {"import": 1.8, "first": 0.1, "warm": 0.05},
                "peer_name": "probmetrics",
            },
            "nll 5e3 x 100": {"ours": {**ours, "first": 0.03}},  # 3x its warm call: met
            "brier 5e3 x 100": {"ours": {**ours, "first": 0.031}},
        },
        "demo": {"first": 30.0, "second": 20.0},
    }
    table = cold_start.section(results)
    assert _row(table, "ece 1e4 x 100").endswith("first <= 1 s: met |")
    assert "1.90x" in _row(table, "temperature_scaling 5e3 x 100") and "': met |" in _row(
        table, "temperature_scaling 5e3 x 100"
    )
    assert "2.11x" in _row(table, "svs 5e3 x 100") and "not met" in _row(table, "svs 5e3 x 100")
    assert _row(table, "nll 5e3 x 100").endswith("first <= 3x warm: met |")
    assert _row(table, "brier 5e3 x 100").endswith("first <= 3x warm: not met |")
    assert "1.50x (target <= 1.5x: met)" in table
