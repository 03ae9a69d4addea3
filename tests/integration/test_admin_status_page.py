"""The admin endpoint's status page in headless Chromium, on a real `kipside serve`
in front of Tansu.

- test_status_page_in_headless_chromium: GET / in headless Chromium: the live figures fill in
  (connection count and rule version as /status.json has them); a screenshot is saved.

Run: .venv/bin/pytest tests/integration/test_admin_status_page.py -q -p no:cacheprovider
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import confluent_kafka as ck
import pytest
from conftest import DIRECT, fresh_topic

from .admin_stack import AdminStack
from .admin_stack import admin_stack as admin_stack
from .clients_confluent import ck_config

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(DIRECT, reason="KIPSIDE_TEST_DIRECT=1: no kipside to ask"),
]


CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(
        "headless Chromium is not installed (Debian package `chromium`): run `make system-deps` "
        "or `apt-get install -y chromium` to run the status page test"
    )


def _run_chromium(chromium: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = Path(tempfile.mkdtemp(prefix="chromium-", dir=tmp_path))
    return subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_status_page_in_headless_chromium(
    admin_stack: AdminStack, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    chromium = _chromium()
    stack = admin_stack
    topic = fresh_topic(stack.kipside.bootstrap, "status", 2, request)
    producer = ck.Producer(ck_config(stack.kipside.bootstrap, **{"linger.ms": 0}))
    try:
        for i in range(50):
            producer.produce(topic, f"m{i}".encode(), partition=i % 2)
            producer.poll(0)
        assert producer.flush(15) == 0
        status = stack.get("/status.json").json()
        connections = status["connections"]["client"]
        version = status["rules"]["version"]
        assert connections >= 1  # the idle producer stays connected while the page loads
        url = f"http://127.0.0.1:{stack.admin_port}/"

        # Virtual time runs the page's 1 s refresh a few times, then the DOM is printed.
        dom = _run_chromium(chromium, tmp_path, "--virtual-time-budget=4000", "--dump-dom", url)
        assert dom.returncode == 0, dom.stderr[-2000:]
        html = dom.stdout
        updates = re.search(r'<body data-updates="(\d+)"', html)
        assert updates and int(updates.group(1)) >= 2, html[:500]
        assert '<span id="state" class="live">live</span>' in html
        assert f'id="client-connections">{connections}</div>' in html
        assert f'id="rules-version">{version}</div>' in html
        assert re.search(r"<td>Produce</td><td>[\d.]+</td>", html), html

        screenshot = tmp_path / "status-page.png"
        shot = _run_chromium(
            chromium,
            tmp_path,
            "--virtual-time-budget=3000",
            "--window-size=1100,760",
            "--hide-scrollbars",
            f"--screenshot={screenshot}",
            url,
        )
        assert shot.returncode == 0, shot.stderr[-2000:]
        assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert screenshot.stat().st_size > 10_000
        print(f"status page screenshot: {screenshot}")
    finally:
        producer.flush(5)
