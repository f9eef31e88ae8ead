"""Every file of scenarios/ played through the Python API, judged by the
shared runner (the same traces as Rust and C)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scenario_face import play

ROOT = Path(__file__).resolve().parents[3]
RUNNER = Path(os.environ.get("DLOCK_SCENARIO_LIB", ROOT / "target" / "release" / "libdlock_scenarios.so"))


def test_every_scenario_plays_with_the_expected_trace() -> None:
    if not RUNNER.exists():
        pytest.fail(f"{RUNNER} is missing: cargo build --release -p dlock-scenarios")
    files = sorted((ROOT / "scenarios").glob("*.json"))
    assert len(files) >= 22, files
    failures = play(str(RUNNER), str(ROOT / "scenarios"))
    assert failures == 0, f"{failures} scenario(s) failed: see the reports above"
