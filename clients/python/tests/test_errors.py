"""Refusals as exceptions of their kind, with the body's code and request id; retries
of what may succeed later (honouring Retry-After), never of another 4xx."""

from __future__ import annotations

import pytest

from tollgate import (
    Client,
    ClientConfig,
    Forbidden,
    InvalidEvent,
    InvalidRequest,
    NotFound,
    RetryPolicy,
    RunTerminal,
    Unauthorized,
    Unavailable,
)
from tollgate.operator import Operator

from .conftest import Server
from .transports import RecordingTransport


def test_refusals_are_typed_and_carry_code_and_request_id(server: Server) -> None:
    with Client(server.url, token=server.agent_token) as client:
        run = client.create_run(owner="alice")
        run.complete()
        with pytest.raises(RunTerminal) as ended:
            run.append({"type": "agent.message"})
        e = ended.value
        assert (e.status, e.code, e.state) == (409, "run_terminal", "run_terminal")
        assert e.request_id and len(e.request_id) <= 64
        assert e.body["terminal_sequence"] == 2

        with pytest.raises(InvalidRequest) as bad:
            client.create_run(run_id="dlv-reserved")
        assert (bad.value.status, bad.value.code) == (400, "invalid_request")
        assert bad.value.request_id

        with pytest.raises(InvalidEvent):
            run.append({"text": "no type"})

    with Operator(server.url, server.operator_token) as op:
        with pytest.raises(NotFound) as missing:
            op.approve(run.run_id, "no-such-card")
        assert (missing.value.code, missing.value.state) == ("not_found", "unknown")
    with Operator(server.url, server.agent_token) as not_op, pytest.raises(Forbidden) as denied:
        not_op.pending()
    assert denied.value.code == "forbidden"
    with Client(server.url, token="not-a-jwt") as nobody, pytest.raises(Unauthorized) as who:
        nobody.create_run()
    assert who.value.code == "unauthorized"


def test_429_and_5xx_are_retried_after_retry_after_4xx_never(server: Server) -> None:
    recorder = RecordingTransport()
    with Client(server.url, token=server.agent_token, transport=recorder) as client:
        run = client.create_run(owner="alice")
        recorder.inject = [("/events", 503, "1"), ("/events", 429, None)]
        sequences = run.append({"type": "agent.message", "text": "once"})
        attempts = recorder.paths("POST", "/events")
        assert len(attempts) == 3
        times = [t for m, p, t in recorder.sent if m == "POST" and p.endswith("/events")]
        assert times[1] - times[0] >= 1.0  # Retry-After: 1 honoured
        page = run.events(0, 100)
        assert [e["type"] for e in page.events] == ["run_started", "agent.message"]
        assert [e["sequence"] for e in page.events][1:] == sequences

        # A 4xx is an answer: one attempt.
        before = len(recorder.paths("POST", "/events"))
        with pytest.raises(InvalidRequest):
            run.append({"type": "run_completed"})
        assert len(recorder.paths("POST", "/events")) == before + 1

    config = ClientConfig(retry=RetryPolicy(max_attempts=2, base_delay=0.01))
    recorder = RecordingTransport()
    with Client(server.url, token=server.agent_token, config=config, transport=recorder) as c:
        recorder.inject = [("/api/runs", 503, "0"), ("/api/runs", 503, "0")]
        with pytest.raises(Unavailable) as busy:
            c.create_run()
        assert busy.value.retryable and busy.value.status == 503
        assert busy.value.request_id == "injected-1"
        assert len(recorder.paths("POST", "/api/runs")) == 2


def test_appends_retried_after_a_lost_answer_do_not_double(server: Server) -> None:
    with Client(server.url, token=server.agent_token) as client:
        run = client.create_run(delivery_id="delivery-42", owner="alice")
        assert run.created
        again = client.create_run(delivery_id="delivery-42", owner="alice")
        assert again.run_id == run.run_id and not again.created
        found = client.receipt("delivery-42")
        assert found.run_id == run.run_id and found.status == "running"
        event = {"type": "tool.call", "event_id": "call-1", "tool": "web_fetch"}
        first = run.append(event)
        assert run.append(event) == first
        assert "run_token" not in repr(run) and run.token not in repr(run)
