"""What every adapter does with one tool call: gate it, then run it under the guard."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from .._async import AsyncRun, Decision
from .._sync import Run

T = TypeVar("T")

PendingHook = Callable[[str, str], None]
"""Called with ``(tool_name, request_id)`` once a card waits for a human."""


def denied_text(decision: Decision) -> str:
    """What the model is told when a call was not approved."""
    who = f" by {decision.decided_by}" if decision.decided_by else ""
    return (
        f"Tollgate: the call to {decision.tool_name} was not approved "
        f"({decision.state}{who}); it was not run."
    )


def _url(arguments: Mapping[str, Any], url_arg: str | None) -> str | None:
    value = arguments.get(url_arg) if url_arg else None
    return value if isinstance(value, str) else None


def call_sync(
    run: Run,
    tool_name: str,
    arguments: Mapping[str, Any],
    call: Callable[[], T],
    *,
    url_arg: str | None,
    message: str | None,
    timeout: float | None,
    on_pending: PendingHook | None,
) -> tuple[Decision, T | None]:
    """Gates ``call`` (blocking); runs it under the guard when approved."""
    decision = run.gate(
        tool_name,
        arguments=dict(arguments),
        url=_url(arguments, url_arg),
        message=message or f"The agent wants to call {tool_name}.",
        timeout=timeout,
        on_pending=(lambda rid: on_pending(tool_name, rid)) if on_pending else None,
    )
    if not decision.approved:
        return decision, None
    with run.execute(decision) as ex:
        ex.dispatch()
        value = call()
        ex.record({"tool": tool_name, "returned": type(value).__name__})
    return decision, value


async def call_async(
    run: AsyncRun,
    tool_name: str,
    arguments: Mapping[str, Any],
    call: Callable[[], Awaitable[T]],
    *,
    url_arg: str | None,
    message: str | None,
    timeout: float | None,
    on_pending: PendingHook | None,
) -> tuple[Decision, T | None]:
    """Gates ``call``; runs it under the guard when approved."""
    decision = await run.gate(
        tool_name,
        arguments=dict(arguments),
        url=_url(arguments, url_arg),
        message=message or f"The agent wants to call {tool_name}.",
        timeout=timeout,
        on_pending=(lambda rid: on_pending(tool_name, rid)) if on_pending else None,
    )
    if not decision.approved:
        return decision, None
    async with run.execute(decision) as ex:
        await ex.dispatch()
        value = await call()
        ex.record({"tool": tool_name, "returned": type(value).__name__})
    return decision, value
