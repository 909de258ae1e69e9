"""The runs listing: an operator pages through the runs newest first, narrowed by
owner, status and run-id prefix."""

from __future__ import annotations

import uuid

import pytest

from tollgate import Client, InvalidRequest
from tollgate.operator import Operator

from .conftest import Server


def test_operator_lists_runs_newest_first_with_a_cursor(server: Server) -> None:
    owner = f"owner-{uuid.uuid4().hex[:12]}"
    with Client(server.url, token=server.agent_token) as client:
        runs = [client.create_run(owner=owner) for _ in range(3)]
        runs[1].complete()
    created = {r.run_id for r in runs}
    with Operator(server.url, server.operator_token) as op:
        listed: list[dict[str, object]] = []
        after: str | None = None
        while True:
            page = op.list_runs(owner=owner, limit=2, after=after)
            assert len(page.runs) <= 2
            listed.extend(page.runs)
            if not page.has_more:
                break
            after = page.next_cursor
        assert {r["run_id"] for r in listed} == created
        assert len(listed) == 3
        times = [r["created_at"] for r in listed]
        assert times == sorted(times, reverse=True)  # type: ignore[type-var]
        assert all(r["owner"] == owner for r in listed)

        done = op.list_runs(owner=owner, status="completed")
        assert [r["run_id"] for r in done.runs] == [runs[1].run_id]
        assert done.runs[0]["ended_at"] >= done.runs[0]["created_at"]
        one = op.list_runs(q=runs[2].run_id)
        assert [r["run_id"] for r in one.runs] == [runs[2].run_id]
        with pytest.raises(InvalidRequest):
            op.list_runs(status="paused")
