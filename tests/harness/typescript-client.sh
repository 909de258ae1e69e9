#!/usr/bin/env bash
# The TypeScript client (clients/typescript, @tollgate/client): installs its pinned
# packages (npm ci, the npm cache in ${TOLLGATE_CACHE:-<repo>/.cache}/npm), checks that
# src/openapi.d.ts is what openapi-typescript makes of openapi.json, type-checks it
# (tsc --noEmit, strict), runs its tests with node's test runner against a real
# `tollgate serve` the tests start (TOLLGATE_BIN, else target/debug/tollgate), then
# builds and packs the package from a clean copy of its tracked files into a temporary
# directory, and imports and type-checks the packed package from a fresh install. Needs node (>= 20)
# and npm. Every step is bounded by `timeout`.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${TOLLGATE_CACHE:-$REPO/.cache}
mkdir -p "$CACHE/npm"
CACHE=$(cd "$CACHE" && pwd)
export npm_config_cache=$CACHE/npm npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
PKG=$REPO/clients/typescript
started=$SECONDS

export TOLLGATE_BIN=${TOLLGATE_BIN:-$REPO/target/debug/tollgate}
[ -x "$TOLLGATE_BIN" ] || { echo "typescript-client.sh: no tollgate binary at $TOLLGATE_BIN (cargo build -p tollgate, or set TOLLGATE_BIN)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cd "$PKG"
echo "typescript-client.sh: npm ci" >&2
timeout 180 npm ci --no-audit --no-fund --loglevel=error </dev/null >/dev/null

# The committed types are what the generator makes of the committed document.
timeout 60 ./node_modules/.bin/openapi-typescript "$REPO/openapi.json" -o "$work/openapi.d.ts" </dev/null >/dev/null 2>&1
if ! cmp -s "$work/openapi.d.ts" src/openapi.d.ts; then
  diff -u src/openapi.d.ts "$work/openapi.d.ts" | head -40 >&2 || true
  echo "typescript-client.sh: clients/typescript/src/openapi.d.ts differs from openapi.json's; run: (cd clients/typescript && npm run generate)" >&2
  exit 1
fi
echo "typescript-client.sh: src/openapi.d.ts matches openapi.json"

timeout 120 ./node_modules/.bin/tsc -p tsconfig.json --noEmit
echo "typescript-client.sh: tsc --noEmit (strict) clean"

# dist/ (the examples import the package by its name, which resolves there), then the tests.
rm -rf build dist
timeout 120 npm run --silent build </dev/null
timeout 120 ./node_modules/.bin/tsc -p tsconfig.json
timeout 300 node --test --test-reporter=spec build/test/*.test.js </dev/null

# The package from a clean copy of its tracked (and new, not ignored) files.
mkdir -p "$work/src" "$work/pack" "$work/consumer"
(cd "$REPO" && git ls-files -co --exclude-standard -- clients/typescript) | while IFS= read -r f; do
  [ -f "$REPO/$f" ] || continue
  mkdir -p "$work/src/$(dirname "$f")"
  cp "$REPO/$f" "$work/src/$f"
done
cp "$REPO/openapi.json" "$work/src/openapi.json"
cd "$work/src/clients/typescript"
timeout 180 npm ci --no-audit --no-fund --prefer-offline --loglevel=error </dev/null >/dev/null
timeout 120 npm run --silent build </dev/null
tarball=$(timeout 60 npm pack --silent --pack-destination "$work/pack" </dev/null | tail -1)
tar -tzf "$work/pack/$tarball" | sort > "$work/contents"
for f in package/dist/index.js package/dist/index.d.ts package/dist/openapi.d.ts package/README.md package/package.json; do
  grep -qx "$f" "$work/contents" || { echo "typescript-client.sh: $tarball lacks $f" >&2; cat "$work/contents" >&2; exit 1; }
done
if grep -q "test/\|node_modules/\|\.tsbuildinfo" "$work/contents"; then
  echo "typescript-client.sh: $tarball holds files it should not:" >&2; cat "$work/contents" >&2; exit 1
fi
cd "$work/consumer"
printf '{"name":"consumer","private":true,"type":"module"}\n' > package.json
timeout 180 npm install --no-audit --no-fund --prefer-offline --loglevel=error "$work/pack/$tarball" </dev/null >/dev/null
timeout 30 node --input-type=module -e '
import { Client, OutcomeUnknown, Conflict, argumentsHash } from "@tollgate/client";
const c = new Client("http://127.0.0.1:1", { token: "t" });
if (!(new OutcomeUnknown("x") instanceof Conflict) || typeof c.createRun !== "function" || !argumentsHash({}).startsWith("sha256:")) process.exit(1);
'
# Its published types, as a strict TypeScript consumer uses them.
cat > check.ts <<'TS'
import { Client, OutcomeUnknown, type Decision, type ErrorCode, type Event } from "@tollgate/client";
const client = new Client("http://127.0.0.1:1", { token: "t" });
export async function agent(): Promise<number | undefined> {
  const run = await client.createRun({ owner: "alice", budget: { tools: { web_fetch: 1 }, call_ceiling: 2 } });
  await run.append({ type: "agent.message", text: "hi" });
  const decision: Decision = await run.gate("web_fetch", { url: "https://example.com", timeoutMs: 1000, onEvent: (e: Event) => void e.sequence });
  if (!decision.approved) return undefined;
  try {
    const done = await run.execute(decision, { toolCallId: decision.toolCallId }, async (ex) => {
      await ex.dispatch();
      ex.result({ http_status: 200 });
      return 200;
    });
    return done.value;
  } catch (err) {
    if (err instanceof OutcomeUnknown) {
      const code: ErrorCode | string | undefined = err.code;
      return code === undefined ? -1 : -2;
    }
    throw err;
  }
}
TS
timeout 120 "$PKG/node_modules/.bin/tsc" --noEmit --strict --target es2022 --module nodenext --moduleResolution nodenext \
  --types node --typeRoots "$PKG/node_modules/@types" check.ts
echo "typescript-client.sh: $tarball ($(tar -tzf "$work/pack/$tarball" | wc -l) files) packs, imports and type-checks from a fresh install"
echo "typescript-client.sh: passed in $((SECONDS - started)) s"
