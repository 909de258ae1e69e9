"""An OpenAI Agents SDK agent whose web_fetch tool waits for a human's approval in
Tollgate.

The model is scripted (no network, no API key): it calls web_fetch on a page, then
answers with what the tool returned. Run it with `make run`'s export lines pasted:

    TOLLGATE_URL=… AGENT_TOKEN=… python examples/openai_agents_agent.py

When it prints "waiting for approval: tollgate approve RUN REQUEST", approve (or deny)
in another shell: TOLLGATE_TOKEN=$OPERATOR_TOKEN tollgate approve RUN REQUEST.
FETCH_URL is the page to fetch (default: a page it serves itself on loopback).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
from agents import Agent, ModelResponse, Runner, Usage, set_tracing_disabled
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from _stub import hits, serve_page
from tollgate import AsyncClient
from tollgate.adapters.openai_agents import gated_function_tool


class ScriptedModel(Model):
    """Calls web_fetch once, then reports the tool's output."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        items = args[1] if len(args) > 1 else kwargs.get("input", [])
        outputs = [
            i.get("output")
            for i in (items if isinstance(items, list) else [])
            if isinstance(i, dict) and i.get("type") == "function_call_output"
        ]
        if not outputs:
            call = ResponseFunctionToolCall(
                type="function_call",
                id="fc-1",
                call_id="call-1",
                name="web_fetch",
                arguments=json.dumps({"url": self.url}),
                status="completed",
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = ResponseOutputText(type="output_text", text=f"Done: {outputs[-1]}", annotations=[])
        message = ResponseOutputMessage(
            type="message", id="msg-1", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("this example does not stream")


async def web_fetch(url: str) -> str:
    """Fetch a web page and return the start of its text.

    Args:
        url: The page to fetch.
    """
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.get(url)
    return f"{response.status_code} {response.text[:80]}"


async def main() -> int:
    set_tracing_disabled(True)
    fetch_url = os.environ.get("FETCH_URL") or serve_page()
    async with AsyncClient(os.environ["TOLLGATE_URL"], token=os.environ["AGENT_TOKEN"]) as client:
        run = await client.create_run(
            owner=os.environ.get("RUN_OWNER", "local-operator"),
            budget={"tools": {"web_fetch": 1}, "call_ceiling": 3},
        )
        print(f"run {run.run_id}", flush=True)

        def pending(tool_name: str, request_id: str) -> None:
            print(f"waiting for approval: tollgate approve {run.run_id} {request_id}", flush=True)

        agent = Agent(
            name="fetcher",
            instructions="Read the page the user names.",
            model=ScriptedModel(fetch_url),
            tools=[gated_function_tool(web_fetch, run, on_pending=pending)],
        )
        result = await Runner.run(agent, "Read the docs page.")
        print(f"agent: {result.final_output}", flush=True)
        print(f"page requests: {hits() if not os.environ.get('FETCH_URL') else 'n/a'}")
        ended = await run.complete()
        print(f"run {ended.status} at sequence {ended.sequence}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
