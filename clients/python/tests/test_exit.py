"""A script that never closes its client still exits: the blocking :class:`Client` (and
an :class:`Operator`) and the :class:`AsyncClient` under ``asyncio.run`` / ``anyio.run``,
with a gate decided, a live follow and a gate wait abandoned, each run as a subprocess
against the real server within a time limit."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tollgate.operator import Operator

from .conftest import Server

LIMIT = 20.0
LAST = "done; the client was never closed"

SYNC = textwrap.dedent(
    f"""
    import os

    from tollgate import Client
    from tollgate.operator import Operator

    client = Client(os.environ["TOLLGATE_URL"], token=os.environ["AGENT_TOKEN"])
    run = client.create_run(owner="alice", budget={{"tools": {{"shell": 1}}}})
    run.append({{"type": "agent.message", "text": "asking before a shell call"}})
    decision = run.gate(
        "shell",
        message="ls build/",
        timeout=60,
        on_pending=lambda request_id: print("pending", run.run_id, request_id, flush=True),
    )
    operator = Operator(os.environ["TOLLGATE_URL"], os.environ["OPERATOR_TOKEN"])
    print("decided", decision.state, len(operator.pending(run.run_id)), flush=True)
    print({LAST!r}, flush=True)
    """
)

ASYNC = textwrap.dedent(
    f"""
    import asyncio
    import os
    import sys

    from tollgate import AsyncClient


    async def main() -> None:
        client = AsyncClient(os.environ["TOLLGATE_URL"], token=os.environ["AGENT_TOKEN"])
        run = await client.create_run(owner="alice")
        await run.append({{"type": "agent.message", "text": "following myself"}})
        follow = run.follow()
        first = await follow.__anext__()
        print("followed", first["sequence"], first["type"], flush=True)
        waiting = asyncio.Event()

        def pending(request_id: str) -> None:
            print("pending", run.run_id, request_id, flush=True)
            waiting.set()

        gate = asyncio.create_task(
            run.gate("shell", message="nobody answers", timeout=300, on_pending=pending)
        )
        await asyncio.wait_for(waiting.wait(), 15)
        assert not gate.done()
        print({LAST!r}, flush=True)


    if sys.argv[1] == "anyio":
        import anyio

        anyio.run(main)
    else:
        asyncio.run(main())
    """
)


def run_script(
    server: Server,
    path: Path,
    source: str,
    args: list[str],
    on_line: Callable[[str], None] = lambda line: None,
) -> tuple[int | None, list[str], str]:
    """Runs ``source`` with the server's URL and tokens; ``on_line`` sees each line it
    prints. Its exit code (``None`` when it was still running after ``LIMIT`` seconds and
    was killed), its output lines and its stderr."""
    path.write_text(source)
    env = dict(
        os.environ,
        TOLLGATE_URL=server.url,
        AGENT_TOKEN=server.agent_token,
        OPERATOR_TOKEN=server.operator_token,
    )
    proc = subprocess.Popen(
        [sys.executable, "-u", str(path), *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    errors: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    def pump_errors() -> None:
        assert proc.stderr is not None
        errors.append(proc.stderr.read())

    readers = [threading.Thread(target=f, daemon=True) for f in (pump, pump_errors)]
    for reader in readers:
        reader.start()
    out: list[str] = []
    deadline = time.monotonic() + LIMIT
    try:
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            if line is None:
                break
            out.append(line)
            on_line(line)
        try:
            code: int | None = proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            code = None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for reader in readers:
            reader.join(5)
    return code, out, "".join(errors)


def test_an_unclosed_blocking_client_does_not_keep_the_process_alive(
    server: Server, tmp_path: Path
) -> None:
    with Operator(server.url, server.operator_token) as op:

        def decide(line: str) -> None:
            if line.startswith("pending "):
                _, run_id, request_id = line.split()
                op.approve(run_id, request_id)

        started = time.monotonic()
        code, out, err = run_script(server, tmp_path / "unclosed_sync.py", SYNC, [], decide)
    assert code is not None, f"still running {LIMIT:.0f} s on, after printing {out!r}"
    assert code == 0, err
    assert out[-2:] == ["decided approved 0", LAST], (out, err)
    assert time.monotonic() - started < LIMIT


@pytest.mark.parametrize("runner", ["asyncio", "anyio"])
def test_an_unclosed_async_client_does_not_keep_the_process_alive(
    server: Server, tmp_path: Path, runner: str
) -> None:
    """Its follow and its gate wait abandoned mid-way, the loop's end winds them up."""
    code, out, err = run_script(server, tmp_path / "unclosed_async.py", ASYNC, [runner])
    assert code is not None, f"still running {LIMIT:.0f} s on, after printing {out!r}"
    assert code == 0, err
    assert out[0] == "followed 1 run_started", (out, err)
    assert out[1].startswith("pending ")
    assert out[-1] == LAST, (out, err)
    with Operator(server.url, server.operator_token) as op:
        _, run_id, request_id = out[1].split()
        cards = op.pending(run_id)
        assert [c["request_id"] for c in cards] == [request_id]
