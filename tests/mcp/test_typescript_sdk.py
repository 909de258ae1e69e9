"""A smoke test with the official TypeScript MCP SDK (tests/mcp/ts/smoke.mjs, the SDK
pinned in tests/mcp/ts/package-lock.json, installed by tests/harness/mcp.sh): initialize,
tools/list and an approved call, then the run's events as the operator replays them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from conftest import ECHO, OPERATOR, TOLLGATE, Server, types_of, unique_name

pytestmark = pytest.mark.anyio
TS = Path(__file__).resolve().parent / "ts"


async def test_the_typescript_sdk_lists_and_makes_an_approved_call(server: Server) -> None:
    node = shutil.which("node")
    if not node or not (TS / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        pytest.fail("node and tests/mcp/ts/node_modules are needed (tests/harness/mcp.sh runs npm ci there)")
    name = unique_name("ts")
    env = dict(
        os.environ,
        TOLLGATE_BIN=str(TOLLGATE),
        TOLLGATE_MCP_ECHO=str(ECHO),
        TOLLGATE_URL=server.url,
        AGENT_TOKEN=server.agent_token,
        OPERATOR_TOKEN=server.operator_token,
        NAME=name,
    )
    out = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [node, "smoke.mjs"], cwd=TS, env=env, capture_output=True, text=True, timeout=60, check=False
        )
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["server"]["name"] == "tollgate-mcp-echo"
    echo = next(t for t in seen["tools"] if t["name"] == "echo")
    assert echo["annotations"] == {"readOnlyHint": True}
    assert {t["name"] for t in seen["tools"]} == {"echo", "append", "hang", "crash"}
    assert seen["card"]["tool_name"] == f"mcp__{name}__echo"
    assert seen["decided"]["state"] == "approved" and seen["decided"]["decided_by"] == OPERATOR
    assert seen["result"]["content"] == [{"type": "text", "text": "from typescript"}]
    assert not seen["result"].get("isError")
    run = seen["card"]["run_id"]
    await server.wait_terminal(run)
    events = await server.events(run)
    (done,) = [e for e in events if e["type"] == "tool_execution"]
    assert (done["tool_call_id"], done["mutation_outcome"]) == (seen["card"]["tool_call_id"], "completed")
    assert types_of(events)[-1] == "run_completed"
