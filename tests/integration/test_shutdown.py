"""kipside's own stop: SIGTERM after traffic ends with the shutdown lines, exit status 0, and
no lane reported as closed by the broker (kipside closed them itself).

Run: .venv/bin/pytest tests/integration/test_shutdown.py -q -p no:cacheprovider
"""

from __future__ import annotations

from pathlib import Path

from conftest import create_topics, skip_unless_shared_lanes, unique_name
from testkit.broker import Broker
from testkit.kipside import start_kipside

from .clients import make_messages
from .clients_confluent import ck_produce


def test_a_stop_after_traffic_blames_no_broker(tansu: Broker, tmp_path: Path) -> None:
    """The lanes' readers are cancelled at shutdown: that close is kipside's own, so no lane
    may be logged as 'broker closed the connection' or counted in kipside_lane_failures_total."""
    skip_unless_shared_lanes("the shared lanes' shutdown")
    kipside = start_kipside(tansu, tmp_path / "kipside")
    try:
        topic = unique_name("shutdown")
        create_topics(kipside.bootstrap, [topic], 2)
        ck_produce(kipside.bootstrap, topic, make_messages(20, 2, tag="stop"))
        assert kipside.wait_for_log(lambda line: "kipside.lanes" in line and " open" in line)
    finally:
        code = kipside.stop()
    log = kipside.log()
    assert code == 0, log[-2000:]
    assert "stopped; Produce requests: " in log, log[-2000:]
    lanes = [line for line in log.splitlines() if "kipside.lanes" in line]
    assert not [line for line in lanes if "broker closed" in line], lanes
