#!/usr/bin/env bash
# Lambda-runtime test tier: each function binary runs under `cargo lambda watch` (a
# local Lambda Runtime API) and is invoked with full API Gateway HTTP API (payload 2.0)
# and Function URL events against DynamoDB Local; the responses and the event stream
# the run leaves are asserted with jq.
#
#   tests/harness/emulators.sh with tests/lambda/run.sh [REGEX]
#
# REGEX (optional) keeps only the cases whose "<function>/<case>" matches it (later
# cases usually depend on earlier ones in the same session, so filter with care).
# Assumes the emulator environment is exported (AWS_ENDPOINT_URL_DYNAMODB or
# AWS_ENDPOINT_URL, AWS_REGION, credentials); installs cargo-lambda with
# tests/harness/lambda-tools.sh. Prints one line per case and a final
# `lambda-runtime: N passed, M failed`; exits non-zero on any failure. Logs of a failed
# run (events sent, answers, watch and function logs) are kept in
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
# ingress 01-19 write a run, replay 20-29 read it back), one `cargo lambda invoke` each.
#
# The jq filter's input is the function's response payload, e.g. for an HTTP event
# {"statusCode": 201, "headers": {...}, "body": "...", "isBase64Encoded": false, ...}.
# If the invoke itself fails (the function returned an error, or panicked), the input
# is {"invokeError": "<cargo lambda invoke's stderr>", "exitCode": N} instead.
# Helpers and variables available in every filter:
#   json                  the response body parsed as JSON (base64-decoded first when
#                         isBase64Encoded)
#   $run_id, $run_token   and $run_id_<x>, $run_token_<x> for every placeholder below
#   $session, $function
#
# Placeholders, replaced in the event text before it is sent:
#   __RUN_ID__, __RUN_ID_<X>__       a run id unique to this session
#                                    (DynamoDB Local keeps state while it is up, so
#                                    repeated runs must not reuse run ids)
#   __RUN_TOKEN__, __RUN_TOKEN_<X>__ that run's token, hex(HMAC-SHA256(HMAC-SHA256(secret, "tollgate run-token key v1"), run id))
# A `content-length` header is corrected to the rendered body's length. Placeholders
# inside a base64 body are not replaced: keep run ids in the path there.
# JWTs are static in the fixtures (HS256, exp in 2121) and signed with SECRET below;
# mint more with: TOLLGATE_SECRET=<SECRET> ./target/debug/tollgate token --sub S
#   --role agent|operator --ttl 3000000000
#
# Adding an SQS-triggered function (say `timer`, a bin that runs
# lambda_runtime::run(service_fn(...)) returning an SqsBatchResponse) takes ONE case:
#   fixtures/lambda/timer/30-batch-one-malformed.json
#       (a copy of, or a symlink to ../../sqs/timer-batch-one-malformed.json: 3 records,
#       the second with a malformed body)
#   fixtures/lambda/timer/30-batch-one-malformed.jq
#       .batchItemFailures == [{"itemIdentifier": "5a1c9e0b-7d2f-4c83-9e61-2b7f0d4a8c13"}]
# i.e. the response payload lists exactly the malformed message's messageId, so Lambda
# retries only that one. The runner builds every <function> directory's bin and needs
# no other change; the function gets the same environment as ingress and replay.
#
# Environment of the functions: every TOLLGATE_* variable of the caller is dropped
# (except TOLLGATE_CACHE); then TOLLGATE_SECRET=SECRET, TOLLGATE_BACKEND=aws,
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
#   TOLLGATE_LAMBDA_CASES (case directory; default fixtures/lambda).
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
((${#CASES[@]})) || die "no cases in $CASES_DIR${ONLY:+ matching $ONLY}"
mapfile -t FUNCTIONS < <(printf '%s\n' "${CASES[@]%%/*}" | sort -u)

SESSION=$(date -u +%Y%m%d%H%M%S)-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')

# Renders every case's event into $WORK/events (placeholders, content-length) and
# writes the jq variables to $WORK/vars.json.
python3 - "$CASES_DIR" "$WORK" "$SESSION" "$SECRET" "${CASES[@]}" <<'PY'
import base64, hashlib, hmac, json, os, re, sys

src, work, session, secret, *cases = sys.argv[1:]
pat = re.compile(r"__RUN_(ID|TOKEN)((?:_[A-Z0-9]+)*)__")
texts = {}
for case in cases:
    with open(os.path.join(src, case), encoding="utf-8") as f:
        texts[case] = f.read()
suffixes = sorted({m.group(2) for t in texts.values() for m in pat.finditer(t)})
run_ids = {s: f"lt-{session}{s.lower().replace('_', '-')}" for s in suffixes}

def token(run_id):
    key = hmac.new(secret.encode(), b"tollgate run-token key v1", hashlib.sha256).digest()
    return hmac.new(key, run_id.encode(), hashlib.sha256).hexdigest()

vars_ = {"session": session}
for s, run_id in run_ids.items():
    vars_["run_id" + s.lower()] = run_id
    vars_["run_token" + s.lower()] = token(run_id)

def sub(m):
    run_id = run_ids[m.group(2)]
    return run_id if m.group(1) == "ID" else token(run_id)

for case, text in texts.items():
    try:
        event = json.loads(pat.sub(sub, text))
    except json.JSONDecodeError as e:
        sys.exit(f"lambda: {case}: not valid JSON: {e}")
    headers, body = event.get("headers"), event.get("body")
    if isinstance(headers, dict) and isinstance(body, str):
        raw = base64.b64decode(body) if event.get("isBase64Encoded") else body.encode()
        for key in headers:
            if key.lower() == "content-length":
                headers[key] = str(len(raw))
    out = os.path.join(work, "events", case)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(event, f)
with open(os.path.join(work, "vars.json"), "w") as f:
    json.dump(vars_, f)
PY

JQ_VARS=()
while IFS=$'\t' read -r k v; do JQ_VARS+=(--arg "$k" "$v"); done \
  < <(jq -r 'to_entries[] | [.key, .value] | @tsv' "$WORK/vars.json")

JQ_PRELUDE='def json: (if .isBase64Encoded then (.body | @base64d) else .body end) | fromjson;
'

# ---------------------------------------------------------------- functions

# Every TOLLGATE_* setting of the caller is dropped so that only this file decides.
while read -r v; do
  [[ $v == TOLLGATE_CACHE ]] || unset "$v"
done < <(compgen -e | grep '^TOLLGATE_' || true)
export TOLLGATE_SECRET=$SECRET TOLLGATE_BACKEND=aws TOLLGATE_TABLE_PREFIX=$TABLE_PREFIX \
  TOLLGATE_CREATE_TABLES=1 RUST_LOG=${TOLLGATE_LAMBDA_RUST_LOG:-info}
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

# Sends one event; the answer goes to out, cargo lambda invoke's errors to err. If the
# function process ends meanwhile (e.g. its init failed: watch then logs "command
# exited" and keeps the invoke waiting forever), the invoke is stopped at once.
invoke() { # function event out err timeout watch-log-lines-before
  local rc=0
  local cmd=(cargo lambda invoke "$1" --data-file "$2"
    --invoke-address 127.0.0.1 --invoke-port "$PORT" --color never)
  # Response-streaming functions (named *-stream) answer with a prelude that
  # `cargo lambda invoke` cannot read; invoke_stream.py reads it as a Function URL would.
  [[ $1 == *-stream ]] && cmd=(python3 "$HERE/invoke_stream.py" "$PORT" "$1" "$2")
  timeout -k 5 "$5" "${cmd[@]}" </dev/null >"$3" 2>"$4" &
  CHILD=$!
  while kill -0 "$CHILD" 2>/dev/null; do
    if tail -n +"$(($6 + 1))" "$WORK/watch.log" | grep -q 'command exited'; then
      sleep 0.5  # an answer that was on its way still wins
      if kill -0 "$CHILD" 2>/dev/null; then
        kill -TERM "$CHILD" 2>/dev/null || true
        wait "$CHILD" 2>/dev/null || true
        CHILD=
        echo "the function process exited before answering (see the function log)" >>"$4"
        return 125
      fi
    fi
    sleep 0.02
  done
  wait "$CHILD" || rc=$?
  CHILD=
  return "$rc"
}

t0=$SECONDS
start_watch
log "cargo lambda watch on 127.0.0.1:$PORT (session $SESSION)"

# ---------------------------------------------------------------- run

PASSED=0
declare -A STARTED=() DEAD=()
width=0
for c in "${CASES[@]}"; do ((${#c} - 5 > width)) && width=$((${#c} - 5)); done

for c in "${CASES[@]}"; do
  name=${c%.json}
  fn=${c%%/*}
  event=$WORK/events/$c
  out=$WORK/out/$name.json
  err=$WORK/out/$name.err
  mkdir -p "$(dirname "$out")"
  timeout=$INVOKE_TIMEOUT
  cold=
  if [[ -z ${STARTED[$fn]:-} ]]; then
    timeout=$FIRST_TIMEOUT cold=" cold"
    STARTED[$fn]=1
  fi
  watch_lines=$(wc -l <"$WORK/watch.log")
  t_case=$(date +%s%N)
  rc=0
  if [[ -n ${DEAD[$fn]:-} ]]; then
    # watch does not start a new instance after one exited: its invokes would hang.
    echo "not invoked: the $fn process exited in ${DEAD[$fn]}" >"$err"
    rc=125
  else
    invoke "$fn" "$event" "$out" "$err" "$timeout" "$watch_lines" || rc=$?
    ((rc != 125)) || DEAD[$fn]=$name
  fi
  ms=$((($(date +%s%N) - t_case) / 1000000))
  if ((rc != 0)) || ! jq -e . "$out" >/dev/null 2>&1; then
    jq -n --rawfile e "$err" --argjson rc "$rc" '{invokeError: $e, exitCode: $rc}' >"$out.invoke"
    mv "$out.invoke" "$out"
  fi
  status=$(jq -r '.statusCode // (if .invokeError then "error" else "-" end)' "$out" 2>/dev/null || echo '?')
  verdict=
  if [[ -f $CASES_DIR/$name.jq ]]; then
    verdict=$(jq -c "${JQ_VARS[@]}" --arg function "$fn" \
      "$JQ_PRELUDE$(cat "$CASES_DIR/$name.jq")" "$out" 2>"$WORK/out/$name.jqerr" || true)
  else
    echo "no expectation file $name.jq" >"$WORK/out/$name.jqerr"
  fi
  if [[ $verdict == true ]]; then
    PASSED=$((PASSED + 1))
    printf 'ok    %-*s %5s %6sms%s\n' "$width" "$name" "$status" "$ms" "$cold"
  else
    FAILED=$((FAILED + 1))
    printf 'FAIL  %-*s %5s %6sms%s\n' "$width" "$name" "$status" "$ms" "$cold"
    {
      echo "  expectation ($name.jq) gave: ${verdict:-nothing}"
      sed 's/^/  jq: /' "$WORK/out/$name.jqerr"
      echo "  response:"
      jq . "$out" 2>/dev/null | head -c 3000 | sed 's/^/  | /'
      echo "  function log (this invoke):"
      tail -n +"$((watch_lines + 1))" "$WORK/watch.log" | tail -n 15 | cut -c1-400 | sed 's/^/  | /'
    }
  fi
done

stop_watch
log "done in $((SECONDS - T_START))s (invokes and watch: $((SECONDS - t0))s)"
echo "lambda-runtime: $PASSED passed, $FAILED failed"
((FAILED == 0))
