#!/usr/bin/env bash
# The operator console's own checks: ESLint (pinned, installed from the npm registry
# into the cache with its lock file) over shared/api/assets/console/, then its unit
# tests with node's test runner. Needs node and npm. Cache dir: ${TOLLGATE_CACHE:-<repo>/.cache}.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${TOLLGATE_CACHE:-$REPO/.cache}
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
TOOLS=$CACHE/console-lint
SPEC=$REPO/tests/harness/console-lint

# (Re)installed when the pinned versions change.
if ! cmp -s "$SPEC/package-lock.json" "$TOOLS/package-lock.json" || [ ! -x "$TOOLS/node_modules/.bin/eslint" ]; then
  echo "console.sh: installing ESLint into $TOOLS" >&2
  rm -rf "$TOOLS"
  mkdir -p "$TOOLS"
  cp "$SPEC/package.json" "$SPEC/package-lock.json" "$TOOLS/"
  (cd "$TOOLS" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null)
fi

cd "$REPO/shared/api/assets/console"
NODE_PATH="$TOOLS/node_modules" "$TOOLS/node_modules/.bin/eslint" --max-warnings 0 \
  --config eslint.config.js console.js console.test.js eslint.config.js
echo "console.sh: eslint clean"
node --test .
