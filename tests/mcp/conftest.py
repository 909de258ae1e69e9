"""The MCP gateway's black-box suite: a real ``tollgate serve`` (the binary from
``TOLLGATE_BIN``) on a free loopback port, on the store ``MCP_TEST_STORE`` names
(``memory``: the embedded store; ``dynamodb``: DynamoDB and SQS at the AWS endpoint the
environment sets, on tables and a timer queue of this run's own), an agent and an
operator token minted with its secret; the gateway (`tollgate mcp proxy`) started per
test through the official MCP SDK's stdio client; the operator's side over HTTP.

Each gateway gets a name of its own (``--name``), so its tool names (``mcp__NAME__TOOL``)
and cards are the test's alone on the shared server."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

REPO = Path(__file__).resolve().parents[2]
STORE = os.environ.get("MCP_TEST_STORE", "memory")
# Variables that would point `tollgate serve --backend aws` at other tables.
TABLE_VARS = (
    "TOLLGATE_RUNS_TABLE",
    "TOLLGATE_EVENTS_TABLE",
    "TOLLGATE_APPROVALS_TABLE",
    "TOLLGATE_POLICIES_TABLE",
    "TOLLGATE_MUTATIONS_TABLE",
    "TOLLGATE_CONNECTIONS_TABLE",
    "TOLLGATE_DELIVERIES_TABLE",
    "TOLLGATE_TIMER_QUEUE_URL",
    "TOLLGATE_BACKEND",
    "TOLLGATE_PORT",
)
OPERATOR = "alice"


def _binary(var: str, default: Path) -> Path:
    given = os.environ.get(var)
    path = Path(given) if given else default
    if not path.is_file():
        pytest.exit(f"no binary at {path} (set {var}, or build it: see tests/harness/mcp.sh)", 2)
    return path.resolve()


TOLLGATE = _binary("TOLLGATE_BIN", REPO / "target" / "debug" / "tollgate")
ECHO = _binary("TOLLGATE_MCP_ECHO", REPO / "target" / "debug" / "tollgate-mcp-echo")


def mcp_server_git() -> list[str]:
    """The command that starts mcp-server-git (the pinned package in the suite's venv)."""
    given = os.environ.get("MCP_SERVER_GIT")
    if given:
        return [given]
    return [str(Path(sys.executable).with_name("mcp-server-git"))]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class HttpError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


@dataclass
class Server:
    """One ``tollgate serve`` and the operator's HTTP side of it."""

    url: str
    secret: str
    store: str
    log: Path
    agent_token: str = ""
    operator_token: str = ""

    def token(self, sub: str, role: str) -> str:
        out = subprocess.run(
            [str(TOLLGATE), "token", "--sub", sub, "--role", role],
            env=dict(os.environ, TOLLGATE_SECRET=self.secret),
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout.strip()

    # -- HTTP (blocking; the async helpers below run these in a worker thread)

    def request(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.url + path,
            method=method,
            data=data,
            headers={
                "Authorization": f"Bearer {token or self.operator_token}",
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=15) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raise HttpError(e.code, e.read().decode(errors="replace")) from None

    def events_now(self, run_id: str) -> list[dict[str, Any]]:
        """Every event of the run so far (replayed in pages)."""
        events: list[dict[str, Any]] = []
        after = 0
        while True:
            page = self.request("GET", f"/api/runs/{run_id}/events?after={after}&limit=1000")
            events.extend(page["events"])
            after = page["next_after"]
            if not page["has_more"]:
                return events

    def pending_now(self, run_id: str) -> list[dict[str, Any]]:
        """The run's pending cards, as the operator lists them (GET /api/approvals)."""
        cards: list[dict[str, Any]] = []
        after: str | None = None
        while True:
            query = "?state=pending&limit=500" + (f"&after={after}" if after else "")
            page = self.request("GET", "/api/approvals" + query)
            cards.extend(c for c in page["approvals"] if c["run_id"] == run_id)
            if not page.get("has_more"):
                return cards
            after = page["next_after"]

    # -- async helpers for the tests

    async def events(self, run_id: str) -> list[dict[str, Any]]:
        return await anyio.to_thread.run_sync(self.events_now, run_id)

    async def pending(self, run_id: str) -> list[dict[str, Any]]:
        return await anyio.to_thread.run_sync(self.pending_now, run_id)

    async def wait_cards(self, run_id: str, n: int = 1, timeout: float = 15) -> list[dict[str, Any]]:
        """Waits until the run has at least ``n`` pending cards; they, oldest first."""
        with anyio.fail_after(timeout):
            while True:
                cards = await self.pending(run_id)
                if len(cards) >= n:
                    return sorted(cards, key=lambda c: c["created_at"])
                await anyio.sleep(0.1)

    async def wait_no_cards(self, run_id: str, timeout: float = 5) -> None:
        """Waits until the run lists no pending card (a listing on DynamoDB reads an
        index, which may lag a decision briefly)."""
        with anyio.fail_after(timeout):
            while await self.pending(run_id):
                await anyio.sleep(0.1)

    async def wait_event(
        self, run_id: str, match: Callable[[dict[str, Any]], bool], timeout: float = 15
    ) -> dict[str, Any]:
        """Waits for the first event that ``match`` accepts; it."""
        with anyio.fail_after(timeout):
            while True:
                for e in await self.events(run_id):
                    if match(e):
                        return e
                await anyio.sleep(0.1)

    async def wait_terminal(self, run_id: str, timeout: float = 15) -> dict[str, Any]:
        """Waits for the run's terminal event (run_completed, run_failed, run_cancelled)."""
        return await self.wait_event(
            run_id, lambda e: e["type"] in ("run_completed", "run_failed", "run_cancelled"), timeout
        )

    async def approve(self, card: dict[str, Any], scope: str = "once") -> dict[str, Any]:
        body = {"request_id": card["request_id"], "scope": scope}
        path = f"/api/runs/{card['run_id']}/tool-approvals"
        return await anyio.to_thread.run_sync(lambda: self.request("POST", path, body))

    async def deny(self, card: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"request_id": card["request_id"]}
        if reason is not None:
            body["reason"] = reason
        path = f"/api/runs/{card['run_id']}/tool-denials"
        return await anyio.to_thread.run_sync(lambda: self.request("POST", path, body))


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    secret = secrets.token_hex(32)
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="tollgate-mcp-serve-"))
    log = work / "serve.log"
    env = {k: v for k, v in os.environ.items() if k not in TABLE_VARS}
    env.update(TOLLGATE_SECRET=secret, RUST_LOG="warn")
    args = [str(TOLLGATE), "serve", "--port", str(port)]
    if STORE == "dynamodb":
        unique = secrets.token_hex(4)
        env.update(TOLLGATE_TABLE_PREFIX=f"mcp-{unique}-", TOLLGATE_TIMER_QUEUE_NAME=f"mcp-{unique}")
        args += ["--backend", "aws", "--create-tables"]
    elif STORE != "memory":
        pytest.exit(f"MCP_TEST_STORE={STORE}: memory or dynamodb", 2)
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while "export TOLLGATE_URL=" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tollgate serve did not start:\n{log.read_text(errors='replace')}")
            time.sleep(0.05)
        srv = Server(url=f"http://127.0.0.1:{port}", secret=secret, store=STORE, log=log)
        srv.agent_token = srv.token("mcp-agent", "agent")
        srv.operator_token = srv.token(OPERATOR, "operator")
        yield srv
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def unique_name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


@dataclass
class Gateway:
    """One `tollgate mcp proxy` session, as the agent holds it."""

    name: str
    session: ClientSession
    log: Path
    server: Server
    _run_id: str | None = field(default=None)

    @property
    def run_id(self) -> str:
        """The session's run (the proxy logs it when the agent's initialize opens it)."""
        if self._run_id is None:
            deadline = time.monotonic() + 10
            while True:
                m = re.search(r'MCP session opened run_id="?([A-Za-z0-9_.:-]+)', self.log.read_text())
                if m:
                    self._run_id = m.group(1)
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"the proxy logged no run id:\n{self.log.read_text()}")
                time.sleep(0.05)
        return self._run_id

    def tool(self, tool: str) -> str:
        """The tool's name on cards and in the ledger."""
        return f"mcp__{self.name}__{tool}"

    def proxy_pid(self) -> int:
        """The proxy's process id (found by its unique --name)."""
        return find_pid(lambda argv: "proxy" in argv and self.name in argv)

    def upstream_pids(self, program: str) -> list[int]:
        """Processes of ``program`` whose parent is this session's proxy."""
        proxy = self.proxy_pid()
        out = []
        for pid in _pids():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == proxy and argv and argv[0].decode(errors="replace").endswith(program):
                out.append(pid)
        return out

    def kill_proxy(self) -> None:
        os.kill(self.proxy_pid(), signal.SIGKILL)


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def find_pid(match: Callable[[list[str]], bool]) -> int:
    for pid in _pids():
        try:
            argv = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
        except OSError:
            continue
        if argv and argv[0].endswith("tollgate") and match(argv):
            return pid
    raise AssertionError("no such process")


