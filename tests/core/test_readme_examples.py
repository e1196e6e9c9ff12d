"""The README's examples, run as written against the live service: the "Try it" block (bash + curl) and the "From
Python" block (the Python client): examples that drift from the API fail here instead of in a new user's
terminal."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from tests.live_service import LiveService

pytestmark = pytest.mark.django_db(transaction=True)

README = Path(settings.BASE_DIR) / "README.md"


def try_it_block() -> str:
    text = README.read_text()
    section = text[text.index("## Try it"):]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match, "the Try it section has no sh block"
    return match.group(1)


def as_test_script(block: str, base_url: str) -> str:
    """The block with the service's address, curl failing on any HTTP error (printing the body), and the open-ended
    event stream bounded to two seconds."""
    script = block.replace("http://localhost:8080", base_url)
    script = script.replace("curl -s ", "curl -sS --fail-with-body ")
    script = re.sub(r"^curl -N (.*)$", r"curl -sS -N --max-time 2 -o /dev/null -w 'stream %{http_code}\\n' \1 || [ $? -eq 28 ]", script, flags=re.M)
    return "set -euo pipefail\n" + script


def test_the_readme_try_it_block_runs(live_service: LiveService) -> None:
    block = try_it_block()
    assert "curl -N " in block  # the stream example is still the last one, bounded by as_test_script()
    result = subprocess.run(
        ["bash", "-c", as_test_script(block, live_service.base_url)],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}\n{live_service.log_tail()}"
    out = result.stdout
    assert '"userId":"bob"' in out  # /v1/me
    assert "flat white" in out  # the memory read back
    assert "Plan a trip to Lisbon" in out  # the conversation's entries
    assert re.search(r"HTTP/1\.1 200 OK", out)  # the attachment download's headers
    assert "# Memory Service" in out  # the README itself, fetched through the signed link without a token
    assert "stream 200" in out  # the event stream opened (and stayed open until --max-time)


def python_blocks() -> list[str]:
    text = README.read_text()
    section = text[text.index("## From Python"):]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "the From Python and LangGraph section has a client block and a LangGraph block"
    return blocks


def python_block() -> str:
    return python_blocks()[0]


def test_the_readme_python_block_runs(live_service: LiveService) -> None:
    block = python_block()
    assert block.count("http://localhost:8080") == 1
    result = subprocess.run(
        [sys.executable, "-c", block.replace("http://localhost:8080", live_service.base_url)],
        cwd=settings.BASE_DIR,
        # The client from this checkout, installed or not.
        env={"PYTHONPATH": str(Path(settings.BASE_DIR) / "clients" / "python" / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}\n{live_service.log_tail()}"
    lines = result.stdout.splitlines()
    assert lines[0] == "{'likes': 'flat white'}"
    assert lines[1].startswith("not_found ")  # the error's code and request id
    assert lines[2] == "created"  # the live event of the append
    assert lines[3].endswith("[{'role': 'USER', 'text': 'Plan a trip to Lisbon'}]")


def test_the_readme_langgraph_block_runs(live_service: LiveService) -> None:
    from tests.conftest import TEST_API_KEY

    block = python_blocks()[1]
    assert block.count("http://localhost:8080") == 1
    result = subprocess.run(
        [sys.executable, "-c", block.replace("http://localhost:8080", live_service.base_url)],
        cwd=settings.BASE_DIR,
        env={"PYTHONPATH": str(Path(settings.BASE_DIR) / "clients" / "python" / "src"), "PATH": "/usr/bin:/bin",
             "MEMORY_SERVICE_API_KEY": TEST_API_KEY},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}\n{live_service.log_tail()}"
    assert result.stdout.splitlines() == [
        "['coffee']",  # the value filter, applied by the client
        "['hello', 'you said: hello', 'again', 'you said: again']",  # the thread resumed from its checkpoints
        "['human', 'ai']",
    ]
