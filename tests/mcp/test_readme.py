"""The README's MCP section, run as written where it can be: the curl block against the live service, the Claude
Desktop configuration launched as Claude Desktop would (with this checkout's entry point), the Cursor file and the
Claude Code command checked for the endpoint and the header they must carry."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from mcp import Client, StdioServerParameters

from tests.live_service import LiveService
from tests.mcp.conftest import D11_TOOLS, run, user_token

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_tables_after_module")]

README = Path(settings.BASE_DIR) / "README.md"
CLIENT_SOURCES = Path(settings.BASE_DIR) / "clients" / "python" / "src"


def section() -> str:
    text = README.read_text()
    start = text.index("## MCP: ")
    return text[start : text.index("\n## ", start + 1)]


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section(), re.S)


def test_the_curl_block_calls_a_tool(live_service: LiveService) -> None:
    curl_block = blocks("sh")[0]
    script = "set -euo pipefail\n" + curl_block.replace("http://localhost:8080", live_service.base_url).replace(
        "curl -s ", "curl -sS --fail-with-body "
    )
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["result"]["isError"] is False
    assert answer["result"]["structuredContent"]["namespace"] == ["user", "bob", "prefs"]


def test_the_claude_code_and_cursor_configurations_name_the_endpoint_and_the_token() -> None:
    claude = blocks("sh")[1].strip()
    assert claude.startswith("claude mcp add --transport http ")
    assert '--header "Authorization: Bearer $TOKEN"' in claude and claude.endswith(" http://localhost:8080/mcp")
    cursor, _desktop = (json.loads(block) for block in blocks("json"))
    server = cursor["mcpServers"]["memory-service"]
    assert server == {
        "url": "http://localhost:8080/mcp",
        "headers": {"Authorization": "Bearer ${env:MEMORY_SERVICE_TOKEN}"},
    }


def test_the_claude_desktop_configuration_serves_the_tools(live_service: LiveService) -> None:
    _cursor, desktop = (json.loads(block) for block in blocks("json"))
    server = desktop["mcpServers"]["memory-service"]
    assert Path(server["command"]).name == "memory-service-mcp"
    env = {
        **server["env"],
        "MEMORY_SERVICE_URL": server["env"]["MEMORY_SERVICE_URL"].replace("http://localhost:8080", live_service.base_url),
        "MEMORY_SERVICE_TOKEN": user_token(live_service, "bob"),
        "PYTHONPATH": str(CLIENT_SOURCES),
    }
    launched = StdioServerParameters(command=sys.executable, args=["-m", "memory_service.mcp_stdio"], env=env)

    async def listing():
        async with Client(launched, mode="legacy") as client:
            return {tool.name for tool in (await client.list_tools()).tools}

    assert run(listing) == D11_TOOLS