@asynccontextmanager
async def open_gateway(
    server: Server,
    *flags: str,
    upstream: list[str] | None = None,
    name: str | None = None,
    owner: str | None = OPERATOR,
) -> AsyncIterator[Gateway]:
    """Starts `tollgate mcp proxy --name NAME [--owner alice] FLAGS -- UPSTREAM` through the
    SDK's stdio client and initializes the session."""
    name = name or unique_name("gw")
    args = ["mcp", "proxy", "--name", name]
    if owner:
        args += ["--owner", owner]
    args += [*flags, "--", *(upstream or [str(ECHO)])]
    env = {
        "TOLLGATE_URL": server.url,
        "TOLLGATE_TOKEN": server.agent_token,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "RUST_LOG": "info",
    }
    log = Path(tempfile.mkdtemp(prefix=f"tollgate-{name}-")) / "proxy.log"
    params = StdioServerParameters(command=str(TOLLGATE), args=args, env=env)
    with log.open("w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield Gateway(name=name, session=session, log=log, server=server)


@asynccontextmanager
async def open_direct(command: list[str]) -> AsyncIterator[ClientSession]:
    """An MCP session straight to ``command`` (no gateway), for comparison."""
    params = StdioServerParameters(command=command[0], args=command[1:], env={"PATH": os.environ.get("PATH", "")})
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with one commit and one new, untracked file ``notes.txt``."""
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    git(r, "config", "user.email", "test@example.invalid")
    git(r, "config", "user.name", "Test")
    (r / "README").write_text("hello\n")
    git(r, "add", "README")
    git(r, "commit", "-q", "-m", "first")
    (r / "notes.txt").write_text("a note\n")
    return r


def types_of(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def text_of(result: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)
