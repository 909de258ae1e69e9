"""OpenAI Agents SDK: function tools whose every call waits on a Tollgate card.

::

    from agents import Agent
    from tollgate.adapters.openai_agents import gated_function_tool

    async def web_fetch(url: str) -> str:
        \"\"\"Fetch a web page.\"\"\"
        ...

    agent = Agent(name="fetcher", tools=[gated_function_tool(web_fetch, run)])

Each call arms a card bound to its arguments and waits for an operator. Approved, the
function runs under the execution guard; denied or expired, it does not run and the model
gets a message saying so. ``run`` is an :class:`~tollgate.AsyncRun` (the SDK runs tools
on its event loop).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from agents import FunctionTool, function_tool

from .._async import AsyncRun
from ._common import PendingHook, call_async, denied_text


def gated_function_tool(
    fn: Callable[..., Any],
    run: AsyncRun,
    *,
    name: str | None = None,
    url_arg: str | None = "url",
    message: str | None = None,
    timeout: float | None = None,
    on_pending: PendingHook | None = None,
) -> FunctionTool:
    """``fn`` (sync or async) as a function tool behind a Tollgate card on ``run``; its
    schema comes from ``fn``'s signature and docstring as ``function_tool`` makes it."""
    tool_name = name or fn.__name__
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    async def gated(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)

        async def invoke() -> Any:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
            return value

        decision, value = await call_async(
            run,
            tool_name,
            arguments,
            invoke,
            url_arg=url_arg,
            message=message,
            timeout=timeout,
            on_pending=on_pending,
        )
        return value if decision.approved else denied_text(decision)

    tool: FunctionTool = function_tool(gated, name_override=tool_name)
    return tool
