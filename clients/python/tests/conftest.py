"""A real ``tollgate serve`` for the suite: the binary from ``TOLLGATE_BIN``, else
``<repo>/target/debug/tollgate``, started on a free loopback port with the embedded
store, an agent and an operator token minted with its secret, stopped at the end."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def binary() -> Path:
    given = os.environ.get("TOLLGATE_BIN")
    path = Path(given) if given else REPO / "target" / "debug" / "tollgate"
    if not path.is_file():
        pytest.exit(f"no tollgate binary at {path} (cargo build -p tollgate, or TOLLGATE_BIN)", 2)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class Server:
    url: str
    agent_token: str
    operator_token: str
    binary: Path
    secret: str
    log: Path

    def token(self, sub: str, role: str) -> str:
        env = dict(os.environ, TOLLGATE_SECRET=self.secret)
        out = subprocess.run(
            [str(self.binary), "token", "--sub", sub, "--role", role],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout.strip()


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    path = binary()
    secret = secrets.token_hex(32)
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="tollgate-py-"))
    log = work / "serve.log"
    env = dict(
        os.environ,
        TOLLGATE_SECRET=secret,
        TOLLGATE_ALLOW_LOOPBACK_ORIGINS="1",
        TOLLGATE_SSE_WINDOW_SECONDS="2",
        TOLLGATE_HEARTBEAT_SECONDS="2",
        RUST_LOG="warn",
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(path), "serve", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 20
        while "export TOLLGATE_URL=" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tollgate serve did not start; see {log}")
            time.sleep(0.05)
        srv = Server(
            url=f"http://127.0.0.1:{port}",
            agent_token="",
            operator_token="",
            binary=path,
            secret=secret,
            log=log,
        )
        srv = Server(
            url=srv.url,
            agent_token=srv.token("py-agent", "agent"),
            operator_token=srv.token("alice", "operator"),
            binary=path,
            secret=secret,
            log=log,
        )
        yield srv
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
