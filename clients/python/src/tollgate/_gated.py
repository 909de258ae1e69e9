"""``@gated("web_fetch")``: a plain function whose every call asks a human first."""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

from ._errors import ConfigError, ToolDenied
from ._sync import Run

P = ParamSpec("P")
R = TypeVar("R")

_CURRENT: contextvars.ContextVar[Run | None] = contextvars.ContextVar("tollgate_run", default=None)


@contextmanager
def use_run(run: Run) -> Iterator[Run]:
    """Makes ``run`` the one ``@gated`` functions without a ``run=`` gate through."""
    token = _CURRENT.set(run)
    try:
        yield run
    finally:
        _CURRENT.reset(token)


def current_run() -> Run | None:
    """The run :func:`use_run` set, if any."""
    return _CURRENT.get()


def _arguments(fn: Callable[..., Any], args: Any, kwargs: Any) -> dict[str, Any]:
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return {k: v for k, v in bound.arguments.items()}


def gated(
    tool_name: str,
    *,
    run: Run | None = None,
    url_arg: str | None = "url",
    message: str | None = None,
    timeout: float | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Gates every call of the decorated function through Tollgate::

        @gated("web_fetch")
        def fetch(url: str) -> str: ...

        with use_run(run):
            fetch("https://example.com")   # waits for a human, then runs it

    Each call arms a card bound to the call's arguments (``url_arg`` names the one
    shown as the card's URL), waits for the decision, and runs the function under the
    execution guard (dispatched right before it runs; its return settles ``confirmed``,
    an exception ``ambiguous``). A denied or expired card raises
    :class:`~tollgate.ToolDenied` and the function does not run.
    """

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def inner(*args: P.args, **kwargs: P.kwargs) -> R:
            target = run or current_run()
            if target is None:
                raise ConfigError(f"{tool_name}: no run to gate through (use_run or run=)")
            arguments = _arguments(fn, args, kwargs)
            url = arguments.get(url_arg) if url_arg else None
            decision = target.gate(
                tool_name,
                arguments=arguments,
                url=url if isinstance(url, str) else None,
                message=message or f"The agent wants to call {tool_name}.",
                timeout=timeout,
            )
            if not decision.approved:
                raise ToolDenied(tool_name, decision.state, decision.decided_by)
            with target.execute(decision) as ex:
                ex.dispatch()
                value = fn(*args, **kwargs)
                ex.record({"returned": type(value).__name__})
            return value

        return inner

    return wrap
