"""The LangGraph and OpenAI Agents examples, run as a user runs them, against the real
server: the test plays the operator over HTTP, approving one run's call and denying
another's."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tollgate import Client
from tollgate.operator import Operator

from .conftest import Server

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
WAITING = re.compile(r"^waiting for approval: tollgate approve (\S+) (\S+)$")


def run_example(server: Server, script: str, verdict: str) -> tuple[str, str]:
    """Runs ``script``; decides its card with ``verdict``; its output and run id."""
    env = dict(os.environ, TOLLGATE_URL=server.url, AGENT_TOKEN=server.agent_token)
    env.pop("FETCH_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-u", str(EXAMPLES / script)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    out: list[str] = []
    run_id = ""
    deadline = time.monotonic() + 90
    try:
        with Operator(server.url, server.operator_token) as op:
            while True:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
                if line is None:
                    break
                out.append(line)
                m = WAITING.match(line)
                if m:
                    run_id = m.group(1)
                    if verdict == "approve":
                        assert op.approve(run_id, m.group(2)).state == "approved"
                    else:
                        assert op.deny(run_id, m.group(2)).state == "denied"
        assert proc.wait(timeout=30) == 0, "\n".join(out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert run_id, "\n".join(out)
    return "\n".join(out), run_id


def event_types(server: Server, run_id: str) -> list[str]:
    answer = httpx.get(
        f"{server.url}/api/runs/{run_id}/events",
        params={"after": 0, "limit": 1000},
        headers={"authorization": f"Bearer {server.operator_token}"},
        timeout=10,
    )
    answer.raise_for_status()
    return [e["type"] for e in answer.json()["events"]]


@pytest.mark.parametrize("script", ["langgraph_agent.py", "openai_agents_agent.py"])
def test_example_reaches_an_approved_call(server: Server, script: str) -> None:
    out, run_id = run_example(server, script, "approve")
    assert "200 Tollgate docs" in out, out
    assert "page requests: 1" in out, out
    assert "not approved" not in out
    types = event_types(server, run_id)
    assert types.count("tool_execution_started") == 1
    assert types.count("tool_execution") == 1
    assert types[-1] == "run_completed"


@pytest.mark.parametrize("script", ["langgraph_agent.py", "openai_agents_agent.py"])
def test_example_reaches_a_denied_call(server: Server, script: str) -> None:
    out, run_id = run_example(server, script, "deny")
    assert "was not approved (denied by alice)" in out, out
    assert "page requests: 0" in out, out
    types = event_types(server, run_id)
    assert "tool_execution_started" not in types
    assert types.count("tool.approval_resolved") == 1
    assert types[-1] == "run_completed"


def test_gated_decorator(server: Server) -> None:
    """``@gated`` on a plain function: runs after approval, never after a denial."""
    from tollgate import ToolDenied, gated, use_run

    calls: list[str] = []

    @gated("web_fetch")
    def fetch(url: str) -> str:
        calls.append(url)
        return f"fetched {url}"

    with (
        Client(server.url, token=server.agent_token) as client,
        Operator(server.url, server.operator_token) as op,
    ):
        run = client.create_run(owner="alice", budget={"tools": {"web_fetch": 2}})

        def decide(verdict: str) -> None:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                cards = op.pending(run.run_id)
                if cards:
                    if verdict == "approve":
                        op.approve(run.run_id, cards[0]["request_id"])
                    else:
                        op.deny(run.run_id, cards[0]["request_id"])
                    return
                time.sleep(0.02)

        with use_run(run):
            t = threading.Thread(target=decide, args=("approve",))
            t.start()
            assert fetch("https://example.com/a") == "fetched https://example.com/a"
            t.join()
            t = threading.Thread(target=decide, args=("deny",))
            t.start()
            with pytest.raises(ToolDenied):
                fetch("https://example.com/b")
            t.join()
        assert calls == ["https://example.com/a"]
