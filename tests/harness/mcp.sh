#!/usr/bin/env bash
# The MCP gateway (`tollgate mcp proxy`) from the outside: tests/mcp/, pytest scenarios
# that each drive the proxy with the official Python MCP SDK (stdio client) and decide
# its cards as an operator over HTTP, against real upstreams (mcp-server-git and
# tollgate-mcp-echo), and one smoke test with the official TypeScript SDK (tests/mcp/ts).
# Test dependencies from PyPI, pinned in tests/mcp/requirements.txt, installed into a venv
# under ${TOLLGATE_CACHE:-<repo>/.cache}/mcp-tests (again when the pins change); the
# TypeScript SDK from npm, pinned in tests/mcp/ts/package-lock.json (npm ci, again when
# the lock changes).
#
#   tests/harness/mcp.sh                      # the embedded store; DynamoDB too when an
#                                             # endpoint is set (AWS_ENDPOINT_URL[_DYNAMODB])
#   MCP_TEST_STORES=dynamodb tests/harness/mcp.sh   # only DynamoDB (`make test-integration`)
#
# Binaries: TOLLGATE_BIN (default target/debug/tollgate) and TOLLGATE_MCP_ECHO (default
# target/debug/tollgate-mcp-echo): `cargo build -p tollgate -p tollgate-tests --bin
# tollgate --bin tollgate-mcp-echo`. Each store's pytest run starts its own `tollgate
# serve` (on DynamoDB with its own tables and timer queue, --create-tables) and is bounded
# by MCP_TESTS_TIMEOUT seconds (default 300). In order: ruff check and ruff format --check
# on tests/mcp, then pytest per store. Prints a summary; exits non-zero on any failure.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
SUITE=$REPO/tests/mcp
CACHE=${TOLLGATE_CACHE:-$REPO/.cache}
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
VENV=$CACHE/mcp-tests
REQUIREMENTS=$SUITE/requirements.txt
started=$SECONDS

if ! cmp -s "$REQUIREMENTS" "$VENV/requirements.txt" || [ ! -x "$VENV/bin/pytest" ]; then
  echo "mcp.sh: installing the pinned tools into $VENV" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
  cp "$REQUIREMENTS" "$VENV/requirements.txt"
fi

export TOLLGATE_BIN=${TOLLGATE_BIN:-$REPO/target/debug/tollgate}
export TOLLGATE_MCP_ECHO=${TOLLGATE_MCP_ECHO:-$REPO/target/debug/tollgate-mcp-echo}
[ -x "$TOLLGATE_BIN" ] || { echo "mcp.sh: no tollgate binary at $TOLLGATE_BIN (cargo build -p tollgate, or TOLLGATE_BIN)" >&2; exit 1; }
[ -x "$TOLLGATE_MCP_ECHO" ] || { echo "mcp.sh: no tollgate-mcp-echo at $TOLLGATE_MCP_ECHO (cargo build -p tollgate-tests --bin tollgate-mcp-echo, or TOLLGATE_MCP_ECHO)" >&2; exit 1; }
# The upstream the git scenarios start (the venv's console script of the pinned package).
export MCP_SERVER_GIT=$VENV/bin/mcp-server-git

# The TypeScript SDK's smoke test (tests/mcp/ts): its pinned packages (package-lock.json),
# npm's cache under the cache dir. Needs node (>= 20) and npm.
command -v node >/dev/null && command -v npm >/dev/null ||
  { echo "mcp.sh: node and npm are needed (the TypeScript SDK's smoke test)" >&2; exit 1; }
mkdir -p "$CACHE/npm"
if ! cmp -s "$SUITE/ts/package-lock.json" "$SUITE/ts/node_modules/.package-lock.json.installed"; then
  echo "mcp.sh: npm ci in tests/mcp/ts" >&2
  (cd "$SUITE/ts" && npm_config_cache=$CACHE/npm npm_config_update_notifier=false \
    timeout 180 npm ci --no-audit --no-fund --loglevel=error </dev/null >/dev/null)
  cp "$SUITE/ts/package-lock.json" "$SUITE/ts/node_modules/.package-lock.json.installed"
fi

stores=${MCP_TEST_STORES:-}
if [ -z "$stores" ]; then
  stores=memory
  if [ -n "${AWS_ENDPOINT_URL_DYNAMODB:-}${AWS_ENDPOINT_URL:-}" ]; then stores="memory dynamodb"; fi
fi

work=$(mktemp -d)
# shellcheck disable=SC2064
trap "rm -rf '$work'" EXIT
export RUFF_CACHE_DIR=$work/ruff-cache PYTHONDONTWRITEBYTECODE=1

cd "$SUITE"
echo "mcp.sh: ruff check, ruff format --check"
"$VENV/bin/ruff" check --no-fix .
"$VENV/bin/ruff" format --check .

status=0
summaries=()
for store in $stores; do
  case $store in
    memory) ;;
    dynamodb)
      [ -n "${AWS_ENDPOINT_URL_DYNAMODB:-}${AWS_ENDPOINT_URL:-}" ] ||
        { echo "mcp.sh: the dynamodb store needs AWS_ENDPOINT_URL[_DYNAMODB] (run under tests/harness/emulators.sh with …)" >&2; exit 1; } ;;
    *) echo "mcp.sh: unknown store '$store' in MCP_TEST_STORES (memory, dynamodb)" >&2; exit 2 ;;
  esac
  echo "mcp.sh: pytest on the $store store ($TOLLGATE_BIN, $TOLLGATE_MCP_ECHO)"
  t0=$SECONDS
  set +e
  MCP_TEST_STORE=$store timeout -k 10 "${MCP_TESTS_TIMEOUT:-300}" "$VENV/bin/pytest" -q -p no:cacheprovider \
    --durations=5 . </dev/null 2>&1 | tee "$work/pytest-$store.log"
  rc=${PIPESTATUS[0]}
  set -e
  [ "$rc" -eq 124 ] && echo "mcp.sh: pytest on $store did not finish within ${MCP_TESTS_TIMEOUT:-300} s" >&2
  summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed)|(passed|failed|error).* in [0-9.]+s' "$work/pytest-$store.log" | tail -1)
  summaries+=("$store: ${summary:-no pytest summary} ($((SECONDS - t0)) s)")
  [ "$rc" -eq 0 ] || status=$rc
done

for s in "${summaries[@]}"; do echo "mcp.sh: $s"; done
echo "mcp.sh: $((SECONDS - started)) s in all; $([ "$status" -eq 0 ] && echo passed || echo FAILED)"
exit "$status"
