"""loadtests/transports.py: each way of carrying the engine's frames is driven against its
echo, every request answered with the embedding sent, and reported side by side."""

from __future__ import annotations

import gc
import json

import pytest

from loadtests import transports


def test_the_report_gives_each_way_and_count_its_median_and_rounds():
    row = {"p50_ms": 0.1, "client_cpu_us": 5.0, "server_cpu_us": 4.0}
    rounds = [[{"way": "unix", "clients": 1, "requests_per_s": rate, **row}]
              for rate in (900.0, 1100.0, 1000.0)]
    table = transports.report(rounds).splitlines()
    assert table[2] == "| unix | 1 | 1,000 | 900, 1,100, 1,000 | 0.100 | 5.0 | 4.0 |"


@pytest.mark.slow
def test_every_way_is_driven_and_its_cpu_counted(tmp_path):
    assert transports.main(["--clients", "1", "8", "--seconds", "0.3", "--rounds", "1",
                            "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "transports.json").read_text())[0]
    assert [(r["way"], r["clients"]) for r in rows] == [
        (way, count) for way in transports.WAYS for count in (1, 8)]
    assert all(r["requests_per_s"] > 0 and r["client_cpu_us"] > 0 and r["server_cpu_us"] > 0
               for r in rows)
    assert "| zmq-each | 8 |" in (tmp_path / "transports.md").read_text()
    gc.collect()  # (a ZeroMQ context left open would wait here for ever, not in a later test)
