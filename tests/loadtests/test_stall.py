"""loadtests/stall.py at a small scale: one client address stalling thousands of
connections in every way (half headers, a slow body, a Content-Length larger than its
body, idle keep-alive) takes nothing from the clients beside it, and each stalled
connection is closed by its deadline (distilserve/server/connections.py)."""

from __future__ import annotations

import pytest

from loadtests import stall

pytestmark = pytest.mark.slow  # thousands of connections

# time past a deadline that a closed connection may be seen to live: the event loops of
# the service and of the stalling process, each busy with thousands of connections
LATE_S = 5.0


def test_stalled_connections_from_one_address_leave_the_others_served(exports, tiny_checkpoints,
                                                                      tmp_path):
    exports(tiny_checkpoints["cmow", "embed"], tmp_path / "repo" / "cmow", "onnx")
    figures = stall.run(tmp_path / "repo", connections=4000, clients=16, seconds=6,
                        out=tmp_path / "out")
    served = figures["clients"]
    assert served["requests"] > 0 and set(served["statuses"]) == {200}, served
    stalled = figures["stalled"]
    assert stalled["never_closed"] == 0
    for kind, deadline in stall.KINDS.items():
        record = stalled["kinds"][kind]
        assert record["refused_503"] > 0, (kind, record)  # past the per-address cap
        assert record["closed"] > 0, (kind, record)
        assert record["longest_s"] <= stall.DEADLINES[deadline] + LATE_S, (kind, record)
        if deadline == "body_timeout":  # answered before closed
            assert set(record["statuses"]) == {"408"}, (kind, record)
    closed = figures["closed_by_the_service"]
    assert {reason for reason, n in closed.items() if n} == {
        "client_over_capacity", *stall.KINDS.values()}, closed
