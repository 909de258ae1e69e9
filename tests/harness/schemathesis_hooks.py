"""Schemathesis hooks for `tests/harness/openapi.sh fuzz`: every request goes out with
the credential its operation's `security` names, on runs this process owns.

- Operations a run token may call (`runToken`) act, most of the time, on one of a few
  runs created here (`POST /api/runs` with the agent JWT; a fresh one every so often, so
  that ended runs do not make every later call a 409), with that run's token; a run the
  stateful phase created through a link keeps the token its create answered.
- Otherwise the operator JWT where the operation admits it, else the agent JWT.
- Operations without `security` are sent as generated.

Links: when the document names none for an operation below, the stateful phase gets
these (create run → append → arm → decide → replay; arm → read the card; start →
dispatch → settle), so that it walks a run's life in order.

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


def _link(operation_id, parameters, body=None):
    link = {"operationId": operation_id, "parameters": parameters}
    if body is not None:
        link["requestBody"] = body
    return link


RUN_FROM_BODY = {"run_id": "$response.body#/run_id"}
RUN_FROM_PATH = {"run_id": "$request.path.run_id"}

# operationId -> status -> {link name: link}
LINKS = {
    "createRun": {
        "201": {
            "AppendEvents": _link("appendEvents", RUN_FROM_BODY),
            "ArmApproval": _link("armApproval", RUN_FROM_BODY),
            "ReplayEvents": _link("replayEvents", RUN_FROM_BODY),
            "CompleteRun": _link("completeRun", RUN_FROM_BODY),
        }
    },
    "appendEvents": {
        "200": {
            "ArmApproval": _link("armApproval", RUN_FROM_PATH),
            "ReplayEvents": _link("replayEvents", RUN_FROM_PATH),
        }
    },
    "armApproval": {
        "201": {
            "Approve": _link(
                "approve",
                RUN_FROM_PATH,
                {"request_id": "$response.body#/request_id", "scope": "once"},
            ),
            "Deny": _link("deny", RUN_FROM_PATH, {"request_id": "$response.body#/request_id"}),
            "ReadCard": _link(
                "readCard",
                {"run_id": "$request.path.run_id", "request_id": "$response.body#/request_id"},
            ),
        }
    },
    "approve": {
        "200": {
            "ReplayEvents": _link("replayEvents", RUN_FROM_PATH),
            "ListRunApprovals": _link("listRunApprovals", RUN_FROM_PATH),
        }
    },
    "startExecution": {
        "200": {
            "Dispatch": _link(
                "dispatchExecution",
                {"run_id": "$request.path.run_id", "tool_call_id": "$request.path.tool_call_id"},
                {"approval_id": "$request.body#/approval_id"},
            ),
        }
    },
    "dispatchExecution": {
        "200": {
            "Settle": _link(
                "settleExecution",
                {"run_id": "$request.path.run_id", "tool_call_id": "$request.path.tool_call_id"},
                {"approval_id": "$request.body#/approval_id", "evidence": "confirmed"},
            ),
        }
    },
}


@schemathesis.hook
def before_load_schema(context, raw_schema):
    """Adds the links above where the document names none for that answer."""
    present = set()
    for item in raw_schema.get("paths", {}).values():
        for operation in item.values():
            if isinstance(operation, dict) and "operationId" in operation:
                present.add(operation["operationId"])
    for item in raw_schema.get("paths", {}).values():
        for operation in item.values():
            if not isinstance(operation, dict):
                continue
            by_status = LINKS.get(operation.get("operationId"), {})
            for status, links in by_status.items():
                response = operation.get("responses", {}).get(status)
                if response is None or "$ref" in response or response.get("links"):
                    continue
                usable = {n: l for n, l in links.items() if l["operationId"] in present}
                if usable:
                    response["links"] = usable
