#!/usr/bin/env bash
# Lints infra/template.yaml with cfn-lint (pinned, installed into .cache/cfn-lint).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${TOLLGATE_CACHE:-$root/.cache}/cfn-lint"
version=1.58.0
if [ ! -x "$venv/bin/cfn-lint" ] || [ "$(cat "$venv/.version" 2>/dev/null)" != "$version" ]; then
  echo "cfn-lint: installing $version into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "cfn-lint==$version"
  echo "$version" > "$venv/.version"
fi
"$venv/bin/cfn-lint" "$root/infra/template.yaml"
echo "cfn-lint: infra/template.yaml is clean"
