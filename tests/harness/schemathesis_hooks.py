"""Schemathesis hooks for `tests/harness/openapi.sh fuzz`: every request goes out with
the credential its operation's `security` names, on runs this process owns.

- Operations a run token may call (`runToken`) act, most of the time, on one of a few
  runs created here (`POST /api/runs` with the agent JWT; a fresh one every so often, so
  that ended runs do not make every later call a 409), with that run's token; a run the
  stateful phase created through a link keeps the token its create answered.
- Otherwise the operator JWT where the operation admits it, else the agent JWT.
- Operations without `security` are sent as generated.

Links: the document's own (create run → append / arm / replay / end; arm → decide →
read the card; start → dispatch → settle → read the record) drive the stateful phase.

Reads TOLLGATE_URL, AGENT_TOKEN and OPERATOR_TOKEN from the environment.
"""

import os
import random
import threading

import requests
import schemathesis

BASE = os.environ["TOLLGATE_URL"].rstrip("/")
AGENT = os.environ["AGENT_TOKEN"]
OPERATOR = os.environ["OPERATOR_TOKEN"]

# How often a run-token call acts on a run created here rather than the generated id.
OWN_RUN_SHARE = 0.85
# A new run every this many calls; the last few stay in use.
NEW_RUN_EVERY = 25
KEPT_RUNS = 4

_lock = threading.Lock()
_pool = []  # [(run_id, run_token)]
_tokens = {}  # run_id -> run_token, every run created here or answered to the fuzzer
_calls = 0


def _create_run():
    answer = requests.post(
        f"{BASE}/api/runs",
        json={"budget": {"tools": {"web_fetch": 5}, "call_ceiling": 10}},
        headers={"Authorization": f"Bearer {AGENT}"},
        timeout=10,
    )
    if answer.status_code not in (200, 201):
        raise RuntimeError(f"creating a run answered {answer.status_code}: {answer.text}")
    body = answer.json()
    return body["run_id"], body["run_token"]


def _own_run():
    global _calls
    with _lock:
        _calls += 1
        if not _pool or _calls % NEW_RUN_EVERY == 0:
            run = _create_run()
            _tokens[run[0]] = run[1]
            _pool.append(run)
            del _pool[:-KEPT_RUNS]
        return random.choice(_pool)


def _schemes(case):
    raw = case.operation.definition.raw
    root = case.operation.schema.raw_schema
    requirements = raw.get("security", root.get("security")) or []
    return {name for requirement in requirements for name in requirement}


@schemathesis.hook
def before_call(context, case, kwargs):
    schemes = _schemes(case)
    if not schemes:
        return
    run_id = (case.path_parameters or {}).get("run_id")
    token = None
    if "runToken" in schemes and run_id is not None:
        with _lock:
            token = _tokens.get(str(run_id))
        if token is None and random.random() < OWN_RUN_SHARE:
            run_id, token = _own_run()
            case.path_parameters["run_id"] = run_id
    if token is None:
        if "operatorJwt" in schemes:
            token = OPERATOR
        elif "agentJwt" in schemes:
            token = AGENT
        elif "runToken" in schemes:
            # No run in the path: none of ours applies; the operator's is refused as any
            # wrong credential is.
            token = OPERATOR
        else:
            return
    if case.headers is None:
        case.headers = {}
    case.headers["Authorization"] = f"Bearer {token}"


@schemathesis.hook
def after_call(context, case, response):
    """Remembers the token of every run the fuzzer created, for the calls that follow."""
    if case.operation.method.lower() != "post" or case.operation.path != "/api/runs":
        return
    if response.status_code not in (200, 201):
        return
    try:
        body = response.json()
    except ValueError:
        return
    if isinstance(body, dict) and "run_id" in body and "run_token" in body:
        with _lock:
            _tokens[body["run_id"]] = body["run_token"]
