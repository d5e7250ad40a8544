"""loadtests/depths.py at a small scale: every phase answered, the full depth's forward
passes all at the full depth, a mix's at several depths, none mixing them."""

from __future__ import annotations

import pytest

from loadtests import depths

pytestmark = pytest.mark.slow  # a real server in a subprocess, under load


def test_every_phase_is_answered_at_its_depths(exports, tiny_checkpoints, tmp_path):
    exports(tiny_checkpoints["minialbert", "embed"], tmp_path / "repo" / "mini", "onnx",
            "keep")
    figures = depths.run(tmp_path / "repo", "mini", clients=8, seconds=1.5, rounds=1,
                         out=tmp_path / "out")
    assert figures["iterations"] == {"min": 1, "max": 3, "default": 3}
    phases = {name: runs[0] for name, runs in figures["phases"].items()}
    assert list(phases) == ["full", "depth 1", "depth 2", "depth 3", "mixed"]
    for name, run in phases.items():
        assert run["requests"] > 0 and set(run["statuses"]) == {200}, (name, run)
    assert set(phases["full"]["passes_by_depth"]) == {"3"}
    assert set(phases["depth 1"]["passes_by_depth"]) == {"1"}
    assert len(phases["mixed"]["passes_by_depth"]) > 1
