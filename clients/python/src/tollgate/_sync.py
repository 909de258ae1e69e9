"""The agent side, blocking: :class:`Client` and :class:`Run` run the async client on
an event loop of their own (one daemon thread per client), so both behave the same."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

import anyio
import httpx
from anyio.from_thread import BlockingPortal

from ._async import AsyncClient, AsyncExecution, AsyncRun, Decision, EventHook
from ._http import ClientConfig
from ._models import Budget, Card, EventPage, MutationRecord, RunEnded

T = TypeVar("T")

#: How long closing waits for the loop's thread to end, and a loop wound up unclosed
#: for its owner's cleanup and for its tasks to stop (seconds).
_WIND_UP = 5.0


def _serve(ready: Future[BlockingPortal]) -> None:
    """The loop's thread: a portal served until it is stopped."""

    async def serve() -> None:
        async with BlockingPortal() as portal:
            ready.set_result(portal)
            await portal.sleep_until_stopped()

    try:
        anyio.run(serve)
    except BaseException as e:  # handed to the constructor while it waits
        if not ready.done():
            ready.set_exception(e)


async def _bounded(aclose: Callable[[], Awaitable[None]]) -> None:
    with anyio.move_on_after(_WIND_UP):
        await aclose()


def _wind_up(
    portal: BlockingPortal,
    thread: threading.Thread,
    aclose: Callable[[], Awaitable[None]] | None,
) -> None:
    """A loop nobody closed, as it is collected: its owner's ``aclose`` (bounded), its
    tasks cancelled, its thread joined (bounded). Never raises and never waits for
    ever."""
    if threading.current_thread() is thread:  # collected on the loop's own thread
        threading.Thread(target=_wind_up, args=(portal, thread, aclose), daemon=True).start()
        return
    if aclose is not None:
        with contextlib.suppress(Exception):
            portal.start_task_soon(_bounded, aclose).result(_WIND_UP + 1)
    with contextlib.suppress(Exception):
        portal.start_task_soon(portal.stop, True).result(_WIND_UP)
    thread.join(_WIND_UP)


