"""LangGraph / LangChain: tools whose every call waits on a Tollgate card.

::

    from langgraph.prebuilt import ToolNode
    from tollgate.adapters.langgraph import gate_tools

    tools = ToolNode(gate_tools([web_fetch], run))

The graph's tool node arms a card for each call (bound to its arguments) and waits there
— the graph is suspended on the card — until an operator decides. Approved, the tool runs
under the execution guard (dispatched right before it runs, settled by what happened);
denied or expired, the tool does not run and the model gets a message saying so.
Works with a blocking :class:`~tollgate.Run` (``graph.invoke``) or an
:class:`~tollgate.AsyncRun` (``await graph.ainvoke``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool

from .._async import AsyncRun
from .._sync import Run
from ._common import PendingHook, call_async, call_sync, denied_text


def gate_tool(
    tool: BaseTool,
    run: Run | AsyncRun,
    *,
    url_arg: str | None = "url",
    message: str | None = None,
    timeout: float | None = None,
    on_pending: PendingHook | None = None,
) -> BaseTool:
    """``tool`` behind a Tollgate card on ``run`` (same name, description and
    arguments). ``url_arg`` names the argument shown as the card's URL;
    ``on_pending(tool_name, request_id)`` is called when a card waits."""
    options: dict[str, Any] = {
        "url_arg": url_arg,
        "message": message,
        "timeout": timeout,
        "on_pending": on_pending,
    }
    if isinstance(run, Run):
        blocking = run

        def gated(**kwargs: Any) -> Any:
            decision, value = call_sync(
                blocking, tool.name, kwargs, lambda: tool.invoke(kwargs), **options
            )
            return value if decision.approved else denied_text(decision)

        return StructuredTool.from_function(
            func=gated, name=tool.name, description=tool.description, args_schema=tool.args_schema
        )
    asynchronous = run

    async def agated(**kwargs: Any) -> Any:
        async def invoke() -> Any:
            return await tool.ainvoke(kwargs)

        decision, value = await call_async(asynchronous, tool.name, kwargs, invoke, **options)
        return value if decision.approved else denied_text(decision)

    return StructuredTool.from_function(
        coroutine=agated, name=tool.name, description=tool.description, args_schema=tool.args_schema
    )


def gate_tools(
    tools: Sequence[BaseTool],
    run: Run | AsyncRun,
    **options: Any,
) -> list[BaseTool]:
    """:func:`gate_tool` for each tool."""
    return [gate_tool(t, run, **options) for t in tools]
