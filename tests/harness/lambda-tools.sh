#!/usr/bin/env bash
# Local AWS Lambda tooling for the Lambda-runtime test tier and `make build`: cargo-lambda
# (the local Lambda Runtime API, `cargo lambda watch` / `invoke`), zig (its cross-linker
# for `cargo lambda build`) and zopfli (`make build` recompresses the zips with it:
# tests/harness/lambda-zip.py, run with the venv's python), all pinned, from PyPI, into
# a venv in the cache dir.
#
#   lambda-tools.sh [install]   install (idempotent; ~0.1 s when already installed) and
#                               print the bin dir to put on PATH
#   lambda-tools.sh env         install, then print `export PATH=<bin dir>:$PATH`
#
# The bin dir ($CACHE/lambda-tools/bin) holds only `cargo-lambda` and `zig` (links into
# the venv), so putting it on PATH does not shadow python3; the venv's python is
# <bin dir>/../venv/bin/python.
# Cache dir: ${TOLLGATE_CACHE:-<repo>/.cache}. Needs python3 (3.11). Interpreter:
# TOLLGATE_PYTHON, else python3.11, else python3.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${TOLLGATE_CACHE:-$REPO/.cache}
CARGO_LAMBDA_VERSION=1.9.2
ZIGLANG_VERSION=0.17.1
ZOPFLI_VERSION=0.4.3
STAMP="cargo-lambda==$CARGO_LAMBDA_VERSION ziglang==$ZIGLANG_VERSION zopfli==$ZOPFLI_VERSION"

log() { printf 'lambda-tools: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

python_bin() {
  local p
  for p in "${TOLLGATE_PYTHON:-}" python3.11 python3; do
    [[ -n $p ]] && command -v "$p" >/dev/null 2>&1 && { command -v "$p"; return 0; }
  done
  die "python3 not found"
}

installed() { # dest
  [[ -f $1/.installed && $(<"$1/.installed") == "$STAMP" &&
     -x $1/bin/cargo-lambda && -x $1/bin/zig ]]
}

install() {
  mkdir -p "$CACHE"
  CACHE=$(cd "$CACHE" && pwd)
  local dest=$CACHE/lambda-tools venv ilog py zig
  venv=$dest/venv
  if installed "$dest"; then
    echo "$dest/bin"
    return 0
  fi
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE/.lambda-tools-install.lock"
    flock -w 900 9 || die "timed out waiting for another install (lock $CACHE/.lambda-tools-install.lock)"
    if installed "$dest"; then echo "$dest/bin"; return 0; fi
  fi
  py=$(python_bin)
  log "installing $STAMP into $dest (PyPI; about a minute)"
  rm -rf "$dest"
  mkdir -p "$dest"
  ilog=$dest/install.log
  if ! timeout -k 10 300 "$py" -m venv "$venv" >"$ilog" 2>&1 ||
     ! PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 timeout -k 10 1200 \
         "$venv/bin/python" -m pip install --no-compile --progress-bar off -q \
         "cargo-lambda==$CARGO_LAMBDA_VERSION" "ziglang==$ZIGLANG_VERSION" \
         "zopfli==$ZOPFLI_VERSION" \
         </dev/null >>"$ilog" 2>&1; then
    tail -n 20 "$ilog" | sed 's/^/  | /' >&2
    mv "$ilog" "$CACHE/lambda-tools-install-failed.log" 2>/dev/null || true
    rm -rf "$dest"
    die "install failed (log: $CACHE/lambda-tools-install-failed.log)"
  fi
  # Relative links, so a moved checkout keeps working.
  zig=$("$venv/bin/python" -c 'import os, sys, ziglang
print(os.path.relpath(os.path.join(os.path.dirname(ziglang.__file__), "zig"), sys.argv[1]))' "$dest/bin")
  mkdir -p "$dest/bin"
  ln -sfn ../venv/bin/cargo-lambda "$dest/bin/cargo-lambda"
  ln -sfn "$zig" "$dest/bin/zig"
  local got
  got=$("$dest/bin/cargo-lambda" lambda --version 2>&1) || die "cargo-lambda does not run: $got"
  [[ $got == "cargo-lambda $CARGO_LAMBDA_VERSION "* ]] || die "unexpected cargo-lambda version: $got"
  got=$("$dest/bin/zig" version 2>&1) || die "zig does not run: $got"
  [[ $got == "$ZIGLANG_VERSION" ]] || die "unexpected zig version: $got"
  "$venv/bin/python" -c 'import zopfli.zopfli' 2>/dev/null || die "zopfli does not import"
  printf '%s\n' "$STAMP" >"$dest/.installed"
  log "installed: cargo-lambda $CARGO_LAMBDA_VERSION, zig $ZIGLANG_VERSION, zopfli $ZOPFLI_VERSION"
  echo "$dest/bin"
}

case ${1:-install} in
  install) install ;;
  env)
    bin=$(install)
    # shellcheck disable=SC2016 # $PATH is for the shell that evals the line
    printf 'export PATH=%q:"$PATH"\n' "$bin"
    ;;
  -h | --help | help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2 ;;
  *) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
