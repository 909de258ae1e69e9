"""Pure pieces, checked against the Rust client's own vectors: the canonical JSON and
arguments hash, and the retry policy's arithmetic."""

from __future__ import annotations

import json

from tollgate import RetryPolicy, arguments_hash, canonical_json
from tollgate._retry import reconnect_backoff


def test_canonical_json_matches_the_rust_client() -> None:
    v = json.loads('{ "b": [ {"z": 1, "a": null} ], "a": "x\\"y", "c": 1.5 }')
    assert canonical_json(v) == '{"a":"x\\"y","b":[{"a":null,"z":1}],"c":1.5}'
    assert canonical_json([]) == "[]"
    assert canonical_json({}) == "{}"
    assert canonical_json("é") == '"é"'
    # Keys sort by UTF-16 code units: U+1F600 (0xD83D…) before U+FF61.
    assert canonical_json({"\uff61": 1, "\U0001f600": 2, "a": 0}) == (
        '{"a":0,"\U0001f600":2,"\uff61":1}'
    )


def test_arguments_hash_matches_the_rust_client() -> None:
    assert arguments_hash({}) == (
        "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    )
    a = {"url": "https://x", "n": 1}
    assert arguments_hash(a) == arguments_hash({"n": 1, "url": "https://x"})
    assert arguments_hash(a) != arguments_hash({"url": "https://x", "n": 2})


def test_only_429_and_5xx_are_retried_boundedly() -> None:
    p = RetryPolicy()
    for status in (429, 500, 502, 503, 504):
        assert p.next_delay(1, status, None) is not None, status
    for status in (200, 400, 401, 403, 404, 409, 413, 501, 505):
        assert p.next_delay(1, status, None) is None, status
    assert p.next_delay(1, None, None) is not None  # transport error
    assert p.next_delay(4, None, None) is None  # four attempts in all
    assert RetryPolicy.none().next_delay(1, None, None) is None
    delay = p.next_delay(1, 503, 2.0)
    assert delay is not None and delay >= 2.0
    capped = p.next_delay(1, 503, 3600.0)
    assert capped is not None and capped <= 30.0
    for retry in range(1, 8):
        cap = p.backoff_cap(retry)
        assert cap / 2 <= p.delay(retry, None) <= cap


def test_reconnects_back_off_from_the_hint() -> None:
    assert reconnect_backoff(1.0, 1, 30.0) == 1.0
    assert reconnect_backoff(1.0, 3, 30.0) == 4.0
    assert reconnect_backoff(1.0, 40, 30.0) == 30.0
    assert reconnect_backoff(0.0, 1, 30.0) == 0.1
