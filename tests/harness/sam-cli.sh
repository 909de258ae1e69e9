#!/usr/bin/env bash
# The AWS SAM CLI for `make deploy` and `make test`: the `sam` on PATH when it is at least
# the minimum version, else a pinned copy from PyPI in a venv in the cache dir.
#
#   sam-cli.sh [bin]     print the path of a `sam` to use (installs the pinned copy if
#                        PATH has none, or one older than the minimum)
#   sam-cli.sh install   install the pinned copy (idempotent) and print its path
#   sam-cli.sh version   print the minimum and the pinned version
#
# Cache dir: ${TOLLGATE_CACHE:-<repo>/.cache} (the copy goes to $CACHE/sam). Needs python3
# (3.9 or newer). TOLLGATE_SAM_PINNED=1 skips PATH's `sam` (what `make test` does, so its
# checks run on the version the project pins).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${TOLLGATE_CACHE:-$REPO/.cache}
# The version `make test` checks the template with and `make deploy` installs.
SAM_VERSION=1.170.0
# The oldest SAM CLI `make deploy` accepts from PATH: the pinned one, the only version
# these steps are tested with.
SAM_MIN_VERSION=1.170.0

log() { printf 'sam-cli: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# `sam --version` prints "SAM CLI, version 1.170.0".
version_of() { "$1" --version 2>/dev/null | sed -n 's/.*version \([0-9][0-9.]*\).*/\1/p' | head -n1; }

at_least() { # have want
  [[ -n $1 ]] && [[ $(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1) == "$2" ]]
}

install() {
  mkdir -p "$CACHE"
  CACHE=$(cd "$CACHE" && pwd)
  local dest=$CACHE/sam ilog
  if [[ -x $dest/venv/bin/sam && $(cat "$dest/.installed" 2>/dev/null) == "$SAM_VERSION" ]]; then
    echo "$dest/venv/bin/sam"
    return 0
  fi
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE/.sam-install.lock"
    flock -w 900 9 || die "timed out waiting for another install (lock $CACHE/.sam-install.lock)"
    if [[ -x $dest/venv/bin/sam && $(cat "$dest/.installed" 2>/dev/null) == "$SAM_VERSION" ]]; then
      echo "$dest/venv/bin/sam"
      return 0
    fi
  fi
  command -v python3 >/dev/null 2>&1 || die "python3 not found"
  log "installing aws-sam-cli $SAM_VERSION into $dest (PyPI; about a minute)"
  rm -rf "$dest"
  mkdir -p "$dest"
  ilog=$dest/install.log
  if ! timeout -k 10 300 python3 -m venv "$dest/venv" >"$ilog" 2>&1 ||
     ! PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 timeout -k 10 1200 \
         "$dest/venv/bin/python" -m pip install --no-compile --progress-bar off -q \
         "aws-sam-cli==$SAM_VERSION" </dev/null >>"$ilog" 2>&1; then
    tail -n 20 "$ilog" | sed 's/^/  | /' >&2
    mv "$ilog" "$CACHE/sam-install-failed.log" 2>/dev/null || true
    rm -rf "$dest"
    die "install failed (log: $CACHE/sam-install-failed.log)"
  fi
  local got
  got=$(version_of "$dest/venv/bin/sam")
  [[ $got == "$SAM_VERSION" ]] || die "unexpected SAM CLI version: '$got'"
  printf '%s\n' "$SAM_VERSION" >"$dest/.installed"
  log "installed: SAM CLI $SAM_VERSION"
  echo "$dest/venv/bin/sam"
}

pick() {
  local path_sam have
  if [[ ${TOLLGATE_SAM_PINNED:-} != 1 ]] && path_sam=$(command -v sam 2>/dev/null); then
    have=$(version_of "$path_sam")
    if at_least "$have" "$SAM_MIN_VERSION"; then
      echo "$path_sam"
      return 0
    fi
    log "$path_sam is SAM CLI ${have:-of unknown version}; Tollgate needs $SAM_MIN_VERSION or newer: using its own copy"
  fi
  install
}

case ${1:-bin} in
  bin) pick ;;
  install) install ;;
  version) printf 'minimum %s, pinned %s\n' "$SAM_MIN_VERSION" "$SAM_VERSION" ;;
  *) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
