"""The operator side: the pending cards, approve / deny, reconcile, the runs listing
(operator JWT)."""

from __future__ import annotations

from typing import Any

import httpx

from ._http import ClientConfig, Http
from ._models import CardPage, Decide, Decided, Reconcile, RunCards, RunList
from ._sync import _Loop


class AsyncOperator:
    """An operator's connection (its JWT)."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        config: ClientConfig | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = Http(base_url, config or ClientConfig(), transport)
        self._token = token

    async def __aenter__(self) -> AsyncOperator:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def pending(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """The open cards (of one run, or of every run the operator may see)."""
        params = {"state": "pending"}
        if run_id is not None:
            answer = await self._http.send(
                "GET", ["api", "runs", run_id, "approvals"], self._token, params=params
            )
            return RunCards.from_json(answer.expect(200), answer.status).approvals
        answer = await self._http.send("GET", ["api", "approvals"], self._token, params=params)
        return CardPage.from_json(answer.expect(200), answer.status).approvals

    async def list_runs(
        self,
        *,
        limit: int | None = None,
        after: str | None = None,
        status: str | None = None,
        owner: str | None = None,
        q: str | None = None,
        project_id: str | None = None,
    ) -> RunList:
        """One page of the project's runs, newest first (``GET /api/runs``): ``status``
        and ``owner`` match exactly, ``q`` is a run-id prefix, ``after`` the previous
        page's ``next_cursor``. A page may be short, even empty, while ``has_more``."""
        given = {
            "limit": None if limit is None else str(limit),
            "after": after,
            "status": status,
            "owner": owner,
            "q": q,
            "project_id": project_id,
        }
        params = {k: v for k, v in given.items() if v is not None}
        answer = await self._http.send("GET", ["api", "runs"], self._token, params=params)
        return RunList.from_json(answer.expect(200), answer.status)

    async def _decide(
        self,
        verb: str,
        run_id: str,
        request_id: str,
        scope: str | None,
        tool_name: str | None,
        reason: str | None = None,
    ) -> Decided:
        body = Decide(
            request_id=request_id, scope=scope, tool_name=tool_name, reason=reason
        ).to_json()
        answer = await self._http.send("POST", ["api", "runs", run_id, verb], self._token, body)
        return Decided.from_json(answer.expect(200), answer.status)

    async def approve(
        self,
        run_id: str,
        request_id: str,
        *,
        scope: str = "once",
        tool_name: str | None = None,
        reason: str | None = None,
    ) -> Decided:
        """Approves a card, saying why when ``reason`` is given; the answer reports its
        real state (a later click is safe)."""
        return await self._decide("tool-approvals", run_id, request_id, scope, tool_name, reason)

    async def deny(
        self,
        run_id: str,
        request_id: str,
        *,
        tool_name: str | None = None,
        reason: str | None = None,
    ) -> Decided:
        """Denies a card, saying why when ``reason`` is given."""
        return await self._decide("tool-denials", run_id, request_id, None, tool_name, reason)

    async def reconcile(
        self, run_id: str, tool_call_id: str, approval_id: str, observed: str
    ) -> dict[str, Any]:
        """Reconciles an ``outcome_unknown`` record (``applied`` or ``not_applied``)."""
        answer = await self._http.send(
            "POST",
            ["api", "runs", run_id, "mutations", tool_call_id, approval_id, "reconcile"],
            self._token,
            Reconcile(observed=observed).to_json(),
        )
        return answer.expect(200)


class Operator:
    """:class:`AsyncOperator`, blocking."""

    def __init__(self, base_url: str, token: str, *, config: ClientConfig | None = None) -> None:
        self.inner = AsyncOperator(base_url, token, config=config)
        self._loop = _Loop(self.inner.aclose)

    def __enter__(self) -> Operator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._loop.call(self.inner.aclose)
        finally:
            self._loop.close()

    def pending(self, run_id: str | None = None) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._loop.call(self.inner.pending, run_id)
        return result

    def list_runs(
        self,
        *,
        limit: int | None = None,
        after: str | None = None,
        status: str | None = None,
        owner: str | None = None,
        q: str | None = None,
        project_id: str | None = None,
    ) -> RunList:
        result: RunList = self._loop.call(
            self.inner.list_runs,
            limit=limit,
            after=after,
            status=status,
            owner=owner,
            q=q,
            project_id=project_id,
        )
        return result

    def approve(
        self,
        run_id: str,
        request_id: str,
        *,
        scope: str = "once",
        tool_name: str | None = None,
        reason: str | None = None,
    ) -> Decided:
        result: Decided = self._loop.call(
            self.inner.approve,
            run_id,
            request_id,
            scope=scope,
            tool_name=tool_name,
            reason=reason,
        )
        return result

    def deny(
        self,
        run_id: str,
        request_id: str,
        *,
        tool_name: str | None = None,
        reason: str | None = None,
    ) -> Decided:
        result: Decided = self._loop.call(
            self.inner.deny, run_id, request_id, tool_name=tool_name, reason=reason
        )
        return result

    def reconcile(
        self, run_id: str, tool_call_id: str, approval_id: str, observed: str
    ) -> dict[str, Any]:
        result: dict[str, Any] = self._loop.call(
            self.inner.reconcile, run_id, tool_call_id, approval_id, observed
        )
        return result
