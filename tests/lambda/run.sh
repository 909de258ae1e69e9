#!/usr/bin/env bash
# Lambda-runtime test tier: each function binary runs under `cargo lambda watch` (a
# local Lambda Runtime API) and is invoked with full API Gateway HTTP API (payload 2.0)
# and Function URL events (HTTP functions), SQS batches (timers) and EventBridge
# scheduled events (stall-watch) against DynamoDB Local; the responses and the event
# stream the runs are left with are asserted with jq.
#
#   tests/harness/emulators.sh with tests/lambda/run.sh [REGEX]
#
# REGEX (optional) keeps only the cases whose "<function>/<case>" matches it (later
# cases usually depend on earlier ones in the same session, so filter with care).
# After the cases, one step that is not a case: replay-stream/90-sse-drops, an SSE
# client dropped 20 times while 1,000 events are appended (tests/lambda/sse_drops.py;
# see "SSE through drops" below); REGEX selects it like a case (`sse-drops`: it alone).
# Assumes the emulator environment is exported (AWS_ENDPOINT_URL_DYNAMODB,
# AWS_ENDPOINT_URL_SECRETS_MANAGER and AWS_ENDPOINT_URL_SQS, or AWS_ENDPOINT_URL;
# AWS_REGION, credentials);
# installs cargo-lambda with tests/harness/lambda-tools.sh. Prints one line per case
# and a final `lambda-runtime: N passed, M failed`; exits non-zero on any failure. Logs
# of a failed run (events sent, answers, watch and function logs) are kept in
# $CACHE/lambda-test/last-failed.
#
# ---------------------------------------------------------------- the case table
#
# fixtures/lambda/<function>/<NN-case>.json   the event, exactly as Lambda hands it over
# fixtures/lambda/<function>/<NN-case>.jq     the expectation: a jq filter that must
#                                             output exactly `true`
#
# <function> is the binary's name (cargo lambda watch serves every bin of the
# workspace under its name). Cases run in the order of NN across all functions (so
# ingress 01-19 write a run, replay 20-29 read it back; 40-49 are the big-page run;
# 50-64 the approval gate: ingress arms cards, approvals decides one, timers and
# stall-watch expire the others, replay reads both runs back),
# one `cargo lambda invoke` each (or N, see x-tollgate-repeat). Each case is rendered
# just before it is invoked, so it can use what earlier answers carried.
#
# The jq filter's input is the function's response payload, e.g. for an HTTP event
# {"statusCode": 201, "headers": {...}, "body": "...", "isBase64Encoded": false, ...}.
# If the invoke itself fails (the function returned an error, or panicked), the input
# is {"invokeError": "<cargo lambda invoke's stderr>", "exitCode": N} instead.
# Helpers and variables available in every filter:
#   json                  the response body parsed as JSON (base64-decoded first when
#                         isBase64Encoded)
#   $run_id, $run_id_<x>  for every __RUN_ID__/__RUN_ID_<X>__ placeholder below
#   $run_token, $run_token_<x>  that run's captured token (below), once an answer
#                         (this case's included) has carried one; referring to it
#                         before fails the case
#   $session, $function
#   $posts                every frame the functions posted to the fake @connections
#                         endpoint so far, in order: [{connection_id, frame, gone}]
#
# Run tokens are not computed here (they are bound to a run's incarnation, which only
# the server knows): whenever an answer's body is JSON with string `run_id` and
# `run_token` (a create, a receipt), the runner remembers that token for that run id.
#
# Placeholders, replaced in the event text before it is sent:
#   __RUN_ID__, __RUN_ID_<X>__       a run id unique to this session
#                                    (DynamoDB Local keeps state while it is up, so
#                                    repeated runs must not reuse run ids)
#   __RUN_TOKEN__, __RUN_TOKEN_<X>__ the captured token of __RUN_ID_<X>__'s run; a case
#                                    needing one that no earlier answer carried fails
#                                    without being invoked (so every run a case uses a
#                                    token of must be created by an earlier case)
# and, after the event is parsed (also inside a JSON `body` string):
#   "__QUOTES_64K__"                 a JSON string exactly this: a string of `"`
#                                    characters as long as fits the enclosing object's
#                                    payload (serialized, without type and event_id)
#                                    just under the 65536-byte producer limit; each `"`
#                                    serializes as two bytes (\"), so the stored event
#                                    is ~64 KiB that doubles again when escaped
# A top-level "x-tollgate-repeat": N in the event is removed before sending; the case
# is then invoked N times, and its expectation must hold for every answer (the first
# one that fails stops the case).
# A `content-length` header is corrected to the rendered body's length. Placeholders
# inside a base64 body are not replaced: keep run ids in the path there.
# JWTs are static in the fixtures (HS256, exp in 2121) and signed with SECRET below;
# mint more with: TOLLGATE_SECRET=<SECRET> ./target/debug/tollgate token --sub S
#   --role agent|operator --ttl 3000000000 (with TOLLGATE_MAX_TOKEN_LIFETIME_SECONDS
#   at least that, as below)
#
# Functions that are not HTTP need nothing special: the payload is whatever the
# function answers. `timers` (SQS) answers an SqsBatchResponse, e.g. case 61 (a symlink
# to ../../sqs/timer-batch-one-malformed.json: 3 records, the second malformed) expects
#       .batchItemFailures == [{"itemIdentifier": "5a1c9e0b-7d2f-4c83-9e61-2b7f0d4a8c13"}]
# (only the malformed message goes back to the queue); `stall-watch` (an EventBridge
# "Scheduled Event") answers {"expired": N}. The runner builds every <function>
# directory's bin; every function gets the same environment.
#
# Environment of the functions: every TOLLGATE_* variable of the caller is dropped
# (except TOLLGATE_CACHE); then TOLLGATE_SECRET_ARN (a secret holding SECRET, created in
# the emulator's Secrets Manager under a fresh name per session: the functions read it
# at cold start, as deployed), TOLLGATE_TIMER_QUEUE_URL (a queue created in the
# emulator's SQS per session: armed cards schedule their timers there; nothing consumes
# it, so no heartbeat reaches a stream), TOLLGATE_BACKEND=aws,
# TOLLGATE_TABLE_PREFIX=tollgate-lambda-test-, TOLLGATE_CREATE_TABLES=1, RUST_LOG=info
# (TOLLGATE_LAMBDA_RUST_LOG overrides). cargo lambda watch starts each function with
# `cargo run --bin <function>` (which execs the binary) with watch's own environment
# (so the AWS_* of the emulators reach it) plus AWS_LAMBDA_FUNCTION_NAME,
# AWS_LAMBDA_RUNTIME_API, AWS_LAMBDA_FUNCTION_MEMORY_SIZE=4096, ... It sets no
# AWS_REGION: without one the SDK asks IMDS and the init fails. A function whose
# process exits (failed init) leaves watch's invoke waiting for ever and is not
# restarted; the runner notices ("command exited" in watch's log), fails that case at
# once and the function's later cases without invoking them.
# Tunables: TOLLGATE_LAMBDA_FIRST_TIMEOUT (s, first invoke of a function, which may
#   build it; default 900), TOLLGATE_LAMBDA_INVOKE_TIMEOUT (s, default 60),
#   TOLLGATE_LAMBDA_CASES (case directory; default fixtures/lambda),
#   TOLLGATE_LAMBDA_SSE_LOG=1 (print the SSE step's per-response log even when it passes).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${TOLLGATE_CACHE:-$REPO/.cache}
CASES_DIR=${TOLLGATE_LAMBDA_CASES:-$REPO/fixtures/lambda}
SECRET=tollgate-lambda-fixtures-secret-not-for-production
TABLE_PREFIX=tollgate-lambda-test-
FIRST_TIMEOUT=${TOLLGATE_LAMBDA_FIRST_TIMEOUT:-900}
INVOKE_TIMEOUT=${TOLLGATE_LAMBDA_INVOKE_TIMEOUT:-60}
READY_TIMEOUT=60
ONLY=${1:-}
SSE_LOG=${TOLLGATE_LAMBDA_SSE_LOG:-}

