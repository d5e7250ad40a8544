"""loadtests/engine_alone.py: the shared engine process driven alone answers every request
and says what each cost it, and leaves no folder of its own behind."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from loadtests import engine_alone


@pytest.mark.slow
def test_the_engine_alone_is_driven_and_its_cpu_counted(exports, tiny_checkpoints, tmp_path):
    exports(tiny_checkpoints["bert", "embed"], tmp_path / "repo" / "embed", "onnx", check=False)
    folders = set(Path(tempfile.gettempdir()).glob("engine-alone-*"))
    assert engine_alone.main(["--model-repository", str(tmp_path / "repo"), "--emulate-gpu",
                              "--clients", "1", "8", "--seconds", "0.5",
                              "--out", str(tmp_path / "out")]) == 0
    rows = json.loads((tmp_path / "out" / "engine_alone.json").read_text())
    assert [r["clients"] for r in rows] == [1, 8]
    assert all(r["requests_per_s"] > 0 and r["engine_cpu_us_per_request"] > 0 for r in rows)
    assert set(Path(tempfile.gettempdir()).glob("engine-alone-*")) == folders
