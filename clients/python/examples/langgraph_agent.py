"""A LangGraph agent whose web_fetch tool waits for a human's approval in Tollgate.

The model is scripted (no network, no API key): it asks for web_fetch of a page, then
answers with what the tool returned. Run it with `make run`'s export lines pasted:

    TOLLGATE_URL=… AGENT_TOKEN=… python examples/langgraph_agent.py

When it prints "waiting for approval: tollgate approve RUN REQUEST", approve (or deny)
in another shell: TOLLGATE_TOKEN=$OPERATOR_TOKEN tollgate approve RUN REQUEST.
FETCH_URL is the page to fetch (default: a page it serves itself on loopback).
"""

from __future__ import annotations

import os
import sys

import httpx
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from _stub import hits, serve_page
from tollgate import Client
from tollgate.adapters.langgraph import gate_tools


@tool
def web_fetch(url: str) -> str:
    """Fetch a web page and return the start of its text."""
    response = httpx.get(url, timeout=10)
    return f"{response.status_code} {response.text[:80]}"


def main() -> int:
    fetch_url = os.environ.get("FETCH_URL") or serve_page()
    with Client(os.environ["TOLLGATE_URL"], token=os.environ["AGENT_TOKEN"]) as client:
        run = client.create_run(
            owner=os.environ.get("RUN_OWNER", "local-operator"),
            budget={"tools": {"web_fetch": 1}, "call_ceiling": 3},
        )
        print(f"run {run.run_id}", flush=True)

        def pending(tool_name: str, request_id: str) -> None:
            print(f"waiting for approval: tollgate approve {run.run_id} {request_id}", flush=True)

        model = FakeMessagesListChatModel(
            responses=[
                AIMessage(
                    content="",
                    tool_calls=[{"name": "web_fetch", "args": {"url": fetch_url}, "id": "call-1"}],
                ),
                AIMessage(content="Done."),
            ]
        )

        def agent(state: MessagesState) -> dict[str, list[object]]:
            return {"messages": [model.invoke(state["messages"])]}

        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_node("tools", ToolNode(gate_tools([web_fetch], run, on_pending=pending)))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        result = graph.compile().invoke({"messages": [HumanMessage("Read the docs page.")]})
        for message in result["messages"]:
            if isinstance(message, ToolMessage):
                print(f"tool result: {message.content}", flush=True)
        print(f"agent: {result['messages'][-1].content}", flush=True)
        print(f"page requests: {hits() if not os.environ.get('FETCH_URL') else 'n/a'}")
        ended = run.complete()
        print(f"run {ended.status} at sequence {ended.sequence}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
