"""The README's Python quickstart runs as written: its code block, with the page it
fetches served on loopback, waits for the card, the ``tollgate approve`` command it
prints approves it, and it prints what the README says it prints."""

from __future__ import annotations

import http.server
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from .conftest import REPO, Server


def quickstart() -> str:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Python quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the quickstart has one Python block"
    code: str = blocks[0]
    return code


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def page() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/docs"
    finally:
        httpd.shutdown()


def test_the_python_quickstart_runs_as_the_readme_says(server: Server, page: str) -> None:
    code = quickstart()
    assert code.count("https://example.com") == 2
    code = code.replace("https://example.com", page)
    env = dict(
        os.environ,
        TOLLGATE_URL=server.url,
        AGENT_TOKEN=server.token("readme-agent", "agent"),
    )
    script = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert script.stdout is not None
        prompt = script.stdout.readline().split()
        assert prompt[:2] == ["tollgate", "approve"], prompt
        approve = subprocess.run(
            [str(server.binary), *prompt[1:]],
            env=dict(
                os.environ,
                TOLLGATE_URL=server.url,
                TOLLGATE_TOKEN=server.token("local-operator", "operator"),
            ),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert approve.returncode == 0, approve.stderr
        assert approve.stdout.startswith("approved (scope once) by local-operator"), approve.stdout
        out, err = script.communicate(timeout=60)
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
    assert script.returncode == 0, err
    assert out.strip().splitlines()[-1] == "approved local-operator completed"