class _Loop:
    """A blocking portal: an event loop in a daemon thread of its own, so it never keeps
    the process alive. :meth:`close` stops it; one never closed is wound up (``aclose``
    awaited, its tasks cancelled) when it is collected."""

    def __init__(self, aclose: Callable[[], Awaitable[None]] | None = None) -> None:
        ready: Future[BlockingPortal] = Future()
        kwargs: dict[str, Any] = {}
        if sys.version_info >= (3, 14):  # a context of its own, as anyio's portals have
            kwargs["context"] = contextvars.Context()
        self._thread = threading.Thread(
            target=_serve, args=(ready,), name="tollgate-loop", daemon=True, **kwargs
        )
        self._thread.start()
        self.portal = ready.result()
        self._unclosed = weakref.finalize(self, _wind_up, self.portal, self._thread, aclose)
        # At exit the thread, a daemon, is simply left: nothing to wait for there.
        self._unclosed.atexit = False

    def call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        return self.portal.call(functools.partial(fn, *args, **kw))

    def close(self) -> None:
        """Stops the portal (tasks still running may finish) and joins its thread
        (bounded). Closing again does nothing."""
        if self._unclosed.detach() is None:
            return
        if threading.current_thread() is self._thread:  # from a hook on the loop itself
            threading.Thread(target=self._stop, daemon=True).start()
            return
        self._stop()

    def _stop(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.portal.call(self.portal.stop, False)
        self._thread.join(_WIND_UP)


class Execution:
    """The execution guard of one approved call, blocking (see :class:`AsyncExecution`)::

    with run.execute(decision) as ex:
        ex.dispatch()                 # right before the request goes out
        response = httpx.post(...)
        ex.record({"http_status": response.status_code})
    """

    def __init__(self, loop: _Loop, inner: AsyncExecution) -> None:
        self._loop = loop
        self.inner = inner

    @property
    def decision(self) -> Decision:
        return self.inner.decision

    @property
    def state(self) -> str | None:
        """The durable record's state once settled."""
        return self.inner.state

    @property
    def evidence(self) -> str | None:
        """``confirmed``, ``ambiguous`` or ``not_sent`` once settled."""
        return self.inner.evidence

    @property
    def sequence(self) -> int | None:
        return self.inner.sequence

    @property
    def unsettled(self) -> Exception | None:
        return self.inner.unsettled

    def idempotency_key(self) -> str:
        return self.inner.idempotency_key()

    def record(self, result: Any = None, *, error: Any = None) -> None:
        self.inner.record(result, error=error)

    def start(self) -> None:
        self._loop.call(self.inner.start)

    def dispatch(self) -> None:
        """``intent → dispatched``; raises (and nothing may be sent) unless dispatched."""
        self._loop.call(self.inner.dispatch)

    def __enter__(self) -> Execution:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return bool(self._loop.call(self.inner.__aexit__, exc_type, exc, tb))


class Run:
    """One run, blocking (see :class:`AsyncRun`). ``repr`` never shows its token."""

    def __init__(self, loop: _Loop, inner: AsyncRun) -> None:
        self._loop = loop
        self.inner = inner

    def __repr__(self) -> str:
        return f"Run(run_id={self.run_id!r}, created={self.created!r})"

    @property
    def run_id(self) -> str:
        return self.inner.run_id

    @property
    def token(self) -> str:
        return self.inner.token

    @property
    def created(self) -> bool:
        return self.inner.created

    @property
    def status(self) -> str | None:
        return self.inner.status

    @property
    def agenthost_credential(self) -> str | None:
        return self.inner.agenthost_credential

    def on_tool_execution_started(self, hook: Callable[[str], None] | None) -> Run:
        """See :meth:`AsyncRun.on_tool_execution_started` (called on the client's own
        thread)."""
        self.inner.on_tool_execution_started(hook)
        return self

    def append(self, *events: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> list[int]:
        result: list[int] = self._loop.call(self.inner.append, *events)
        return result

    def events(self, after: int = 0, limit: int | None = None) -> EventPage:
        result: EventPage = self._loop.call(self.inner.events, after, limit)
        return result

    def complete(self, **fields: Any) -> RunEnded:
        result: RunEnded = self._loop.call(self.inner.complete, **fields)
        return result

    def fail(self, **fields: Any) -> RunEnded:
        result: RunEnded = self._loop.call(self.inner.fail, **fields)
        return result

    def cancel(self, **fields: Any) -> RunEnded:
        result: RunEnded = self._loop.call(self.inner.cancel, **fields)
        return result

    def approval(self, request_id: str) -> Card:
        result: Card = self._loop.call(self.inner.approval, request_id)
        return result

    def gate(
        self,
        tool_name: str,
        *,
        arguments: Any = None,
        url: str | None = None,
        message: str | None = None,
        intention: str | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
        tool_call_id: str | None = None,
        approval_id: str | None = None,
        on_event: EventHook | None = None,
        on_pending: Callable[[str], None] | None = None,
        arguments_preview: dict[str, Any] | None = None,
    ) -> Decision:
        """Arms a card and waits for its decision (see :meth:`AsyncRun.gate`)."""
        result: Decision = self._loop.call(
            self.inner.gate,
            tool_name,
            arguments=arguments,
            url=url,
            message=message,
            intention=intention,
            timeout=timeout,
            request_id=request_id,
            tool_call_id=tool_call_id,
            approval_id=approval_id,
            on_event=on_event,
            on_pending=on_pending,
            arguments_preview=arguments_preview,
        )
        return result

    def execute(
        self,
        decision: Decision,
        *,
        tool_call_id: str | None = None,
        approval_id: str | None = None,
    ) -> Execution:
        """The execution guard (see :class:`Execution`)."""
        return Execution(
            self._loop,
            self.inner.execute(decision, tool_call_id=tool_call_id, approval_id=approval_id),
        )

    def settle(
        self,
        tool_call_id: str,
        approval_id: str,
        evidence: str,
        *,
        result: Any = None,
        error: Any = None,
    ) -> str:
        state: str = self._loop.call(
            self.inner.settle, tool_call_id, approval_id, evidence, result=result, error=error
        )
        return state

    def mutation(self, tool_call_id: str, approval_id: str) -> MutationRecord:
        result: MutationRecord = self._loop.call(self.inner.mutation, tool_call_id, approval_id)
        return result


class Client:
    """A connection to one Tollgate server as one agent (its JWT), blocking::

    with Client("http://127.0.0.1:8080", token=agent_jwt) as client:
        run = client.create_run(owner="alice", budget={"tools": {"web_fetch": 1}})
        decision = run.gate("web_fetch", url="https://example.com", message="…")
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        config: ClientConfig | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.inner = AsyncClient(base_url, token, config=config, transport=transport)
        self._loop = _Loop(self.inner.aclose)
        self._closed = False

    def __repr__(self) -> str:
        return f"Client(base_url={self.inner._http.base!r})"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._loop.call(self.inner.aclose)
        finally:
            self._loop.close()

    @property
    def config(self) -> ClientConfig:
        return self.inner.config

    def create_run(
        self,
        *,
        run_id: str | None = None,
        delivery_id: str | None = None,
        owner: str | None = None,
        channel_id: str | None = None,
        budget: Budget | Mapping[str, Any] | None = None,
        kind: str | None = None,
        parent_run_id: str | None = None,
        subtask_id: int | str | None = None,
        project_id: str | None = None,
        execution_mode: str | None = None,
        agenthost_origin: str | None = None,
    ) -> Run:
        """Creates a run (see :meth:`AsyncClient.create_run`)."""
        inner: AsyncRun = self._loop.call(
            self.inner.create_run,
            run_id=run_id,
            delivery_id=delivery_id,
            owner=owner,
            channel_id=channel_id,
            budget=budget,
            kind=kind,
            parent_run_id=parent_run_id,
            subtask_id=subtask_id,
            project_id=project_id,
            execution_mode=execution_mode,
            agenthost_origin=agenthost_origin,
        )
        return Run(self._loop, inner)

    def receipt(self, delivery_id: str) -> Run:
        inner: AsyncRun = self._loop.call(self.inner.receipt, delivery_id)
        return Run(self._loop, inner)

    def run(self, run_id: str, run_token: str) -> Run:
        return Run(self._loop, self.inner.run(run_id, run_token))
