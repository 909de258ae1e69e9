#!/usr/bin/env bash
# The OpenAPI document against the server it describes. Tools from PyPI, pinned in
# tests/harness/openapi-requirements.txt, installed into a venv under
# ${TOLLGATE_CACHE:-<repo>/.cache}/openapi-tools (again when the pins change).
#
#   tests/harness/openapi.sh validate [DOCUMENT]
#       DOCUMENT (default: openapi.json at the repository root) is valid OpenAPI 3.1
#       (openapi-spec-validator).
#   tests/harness/openapi.sh fuzz [DOCUMENT]
#       Starts target/debug/tollgate serve (built beforehand; embedded store) on a free
#       loopback port, mints an agent and an operator token, and runs Schemathesis
#       against it with the document it serves at /api/openapi.json (or DOCUMENT): every
#       operation, phases examples, coverage,
#       fuzzing and stateful (the links of the document, else the ones
#       tests/harness/schemathesis_hooks.py adds: create run → append → arm → decide →
#       replay), each request authenticated as its operation's `security` says (the
#       hooks: run tokens of runs created for the purpose, the operator or agent JWT).
#       Checks: no 5xx (not_a_server_error) and every answer as documented
#       (response_schema_conformance, status_code_conformance,
#       content_type_conformance). Bounded: OPENAPI_MAX_EXAMPLES cases per operation
#       (default 15), OPENAPI_MAX_TIME seconds for the whole run (default 100), under a
#       hard `timeout`. Prints the operations and test cases, exits non-zero on any
#       failure.
#
# Accepted failures: tests/schemathesis/baseline.json (Schemathesis's baseline) lists
# the failures known and accepted for now — each one a mismatch of the document, not of
# the server — so that they do not fail the run; anything else does. Once one is fixed,
# drop it (`--baseline-prune` does, for the entries a run tested and did not reproduce).
#
# Regressions: a failing run leaves Schemathesis's crash files (one JSON file per
# failing case, the requests that reproduce it, and a manifest); they are copied into
# tests/schemathesis/crashes/. Commit them with the fix: every later `fuzz` first
# replays each kept case (`schemathesis replay --keep`, the same hooks authenticating
# it) against the fresh server, and fails if one still fails.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${TOLLGATE_CACHE:-$REPO/.cache}
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
TOOLS=$CACHE/openapi-tools
REQUIREMENTS=$REPO/tests/harness/openapi-requirements.txt
CRASHES=$REPO/tests/schemathesis/crashes
BASELINE=$REPO/tests/schemathesis/baseline.json

usage() {
  echo "usage: $0 validate|fuzz [DOCUMENT]" >&2
  exit 2
}

install_tools() {
  if cmp -s "$REQUIREMENTS" "$TOOLS/requirements.txt" && [ -x "$TOOLS/bin/schemathesis" ]; then
    return
  fi
  echo "openapi.sh: installing schemathesis and openapi-spec-validator into $TOOLS" >&2
  rm -rf "$TOOLS"
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/pip" install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
  cp "$REQUIREMENTS" "$TOOLS/requirements.txt"
}

document() {
  local doc=${1:-$REPO/openapi.json}
  [ -f "$doc" ] || { echo "openapi.sh: no document at $doc" >&2; exit 1; }
  (cd "$(dirname "$doc")" && echo "$(pwd)/$(basename "$doc")")
}

validate() {
  local doc
  doc=$(document "${1:-}")
  "$TOOLS/bin/python" - "$doc" <<'EOF'
import json, sys
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

path = sys.argv[1]
with open(path) as f:
    spec = json.load(f)
version = str(spec.get("openapi", ""))
if not version.startswith("3.1."):
    sys.exit(f"openapi.sh: {path} says openapi {version!r}, not 3.1.x")
try:
    validate(spec)
except OpenAPIValidationError as e:
    sys.exit(f"openapi.sh: {path} is not valid OpenAPI 3.1: {e}")
operations = sum(
    1
    for item in spec.get("paths", {}).values()
    for method in item
    if method in ("get", "put", "post", "delete", "options", "head", "patch", "trace")
)
print(f"openapi.sh: {path} is valid OpenAPI {version} ({operations} operations)")
EOF
}

