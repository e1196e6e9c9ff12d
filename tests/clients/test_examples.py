"""The example agent (clients/python/examples/langgraph_agent.py) run as a user runs it, against the live service:
a fact saved in one thread is recalled in a new one, and an interrupted thread resumes from its checkpoint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from tests.conftest import TEST_API_KEY
from tests.live_service import LiveService

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_tables_after_module")]

EXAMPLE = Path(settings.BASE_DIR) / "clients" / "python" / "examples" / "langgraph_agent.py"


def test_the_langgraph_agent_example_runs(live_service: LiveService) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=settings.BASE_DIR,
        env={
            "PATH": "/usr/bin:/bin",
            # The client from this checkout, installed or not.
            "PYTHONPATH": str(Path(settings.BASE_DIR) / "clients" / "python" / "src"),
            "MEMORY_SERVICE_URL": live_service.base_url,
            "MEMORY_SERVICE_API_KEY": TEST_API_KEY,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}\n{live_service.log_tail()}"
    assert result.stdout.splitlines() == [
        "thread A: saved: favourite city: Lisbon | Noted.",
        "thread B recalled: favourite city: Lisbon",
        "thread C interrupted: Book a trip to Lisbon?",
        "thread C resumed: booked a trip to Lisbon | Done: your trip to Lisbon is booked.",
        "thread C checkpoints: 5",
    ]
