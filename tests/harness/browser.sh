#!/usr/bin/env bash
# Makes sure the browser tests (tests/browser.rs) find headless Chromium and its
# WebDriver: Debian's `chromium` and `chromium-driver` (/usr/bin/chromium,
# /usr/bin/chromedriver). Installs them with apt-get when they are missing and this runs
# as root; otherwise says what to install and fails. Prints the versions it found.
set -euo pipefail

CHROMIUM=${TOLLGATE_CHROMIUM:-chromium}
CHROMEDRIVER=${TOLLGATE_CHROMEDRIVER:-chromedriver}

have() { command -v "$1" >/dev/null 2>&1; }

if ! have "$CHROMIUM" || ! have "$CHROMEDRIVER"; then
  if [ "$(id -u)" -eq 0 ] && have apt-get; then
    echo "browser.sh: installing chromium and chromium-driver (Debian packages)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
  else
    cat >&2 <<MSG
browser.sh: the browser tests need headless Chromium and ChromeDriver, and they are not installed:
  $(have "$CHROMIUM" && echo "found" || echo "missing") $CHROMIUM
  $(have "$CHROMEDRIVER" && echo "found" || echo "missing") $CHROMEDRIVER
Install them as root (Debian/Ubuntu):   apt-get install -y chromium chromium-driver
or point TOLLGATE_CHROMIUM / TOLLGATE_CHROMEDRIVER at existing binaries.
MSG
    exit 1
  fi
fi

for tool in "$CHROMIUM" "$CHROMEDRIVER"; do
  if ! have "$tool"; then
    echo "browser.sh: $tool is still missing after the install" >&2
    exit 1
  fi
done
echo "browser.sh: $("$CHROMIUM" --version 2>/dev/null | head -n1); $("$CHROMEDRIVER" --version 2>/dev/null | head -n1)"
