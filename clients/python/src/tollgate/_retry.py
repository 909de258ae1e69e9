"""When a request is tried again, and after how long.

Every request this client sends is safe to repeat by the contract (creates carry a
``run_id`` or ``delivery_id``, appends an ``event_id`` per event, arms a
``request_id``; ``start``, ``settle`` and the terminal calls answer a repeat with the
same answer; a repeated ``dispatch`` is refused ``dispatched`` and then nothing is
sent). So a transport error, a 429 or a 5xx is retried, boundedly, honouring
``Retry-After``; any other 4xx is an answer and is never retried.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

#: The shortest wait before reopening a live stream.
MIN_RECONNECT = 0.1


@dataclass(frozen=True)
class RetryPolicy:
    """How many times, and how far apart, a request is tried.

    The wait before retry ``n`` (1, 2, …) is drawn from ``[cap/2, cap]`` with
    ``cap = min(base_delay * 2**(n-1), max_delay)``; a ``Retry-After`` raises it, up to
    ``max_retry_after``.
    """

    max_attempts: int = 4
    base_delay: float = 0.2
    max_delay: float = 5.0
    max_retry_after: float = 30.0

    @staticmethod
    def none() -> RetryPolicy:
        """One attempt, no retries."""
        return RetryPolicy(max_attempts=1)

    @staticmethod
    def retryable_status(status: int) -> bool:
        """429 and the 5xx that mean "not now" (not 501 or 505)."""
        return status == 429 or (500 <= status <= 599 and status not in (501, 505))

    def backoff_cap(self, retry: int) -> float:
        doublings = min(max(retry - 1, 0), 20)
        return float(min(self.base_delay * (2**doublings), self.max_delay))

    def delay(self, retry: int, retry_after: float | None) -> float:
        cap = self.backoff_cap(retry)
        jittered = cap * (0.5 + random.random() * 0.5)
        if retry_after is not None:
            return max(jittered, min(retry_after, self.max_retry_after))
        return jittered

    def next_delay(
        self, attempt: int, status: int | None, retry_after: float | None
    ) -> float | None:
        """After attempt ``attempt`` (1 for the first) answered ``status`` (``None``: a
        transport error): the wait before the next, or ``None`` to stop."""
        if status is not None and not self.retryable_status(status):
            return None
        if attempt >= max(self.max_attempts, 1):
            return None
        return self.delay(attempt, retry_after if status is not None else None)


def reconnect_backoff(hint: float, failures: int, maximum: float) -> float:
    """The wait before reopening a live stream after ``failures`` failures in a row: the
    server's ``retry:`` hint (at least :data:`MIN_RECONNECT`), doubling, at most
    ``maximum``."""
    base = min(max(hint, MIN_RECONNECT), maximum)
    return float(min(base * (2 ** min(max(failures - 1, 0), 16)), maximum))
