"""The Model Context Protocol server at /mcp (D11): the REST API's memory and conversation operations as MCP tools,
for agents (Claude Code, Claude Desktop, Cursor, ...). apps.mcp.server is the endpoint, apps.mcp.tools the tools,
apps.mcp.metadata the protected-resource metadata MCP clients look for."""