fuzz() {
  local doc bin work port pid
  bin=$REPO/target/debug/tollgate
  [ -x "$bin" ] || { echo "openapi.sh: build it first: cargo build -p tollgate" >&2; exit 1; }
  work=$(mktemp -d)
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  # A live stream answers what there is and ends within a second, so that a request
  # to a stream route is not held for a whole window.
  TOLLGATE_SECRET=openapi-fuzz-secret-0123456789abcdef0123 TOLLGATE_SSE_WINDOW_SECONDS=1 \
    "$bin" serve --port "$port" >"$work/serve.log" 2>&1 &
  pid=$!
  # shellcheck disable=SC2064
  trap "kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf '$work'" EXIT
  for _ in $(seq 1 100); do grep -q "^export TOLLGATE_URL=" "$work/serve.log" && break; sleep 0.1; done
  grep -q "^export TOLLGATE_URL=" "$work/serve.log" || { cat "$work/serve.log"; echo "openapi.sh: serve did not start" >&2; exit 1; }
  export TOLLGATE_URL=http://127.0.0.1:$port
  export TOLLGATE_SECRET=openapi-fuzz-secret-0123456789abcdef0123
  AGENT_TOKEN=$("$bin" token --sub openapi-agent --role agent)
  OPERATOR_TOKEN=$("$bin" token --sub openapi-operator --role operator)
  export AGENT_TOKEN OPERATOR_TOKEN
  if [ -n "${1:-}" ]; then doc=$(document "$1"); else doc=$TOLLGATE_URL/api/openapi.json; fi
  export SCHEMATHESIS_HOOKS=schemathesis_hooks
  export PYTHONPATH=$REPO/tests/harness${PYTHONPATH:+:$PYTHONPATH}
  local st=$TOOLS/bin/schemathesis status=0 started=$SECONDS

  # The kept regressions first.
  if compgen -G "$CRASHES/*.json" >/dev/null && [ "$(find "$CRASHES" -name '*.json' ! -name manifest.json | wc -l)" -gt 0 ]; then
    echo "openapi.sh: replaying the kept failing cases in tests/schemathesis/crashes"
    (cd "$work" && timeout 120 "$st" --no-color replay "$CRASHES" --keep --url "$TOLLGATE_URL" \
      --schema-location "$doc") || status=1
  fi

  local max_examples=${OPENAPI_MAX_EXAMPLES:-15} max_time=${OPENAPI_MAX_TIME:-100}
  local accepted=()
  [ ! -f "$BASELINE" ] || accepted=(--baseline "$BASELINE")
  set +e
  (cd "$work" && timeout $((max_time + 60)) "$st" --no-color run "$doc" \
    --url "$TOLLGATE_URL" \
    --phases examples,coverage,fuzzing,stateful \
    --checks not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance \
    --max-examples "$max_examples" \
    --max-time "$max_time" \
    --request-timeout 10 \
    --workers 1 \
    --seed "${OPENAPI_SEED:-4242}" \
    --generation-database none \
    --suppress-health-check all \
    "${accepted[@]}" \
    --report ndjson --report-ndjson-path "$work/events.ndjson") 2>&1 | tee "$work/run.log"
  local run_status=${PIPESTATUS[0]}
  set -e
  [ "$run_status" -eq 0 ] || status=1
  if grep -q 'thread.*panicked\|ERROR' "$work/serve.log"; then
    echo "openapi.sh: the server logged errors:" >&2
    grep 'panicked\|ERROR' "$work/serve.log" | head -20 >&2
    status=1
  fi
  # Keep what failed, for the fix's commit.
  local found
  found=$(find "$work/.schemathesis" -path '*/crashes/*.json' ! -name manifest.json 2>/dev/null || true)
  if [ "$run_status" -ne 0 ] && [ -n "$found" ]; then
    mkdir -p "$CRASHES"
    while IFS= read -r f; do cp "$f" "$CRASHES/"; done <<<"$found"
    local manifest
    manifest=$(find "$work/.schemathesis" -path '*/crashes/manifest.json' | head -1)
    [ -z "$manifest" ] || [ -f "$CRASHES/manifest.json" ] || cp "$manifest" "$CRASHES/"
    echo "openapi.sh: the failing cases are kept in tests/schemathesis/crashes/ (commit them with the fix)" >&2
  fi
  echo "openapi.sh: fuzz took $((SECONDS - started)) s; $( [ $status -eq 0 ] && echo passed || echo FAILED )"
  return $status
}

[ $# -ge 1 ] || usage
command=$1
shift
install_tools
case $command in
  validate) validate "$@" ;;
  fuzz) fuzz "$@" ;;
  *) usage ;;
esac
