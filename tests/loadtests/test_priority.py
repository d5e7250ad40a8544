"""loadtests/priority.py: a query client beside bulk clients, the bulk at priority 0 and at
1 in turn, every request answered."""

from __future__ import annotations

import json

import pytest

from loadtests import priority


@pytest.mark.slow
def test_the_queries_and_the_bulk_are_driven_at_each_priority(exports, tiny_checkpoints,
                                                               tmp_path):
    exports(tiny_checkpoints["bert", "embed"], tmp_path / "repo" / "embed", "onnx", check=False)
    assert priority.main(["--model-repository", str(tmp_path / "repo"), "--model", "embed",
                          "--bulk-clients", "2", "--per-request", "4", "--rounds", "1",
                          "--seconds", "0.5", "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "priority.json").read_text())
    assert [r["bulk_priority"] for r in report["rows"]] == [0, 1]
    for row in report["rows"]:
        assert row["queries"]["requests"] > 0 and row["bulk_sentences_per_s"] > 0
        assert set(row["queries"]["statuses"]) == set(row["bulk"]["statuses"]) == {"200"}  # (JSON keys)
