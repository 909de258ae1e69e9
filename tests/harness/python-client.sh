#!/usr/bin/env bash
# The Python client (clients/python) against the server it talks to. Tools and test
# dependencies from PyPI, pinned in clients/python/requirements-dev.txt, installed into a
# venv under ${TOLLGATE_CACHE:-<repo>/.cache}/python-client (again when the pins change).
#
#   tests/harness/python-client.sh
#
# In order: ruff check, ruff format --check, mypy --strict (src, tests, examples); the
# wheel built (hatchling, no network) from a clean copy of the package's files and
# installed into the venv; then pytest, bounded by PYTHON_CLIENT_TIMEOUT seconds (default
# 600), against the installed wheel: the suite starts the tollgate binary (TOLLGATE_BIN,
# else target/debug/tollgate, built beforehand with `cargo build -p tollgate`) on a free
# loopback port with the embedded store, mints its own tokens, and stops it; the
# LangGraph and OpenAI Agents examples run as subprocesses (scripted models, loopback
# only). Prints a short summary; exits non-zero on any failure.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
PKG=$REPO/clients/python
CACHE=${TOLLGATE_CACHE:-$REPO/.cache}
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
VENV=$CACHE/python-client
REQUIREMENTS=$PKG/requirements-dev.txt
started=$SECONDS

if ! cmp -s "$REQUIREMENTS" "$VENV/requirements.txt" || [ ! -x "$VENV/bin/pytest" ]; then
  echo "python-client.sh: installing the pinned tools into $VENV" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
  cp "$REQUIREMENTS" "$VENV/requirements.txt"
fi

export TOLLGATE_BIN=${TOLLGATE_BIN:-$REPO/target/debug/tollgate}
[ -x "$TOLLGATE_BIN" ] || { echo "python-client.sh: no tollgate binary at $TOLLGATE_BIN (cargo build -p tollgate, or TOLLGATE_BIN)" >&2; exit 1; }

work=$(mktemp -d)
# shellcheck disable=SC2064
trap "rm -rf '$work'" EXIT
export RUFF_CACHE_DIR=$work/ruff-cache MYPY_CACHE_DIR=$work/mypy-cache PYTHONDONTWRITEBYTECODE=1

cd "$PKG"
echo "python-client.sh: ruff check"
"$VENV/bin/ruff" check --no-fix .
echo "python-client.sh: ruff format --check"
"$VENV/bin/ruff" format --check .
echo "python-client.sh: mypy --strict"
"$VENV/bin/mypy" --strict

# The wheel from a clean copy: the package's files as git sees them (ignored build
# outputs left out), built without network (hatchling from the venv).
echo "python-client.sh: building the wheel"
mkdir -p "$work/src"
(cd "$PKG" && git ls-files -co --exclude-standard -z . | xargs -0 cp --parents -t "$work/src")
"$VENV/bin/python" -m build --wheel --no-isolation --outdir "$work/dist" "$work/src" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; exit 1; }
wheel=$(ls "$work"/dist/tollgate-*.whl)
"$VENV/bin/python" - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for needed in ("tollgate/__init__.py", "tollgate/py.typed", "tollgate/pod.py", "tollgate/_ws.py",
               "tollgate/adapters/langgraph.py", "tollgate/adapters/openai_agents.py"):
    if needed not in names:
        sys.exit(f"python-client.sh: the wheel lacks {needed}")
meta = [n for n in names if n.endswith("METADATA")]
text = zipfile.ZipFile(sys.argv[1]).read(meta[0]).decode()
deps = [l for l in text.splitlines() if l.startswith("Requires-Dist:") and "extra ==" not in l]
if sorted(d.split()[1].split(">")[0].split("<")[0] for d in deps) != ["anyio", "httpx", "websockets"]:
    sys.exit(f"python-client.sh: the core must need only httpx, anyio and websockets: {deps}")
print(f"python-client.sh: built {sys.argv[1].rsplit('/', 1)[1]} ({len(names)} files)")
PY
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --force-reinstall "$wheel"

echo "python-client.sh: pytest (against the installed wheel and $TOLLGATE_BIN)"
set +e
(cd "$PKG" && timeout "${PYTHON_CLIENT_TIMEOUT:-600}" "$VENV/bin/pytest" -q -p no:cacheprovider \
  --durations=5 tests </dev/null) 2>&1 | tee "$work/pytest.log"
status=${PIPESTATUS[0]}
set -e
summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed)|(passed|failed|error).* in [0-9.]+s' "$work/pytest.log" | tail -1)
echo "python-client.sh: ${summary:-no pytest summary}; $((SECONDS - started)) s in all; $([ "$status" -eq 0 ] && echo passed || echo FAILED)"
exit "$status"