log() { printf 'lambda: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found"; }

need jq
need python3
need cargo
need setsid
need pgrep
[[ -n ${AWS_ENDPOINT_URL_DYNAMODB:-}${AWS_ENDPOINT_URL:-} ]] ||
  die "no DynamoDB endpoint in the environment; run: tests/harness/emulators.sh with $0"
SECRETS_ENDPOINT=${AWS_ENDPOINT_URL_SECRETS_MANAGER:-${AWS_ENDPOINT_URL:-}}
[[ -n $SECRETS_ENDPOINT ]] ||
  die "no Secrets Manager endpoint in the environment; run: tests/harness/emulators.sh with $0"
SQS_ENDPOINT=${AWS_ENDPOINT_URL_SQS:-${AWS_ENDPOINT_URL:-}}
[[ -n $SQS_ENDPOINT ]] ||
  die "no SQS endpoint in the environment; run: tests/harness/emulators.sh with $0"

T_START=$SECONDS
TOOLS=$("$REPO/tests/harness/lambda-tools.sh")
export PATH="$TOOLS:$PATH"

mkdir -p "$CACHE/lambda-test"
CACHE=$(cd "$CACHE" && pwd)
WORK=$(mktemp -d "$CACHE/lambda-test/run-XXXXXX")
WATCH_PID=
CHILD=
FAILED=0

# Runs cmd in the background with its output in files and waits for it, so that a
# signal's trap runs at once instead of after a long build or invoke (and not with the
# command's redirections in force).
run_bg() { # out err cmd...
  local out=$1 err=$2 rc=0
  shift 2
  if [[ $out == "$err" ]]; then
    "$@" </dev/null >"$out" 2>&1 &
  else
    "$@" </dev/null >"$out" 2>"$err" &
  fi
  CHILD=$!
  wait "$CHILD" || rc=$?
  CHILD=
  return "$rc"
}

any_alive() { # pgid...
  local g
  for g; do kill -0 -- "-$g" 2>/dev/null && return 0; done
  return 1
}

stop_watch() {
  local i g groups
  [[ -n $WATCH_PID ]] || return 0
  # watch leads its own session; it starts each function (`cargo run`, which execs the
  # binary) as the leader of a process group of its own: stop those groups too.
  groups=("$WATCH_PID")
  for g in $(pgrep -P "$WATCH_PID" 2>/dev/null || true); do groups+=("$g"); done
  for g in "${groups[@]}"; do kill -TERM -- "-$g" 2>/dev/null || true; done
  for ((i = 0; i < 50; i++)); do
    any_alive "${groups[@]}" || break
    sleep 0.1
  done
  for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null || true; done
  wait "$WATCH_PID" 2>/dev/null || true
  WATCH_PID=
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP
  [[ -z $CHILD ]] || kill -TERM "$CHILD" 2>/dev/null || true
  [[ -z ${FAKE_PID:-} ]] || kill -TERM "$FAKE_PID" 2>/dev/null || true
  stop_watch
  if ((rc != 0 || FAILED != 0)); then
    rm -rf "$CACHE/lambda-test/last-failed"
    mv "$WORK" "$CACHE/lambda-test/last-failed" 2>/dev/null &&
      log "logs kept in $CACHE/lambda-test/last-failed"
  else
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# ---------------------------------------------------------------- cases

# <function>/<NN-case>.json, ordered by NN-case, then function
mapfile -t CASES < <(cd "$CASES_DIR" && find . -mindepth 2 -maxdepth 2 -name '*.json' |
  sed 's|^\./||' | LC_ALL=C sort -t/ -k2,2 -k1,1)
if [[ -n $ONLY ]]; then
  mapfile -t CASES < <(printf '%s\n' "${CASES[@]}" | grep -E -- "$ONLY" || true)
fi
# The SSE step after the cases (see "SSE through drops" below), selected by REGEX like a
# case; its events are templates in $CASES_DIR/$SSE_STEP (a level below the cases).
SSE_STEP=replay-stream/90-sse-drops
SSE_TEMPLATES=()
if [[ -d $CASES_DIR/$SSE_STEP ]] && { [[ -z $ONLY ]] || grep -qE -- "$ONLY" <<<"$SSE_STEP"; }; then
  mapfile -t SSE_TEMPLATES < <(cd "$CASES_DIR" && find "$SSE_STEP" -maxdepth 1 -name '*.json' | LC_ALL=C sort)
fi
((${#CASES[@]} + ${#SSE_TEMPLATES[@]})) || die "no cases in $CASES_DIR${ONLY:+ matching $ONLY}"
mapfile -t FUNCTIONS < <({
  printf '%s\n' "${CASES[@]%%/*}"
  ((${#SSE_TEMPLATES[@]} == 0)) || printf '%s\n' ingress replay-stream
} | sed '/^$/d' | sort -u)

SESSION=$(date -u +%Y%m%d%H%M%S)-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')

# The case helper, one call per step (state in $WORK: run_ids.json, tokens.json):
#   init CASE...     picks this session's run id for every __RUN_ID[_<X>]__ suffix
#   render CASE      writes $WORK/events/CASE (placeholders, __QUOTES_64K__,
#                    content-length, x-tollgate-repeat removed); prints the repeat
#                    count; fails with the reason on stderr (e.g. a missing token)
#   capture OUT JQ   remembers the run token an answer carries; prints the jq
#                    variables as TSV lines (and on stderr why JQ would miss one)
cat >"$WORK/cases.py" <<'PY'
import base64, json, os, re, sys

PAYLOAD_LIMIT = 65536  # bytes of a producer event's serialized payload
QUOTES = "__QUOTES_64K__"
ID_OR_TOKEN = re.compile(r"__RUN_(ID|TOKEN)((?:_[A-Z0-9]+)*)__")
cmd, src, work, session, *args = sys.argv[1:]
state = lambda name: os.path.join(work, name)


def load(name, default):
    try:
        with open(state(name), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return default


def save(name, value):
    with open(state(name) + ".tmp", "w", encoding="utf-8") as f:
        json.dump(value, f)
    os.replace(state(name) + ".tmp", state(name))


def compact(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def fill_quotes(node):
    """Replaces every "__QUOTES_64K__" string under node. The payload a placeholder
    fills is its nearest enclosing object without type and event_id, the way the
    server measures it (serde_json, compact): the quotes fill it to just under the
    limit (split evenly if the object holds several)."""
    found = False
    if isinstance(node, list):
        for item in node:
            found |= fill_quotes(item)
        return found
    if not isinstance(node, dict):
        return False
    slots = [k for k, v in node.items() if v == QUOTES]
    for k, v in node.items():
        if k not in slots:
            found |= fill_quotes(v)
    if slots:
        payload = {k: v for k, v in node.items() if k not in ("type", "event_id")}
        for k in slots:
            payload[k] = node[k] = ""
        room = PAYLOAD_LIMIT - 1 - len(compact(payload).encode())
        for k in slots:
            node[k] = '"' * (room // (2 * len(slots)))
        found = True
    return found


def render(case):
    run_ids, tokens = load("run_ids.json", {}), load("tokens.json", {})
    with open(os.path.join(src, case), encoding="utf-8") as f:
        text = f.read()

    def sub(m):
        run_id = run_ids[m.group(2)]
        if m.group(1) == "ID":
            return run_id
        if run_id not in tokens:
            x = m.group(2)
            sys.exit(f"{m.group(0)}: no earlier answer carried a run_token for run {run_id} "
                     f"(__RUN_ID{x}__): create it in an earlier case")
        return tokens[run_id]

    try:
        event = json.loads(ID_OR_TOKEN.sub(sub, text))
    except json.JSONDecodeError as e:
        sys.exit(f"{case}: not valid JSON: {e}")
    repeat = 1
    if isinstance(event, dict) and "x-tollgate-repeat" in event:
        repeat = event.pop("x-tollgate-repeat")
        if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
            sys.exit(f"{case}: x-tollgate-repeat must be a whole number >= 1")
    fill_quotes(event)
    headers, body = event.get("headers"), event.get("body")
    if isinstance(body, str) and not event.get("isBase64Encoded") and QUOTES in body:
        try:
            parsed = json.loads(body)
        except json.JSONDecodeError as e:
            sys.exit(f"{case}: {QUOTES} in a body that is not JSON: {e}")
        if fill_quotes(parsed):
            event["body"] = body = compact(parsed)
    if isinstance(headers, dict) and isinstance(body, str):
        raw = base64.b64decode(body) if event.get("isBase64Encoded") else body.encode()
        for key in headers:
            if key.lower() == "content-length":
                headers[key] = str(len(raw))
    out = os.path.join(work, "events", case)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(event, f)
    print(repeat)


def capture(out, jq_file):
    run_ids, tokens = load("run_ids.json", {}), load("tokens.json", {})
    try:
        with open(out, encoding="utf-8") as f:
            answer = json.load(f)
        body = answer["body"]
        if answer.get("isBase64Encoded"):
            body = base64.b64decode(body)
        body = json.loads(body)
    except Exception:  # no JSON body: nothing to capture
        body = None
    if (isinstance(body, dict) and isinstance(body.get("run_id"), str)
            and isinstance(body.get("run_token"), str)):
        tokens[body["run_id"]] = body["run_token"]
        save("tokens.json", tokens)
    print(f"session\t{session}")
    wanted = ""
    if os.path.exists(jq_file):
        with open(jq_file, encoding="utf-8") as f:
            wanted = f.read()
    for suffix, run_id in run_ids.items():
        name = suffix.lower()
        print(f"run_id{name}\t{run_id}")
        if run_id in tokens:
            print(f"run_token{name}\t{tokens[run_id]}")
        elif re.search(rf"\$run_token{name}\b", wanted):
            print(f"$run_token{name}: no answer so far carried a run_token for run "
                  f"{run_id} (__RUN_ID{suffix.upper()}__)", file=sys.stderr)


if cmd == "init":
    texts = []
    for case in args:
        with open(os.path.join(src, case), encoding="utf-8") as f:
            texts.append(f.read())
    suffixes = sorted({m.group(2) for t in texts for m in ID_OR_TOKEN.finditer(t)})
    save("run_ids.json", {s: f"lt-{session}{s.lower().replace('_', '-')}" for s in suffixes})
    save("tokens.json", {})
elif cmd == "render":
    render(*args)
elif cmd == "capture":
    capture(*args)
else:
    sys.exit(f"unknown command {cmd}")
PY
cases() { python3 "$WORK/cases.py" "$1" "$CASES_DIR" "$WORK" "$SESSION" "${@:2}"; }
cases init "${CASES[@]}" "${SSE_TEMPLATES[@]}"

JQ_PRELUDE='def json: (if .isBase64Encoded then (.body | @base64d) else .body end) | fromjson;
'

# ---------------------------------------------------------------- functions

# Every TOLLGATE_* setting of the caller is dropped so that only this file decides.
while read -r v; do
  [[ $v == TOLLGATE_CACHE ]] || unset "$v"
done < <(compgen -e | grep '^TOLLGATE_' || true)
# One call of an AWS JSON-protocol API on the emulator (which checks no signature; it
# reads the region from the Authorization header); prints FIELD of the answer.
aws_json() { # endpoint service target json-version body field
  python3 - "$@" "${AWS_REGION:-us-east-1}" <<'PY'
import json, sys, urllib.error, urllib.request

endpoint, service, target, version, body, field, region = sys.argv[1:]
request = urllib.request.Request(
    endpoint.rstrip("/") + "/", method="POST", data=body.encode(),
    headers={
        "X-Amz-Target": target,
        "Content-Type": f"application/x-amz-json-{version}",
        "Authorization": f"AWS4-HMAC-SHA256 Credential=test/20200101/{region}/"
                         f"{service}/aws4_request, SignedHeaders=host, Signature=0",
    })
try:
    with urllib.request.urlopen(request, timeout=30) as answer:
        print(json.load(answer)[field])
except (urllib.error.URLError, OSError, KeyError, ValueError) as e:
    detail = e.read().decode(errors="replace") if isinstance(e, urllib.error.HTTPError) else ""
    sys.exit(f"lambda: {target} at {endpoint} failed: {e} {detail}")
PY
}

# The functions read the signing secret from Secrets Manager at cold start, as deployed:
# a secret of this session holding SECRET (the JWTs in the fixtures are signed with it).
TOLLGATE_SECRET_ARN=$(aws_json "$SECRETS_ENDPOINT" secretsmanager secretsmanager.CreateSecret 1.1 \
    "$(jq -nc --arg name "tollgate-lambda-test-$SESSION" --arg value "$SECRET" \
        --arg token "$(python3 -c 'import uuid; print(uuid.uuid4())')" \
        '{Name: $name, SecretString: $value, ClientRequestToken: $token}')" ARN) ||
  die "could not create the signing secret in Secrets Manager ($SECRETS_ENDPOINT)"
log "signing secret: $TOLLGATE_SECRET_ARN"
# Arming a card schedules its expiry and first heartbeat on the timer queue, as deployed:
# a queue of this session (nothing consumes it; the timers cases hand their batches to
# the function directly).
TOLLGATE_TIMER_QUEUE_URL=$(aws_json "$SQS_ENDPOINT" sqs AmazonSQS.CreateQueue 1.0 \
    "$(jq -nc --arg name "tollgate-lambda-test-timers-$SESSION" '{QueueName: $name}')" QueueUrl) ||
  die "could not create the timer queue in SQS ($SQS_ENDPOINT)"
log "timer queue: $TOLLGATE_TIMER_QUEUE_URL"
# The fixtures' JWTs are static (exp in 2121): accept their lifetime here only.
export TOLLGATE_SECRET_ARN TOLLGATE_TIMER_QUEUE_URL TOLLGATE_BACKEND=aws TOLLGATE_TABLE_PREFIX=$TABLE_PREFIX \
  TOLLGATE_CREATE_TABLES=1 RUST_LOG=${TOLLGATE_LAMBDA_RUST_LOG:-info} \
  TOLLGATE_MAX_TOKEN_LIFETIME_SECONDS=4000000000
export AWS_REGION=${AWS_REGION:-us-east-1}

# Build first, so that the first invoke measures a start, not a compile: watch runs
# `cargo run --bin <function>`, which then finds the binary up to date.
t0=$SECONDS
bins=()
for f in "${FUNCTIONS[@]}"; do bins+=(--bin "$f"); done
# shellcheck disable=SC2016 # $1 and $@ belong to the inner bash
if ! run_bg "$WORK/build.log" "$WORK/build.log" \
    bash -c 'cd "$1" && shift && exec cargo build "$@"' build "$REPO" "${bins[@]}"; then
  tail -n 30 "$WORK/build.log" | sed 's/^/  | /' >&2
  die "cargo build ${bins[*]} failed"
fi
log "built ${FUNCTIONS[*]} (debug) in $((SECONDS - t0))s"

# The WebSocket functions post frames to a fake @connections endpoint on loopback
# (tests/lambda/fake_connections.py): every post is a line of $WORK/posts.jsonl, which
# each expectation sees as $posts; a connection id starting with gone- answers 410.
: >"$WORK/posts.jsonl"
python3 "$HERE/fake_connections.py" "$WORK/posts.jsonl" >"$WORK/fake-connections.url" \
  2>"$WORK/fake-connections.log" &
FAKE_PID=$!
for ((i = 0; i < 100; i++)); do
  [[ -s $WORK/fake-connections.url ]] && break
  sleep 0.1
done
TOLLGATE_WEBSOCKET_ENDPOINT=$(head -n 1 "$WORK/fake-connections.url")
[[ -n $TOLLGATE_WEBSOCKET_ENDPOINT ]] || die "the fake @connections endpoint did not start"
export TOLLGATE_WEBSOCKET_ENDPOINT
log "fake @connections endpoint: $TOLLGATE_WEBSOCKET_ENDPOINT"
# The notifier posts its webhook to the same endpoint (its posts are $posts entries with
# connection_id "webhook"), signed with the suite's secret; loopback http is allowed for it.
export TOLLGATE_WEBHOOK_URL="$TOLLGATE_WEBSOCKET_ENDPOINT/@connections/webhook" \
  TOLLGATE_WEBHOOK_SECRET_ARN=$TOLLGATE_SECRET_ARN TOLLGATE_ALLOW_LOOPBACK_ORIGINS=1

free_port() {
  python3 -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Starts cargo lambda watch on a free loopback port, in its own session.
start_watch() {
  local attempt deadline
  for attempt in 1 2 3; do
    PORT=$(free_port)
    (cd "$REPO" && exec setsid cargo lambda watch --ignore-changes --color never \
        --invoke-address 127.0.0.1 --invoke-port "$PORT") </dev/null >"$WORK/watch.log" 2>&1 &
    WATCH_PID=$!
    deadline=$((SECONDS + READY_TIMEOUT))
    while ((SECONDS < deadline)); do
      # The Runtime API accepts connections once it is up.
      (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && return 0
      kill -0 "$WATCH_PID" 2>/dev/null || break
      sleep 0.1
    done
    if grep -qi 'address already in use' "$WORK/watch.log" && ((attempt < 3)); then
      stop_watch
      continue
    fi
    tail -n 20 "$WORK/watch.log" | sed 's/^/  | /' >&2
    die "cargo lambda watch did not start"
  done
}

# Runs cmd for at most timeout seconds, its output in out and err. If a function process
# ends meanwhile (e.g. its init failed: watch then logs "command exited" and keeps the
# invoke waiting forever), cmd is stopped at once (125).
run_watched() { # out err timeout watch-log-lines-before cmd...
  local rc=0 out=$1 err=$2 limit=$3 lines=$4
  shift 4
  timeout -k 5 "$limit" "$@" </dev/null >"$out" 2>"$err" &
  CHILD=$!
  while kill -0 "$CHILD" 2>/dev/null; do
    if tail -n +"$((lines + 1))" "$WORK/watch.log" | grep -q 'command exited'; then
      sleep 0.5  # an answer that was on its way still wins
      if kill -0 "$CHILD" 2>/dev/null; then
        kill -TERM "$CHILD" 2>/dev/null || true
        wait "$CHILD" 2>/dev/null || true
        CHILD=
        echo "the function process exited before answering (see the function log)" >>"$err"
        return 125
      fi
    fi
    sleep 0.02
  done
  wait "$CHILD" || rc=$?
  CHILD=
  return "$rc"
}

# Sends one event; the answer goes to out, cargo lambda invoke's errors to err.
invoke() { # function event out err timeout watch-log-lines-before
  local cmd=(cargo lambda invoke "$1" --data-file "$2"
    --invoke-address 127.0.0.1 --invoke-port "$PORT" --color never)
  # Response-streaming functions (named *-stream) answer with a prelude that
  # `cargo lambda invoke` cannot read; invoke_stream.py reads it as a Function URL would.
  [[ $1 == *-stream ]] && cmd=(python3 "$HERE/invoke_stream.py" "$PORT" "$1" "$2")
  run_watched "$3" "$4" "$5" "$6" "${cmd[@]}"
}

t0=$SECONDS
start_watch
log "cargo lambda watch on 127.0.0.1:$PORT (session $SESSION)"

# ---------------------------------------------------------------- run

PASSED=0
declare -A STARTED=() DEAD=()
width=0
for c in "${CASES[@]}"; do ((${#c} - 5 > width)) && width=$((${#c} - 5)); done
((${#SSE_TEMPLATES[@]} == 0 || ${#SSE_STEP} <= width)) || width=${#SSE_STEP}

# One answer of a case: invoke (unless the function's process is gone), capture the run
# token the answer carries, evaluate the expectation. Sets STATUS and VERDICT.
answer_once() { # function name event out err jqerr timeout watch-lines
  local fn=$1 name=$2 event=$3 out=$4 err=$5 jqerr=$6 rc=0 k v vars=()
  if [[ -n ${DEAD[$fn]:-} ]]; then
    # watch does not start a new instance after one exited: its invokes would hang.
    echo "not invoked: the $fn process exited in ${DEAD[$fn]}" >"$err"
    rc=125
  else
    invoke "$fn" "$event" "$out" "$err" "$7" "$8" || rc=$?
    ((rc != 125)) || DEAD[$fn]=$name
  fi
  if ((rc != 0)) || ! jq -e . "$out" >/dev/null 2>&1; then
    jq -n --rawfile e "$err" --argjson rc "$rc" '{invokeError: $e, exitCode: $rc}' >"$out.invoke"
    mv "$out.invoke" "$out"
  fi
  STATUS=$(jq -r '.statusCode // (if .invokeError then "error" else "-" end)' "$out" 2>/dev/null || echo '?')
  : >"$jqerr"
  while IFS=$'\t' read -r k v; do vars+=(--arg "$k" "$v"); done \
    < <(cases capture "$out" "$CASES_DIR/$name.jq" 2>>"$jqerr")
  VERDICT=
  if [[ -f $CASES_DIR/$name.jq ]]; then
    VERDICT=$(jq -c "${vars[@]}" --arg function "$fn" --slurpfile posts "$WORK/posts.jsonl" \
      "$JQ_PRELUDE$(cat "$CASES_DIR/$name.jq")" "$out" 2>>"$jqerr" || true)
  else
    echo "no expectation file $name.jq" >>"$jqerr"
  fi
}

for c in "${CASES[@]}"; do
  name=${c%.json}
  fn=${c%%/*}
  event=$WORK/events/$c
  base=$WORK/out/$name
  mkdir -p "$(dirname "$base")"
  timeout=$INVOKE_TIMEOUT
  cold=
  if [[ -z ${STARTED[$fn]:-} ]]; then
    timeout=$FIRST_TIMEOUT cold=" cold"
  fi
  t_case=$(date +%s%N)
  STATUS=- VERDICT= repeat=1 i=0 out= watch_lines=$(wc -l <"$WORK/watch.log")
  # Rendered now, so that tokens captured from earlier answers are filled in.
  if repeat=$(cases render "$c" 2>"$base.render"); then
    STARTED[$fn]=1
    for ((i = 1; i <= repeat; i++)); do
      suffix=
      ((repeat == 1)) || suffix=.$i
      out=$base$suffix.json
      watch_lines=$(wc -l <"$WORK/watch.log")
      answer_once "$fn" "$name" "$event" "$out" "$base$suffix.err" "$base$suffix.jqerr" \
        "$timeout" "$watch_lines"
      timeout=$INVOKE_TIMEOUT
      [[ $VERDICT == true ]] || break
    done
  else
    repeat=1 cold=
  fi
  ms=$((($(date +%s%N) - t_case) / 1000000))
  times=
  ((repeat == 1)) || times=" x$repeat"
  if [[ $VERDICT == true ]]; then
    PASSED=$((PASSED + 1))
    printf 'ok    %-*s %5s %6sms%s%s\n' "$width" "$name" "$STATUS" "$ms" "$cold" "$times"
  else
    FAILED=$((FAILED + 1))
    printf 'FAIL  %-*s %5s %6sms%s%s\n' "$width" "$name" "$STATUS" "$ms" "$cold" "$times"
    if [[ -z $out ]]; then
      echo "  not invoked: the case could not be rendered:"
      sed 's/^/  | /' "$base.render"
    else
      {
        ((repeat == 1)) || echo "  answer $i of $repeat:"
        echo "  expectation ($name.jq) gave: ${VERDICT:-nothing}"
        sed 's/^/  jq: /' "${out%.json}.jqerr"
        echo "  response:"
        jq . "$out" 2>/dev/null | head -c 3000 | sed 's/^/  | /'
        echo "  function log (this invoke):"
        tail -n +"$((watch_lines + 1))" "$WORK/watch.log" | tail -n 15 | cut -c1-400 | sed 's/^/  | /'
      }
    fi
  fi
done

# ---------------------------------------------------------------- SSE through drops
#
# Issue 9 through the streaming Lambda: an SSE client dropped 20 times at random points
# while 1,000 events are appended receives every sequence exactly once, in order. The
# events are templates in $SSE_STEP/ (not cases: they are sent by this step):
#   01-create-run-apigw.json   ingress creates __RUN_ID_SSE__ (invoked like a case, with
#                              its .jq; its answer's token becomes __RUN_TOKEN_SSE__)
#   02-append-events-apigw.json, 03-complete-run-apigw.json   ingress, API Gateway
#   04-stream-function-url.json   replay-stream, Function URL, accept: text/event-stream
# then tests/lambda/sse_drops.py appends 1,000 events in batches of 25 through ingress
# and completes the run while it streams replay-stream, reading the body as watch
# streams it, dropping the connection at 20 random points and resuming with
# last-event-id, until `event: done` (see that file for what it asserts). Bounded by
# SSE_DEADLINE seconds; prints its summary line under the step's own.
# Under cargo lambda watch the invocation's deadline is in the past (its Runtime API
# sends lambda-runtime-deadline-ms: 600000), so each streamed response serves what is
# there and ends (a zero window): the client resumes after the retry hint every time.
SSE_DEADLINE=60
sse_drops_step() {
  local name=$SSE_STEP base=$WORK/out/$SSE_STEP t_case timeout=$INVOKE_TIMEOUT t run_id
  local why= rc=0 lines cold=
  mkdir -p "$base"
  t_case=$(date +%s%N)
  STATUS=- VERDICT=
  [[ -n ${STARTED[ingress]:-} ]] || timeout=$FIRST_TIMEOUT cold=" cold"
  lines=$(wc -l <"$WORK/watch.log")
  if ! cases render "$name/01-create-run-apigw.json" >/dev/null 2>"$base/render"; then
    why="the create event could not be rendered: $(cat "$base/render")"
  else
    STARTED[ingress]=1
    answer_once ingress "$name/01-create-run-apigw" "$WORK/events/$name/01-create-run-apigw.json" \
      "$base/01-create.json" "$base/01-create.err" "$base/01-create.jqerr" "$timeout" "$lines"
    [[ $VERDICT == true ]] ||
      why="creating the run: expectation gave ${VERDICT:-nothing}: $(jq -c . "$base/01-create.json" 2>/dev/null | head -c 600)"
  fi
  if [[ -z $why ]]; then
    for t in 02-append-events-apigw 03-complete-run-apigw 04-stream-function-url; do
      cases render "$name/$t.json" >/dev/null 2>"$base/render" ||
        { why="$t could not be rendered: $(cat "$base/render")"; break; }
    done
  fi
  if [[ -z $why ]]; then
    [[ -n ${STARTED[replay-stream]:-} ]] || cold=" cold"
    STARTED[replay-stream]=1
    run_id=$(jq -r '._SSE' "$WORK/run_ids.json")
    lines=$(wc -l <"$WORK/watch.log")
    run_watched "$base/sse.out" "$base/sse.err" $((SSE_DEADLINE + 30)) "$lines" \
      python3 "$HERE/sse_drops.py" "$PORT" "$run_id" \
        "$WORK/events/$name/02-append-events-apigw.json" \
        "$WORK/events/$name/03-complete-run-apigw.json" \
        "$WORK/events/$name/04-stream-function-url.json" \
        --events 1000 --batch 25 --drops 20 --deadline "$SSE_DEADLINE" --log || rc=$?
    STATUS=$rc
    ((rc == 0)) || why="sse_drops.py exited with $rc"
    ((rc != 124)) || why="sse_drops.py did not finish in $((SSE_DEADLINE + 30))s"
  fi
  local ms=$((($(date +%s%N) - t_case) / 1000000))
  if [[ -z $why ]]; then
    PASSED=$((PASSED + 1))
    printf 'ok    %-*s %5s %6sms%s\n' "$width" "$name" "-" "$ms" "$cold"
    sed 's/^/      /' "$base/sse.out"
    [[ -z $SSE_LOG ]] || sed 's/^/      | /' "$base/sse.err"
  else
    FAILED=$((FAILED + 1))
    printf 'FAIL  %-*s %5s %6sms%s\n' "$width" "$name" "$STATUS" "$ms" "$cold"
    echo "  $why"
    [[ ! -s $base/sse.err ]] || tail -n 20 "$base/sse.err" | sed 's/^/  | /'
    echo "  function log (this step):"
    tail -n +"$((lines + 1))" "$WORK/watch.log" | tail -n 15 | cut -c1-400 | sed 's/^/  | /'
  fi
}
((${#SSE_TEMPLATES[@]} == 0)) || sse_drops_step

stop_watch
log "done in $((SECONDS - T_START))s (invokes and watch: $((SECONDS - t0))s)"
echo "lambda-runtime: $PASSED passed, $FAILED failed"
((FAILED == 0))
