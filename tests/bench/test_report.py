"""The report's charts where the measuring machine has no matplotlib (the lent GPU's):
REPORT.md is written, and ``python -m distilserve.bench.report`` draws the charts from results.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from distilserve.bench import report

PNG = b"\x89PNG\r\n\x1a\n"
CHARTS = ("throughput.png", "memory.png", "params.png", "fidelity.png")


def _committed() -> list[dict]:
    """The committed CPU run's rows (the harness's own output)."""
    return json.loads((Path(__file__).parents[2] / "bench" / "results.json").read_text())["results"]


def test_without_matplotlib_the_report_is_written_and_the_charts_drawn_later(
        tmp_path, monkeypatch, capsys):
    results = _committed()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # importing it fails
    report.write(tmp_path, results, {"fp32": 100e9}, {}, {"torch": "2.13.0"})
    assert "| BERT-base vs DistilBERT (speed) | 0.50 |" in (tmp_path / "REPORT.md").read_text()
    assert not any((tmp_path / chart).exists() for chart in CHARTS)
    assert f"`python -m distilserve.bench.report {tmp_path}` draws them" in capsys.readouterr().err

    monkeypatch.undo()  # matplotlib back, as on the machine the results are brought to
    (tmp_path / "results.json").write_text(json.dumps({"results": results}))
    assert report.main([str(tmp_path)]) == 0
    for chart in CHARTS:
        assert (tmp_path / chart).read_bytes()[:8] == PNG


def test_drawing_needs_a_folder_with_results(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "usage: python -m distilserve.bench.report FOLDER" in capsys.readouterr().err


def test_no_charts_where_no_row_was_measured(tmp_path, capsys):
    """Every row failed: no chart is drawn (it would have empty axes and a legend with
    nothing in it), and the report says so."""
    failed = [{**r, "error": "CUDA graphs need a GPU"} for r in _committed()]
    report.write(tmp_path, failed, {"fp32": 100e9}, {}, {"torch": "2.13.0"})
    assert (tmp_path / "REPORT.md").exists()
    assert not any((tmp_path / chart).exists() for chart in CHARTS)
    assert "charts not drawn: no row was measured" in capsys.readouterr().err


def test_students_alone_get_their_chart_and_no_empty_ones(tmp_path):
    """(``bench --students DIR --models`` naming students only)"""
    students = [r for r in _committed() if "fidelity" in r]
    assert students
    report.write(tmp_path, students, {"fp32": 100e9}, {}, {"torch": "2.13.0"})
    assert [c for c in CHARTS if (tmp_path / c).exists()] == ["fidelity.png"]
    written = (tmp_path / "REPORT.md").read_text()  # no image that is not drawn
    assert "fidelity.png" in written and not any(c in written for c in CHARTS[:3])


def _gpu_training() -> list[dict]:
    """The committed GPU fine-tuning run's rows: fp32 and fp16 in one folder."""
    folder = Path(__file__).parents[2] / "bench" / "gpu" / "training"
    return json.loads((folder / "results.json").read_text())["results"]


def test_fine_tuning_rows_get_a_section_per_dtype_and_the_large_claims(tmp_path):
    rows = _gpu_training()
    assert {r["dtype"] for r in rows} == {"fp32", "fp16"}
    report.write(tmp_path, rows, {"fp16": 700e12}, {}, {"gpu": "NVIDIA H200", "cuda": "13.0"})
    written = (tmp_path / "REPORT.md").read_text()
    assert "NVIDIA H200 (CUDA 13.0)" in written and "max_memory_allocated" in written
    assert "peak RSS" not in written.split("## Fine-tuning")[0]
    fp32, fp16 = written.split("### fp32 on cuda")[1].split("### fp16 on cuda")
    for section in (fp32, fp16):
        assert "| LR-ALBERT-large vs ALBERT-large | memory 0.50, speed 2.00 |" in section
        assert "| F-ALBERT-large vs LR-ALBERT-large | memory 0.85, speed 1.40 |" in section
        assert "| ALBERT-large | 24 |" in section and "| LR-ALBERT-large | 12 |" in section
    assert "## The papers' claims" not in written  # no inference rows: no inference table
    assert (tmp_path / "training.png").read_bytes()[:8] == PNG


def test_the_inference_claims_leave_out_models_not_measured(tmp_path):
    report.write(tmp_path, _committed(), {"fp32": 100e9}, {}, {"torch": "2.13.0"})
    written = (tmp_path / "REPORT.md").read_text()
    assert "| LR-ALBERT vs ALBERT-base (speed) | 2.00 |" in written
    assert "ALBERT-large" not in written  # measured by --training only
