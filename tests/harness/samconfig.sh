#!/usr/bin/env bash
# Reads one saved answer of `sam deploy --guided` from its samconfig.toml (the `default`
# environment's deploy parameters):
#
#   samconfig.sh stack_name|region|s3_prefix|... FILE   a deploy parameter
#   samconfig.sh PARAMETER FILE                        a template parameter, from
#                                                      parameter_overrides (e.g. Architecture)
#
# Prints nothing (exit 0) when the file or the value is missing. Needs python3 (3.11).
set -euo pipefail
[[ $# == 2 ]] || { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2; exit 2; }
[[ -f $2 ]] || exit 0
exec python3 - "$1" "$2" <<'PY'
import re, shlex, sys, tomllib

key, path = sys.argv[1], sys.argv[2]

# Values the Makefile puts into shell commands must be what they claim to be.
CHECKS = {
    "stack_name": (re.compile(r"[A-Za-z][A-Za-z0-9-]{0,127}"), "a CloudFormation stack name"),
    "region": (re.compile(r"[a-z]{2}(-[a-z]+)+-\d"), "an AWS region"),
    "Architecture": (re.compile(r"arm64|x86_64"), "arm64 or x86_64"),
}


def checked(value):
    rule = CHECKS.get(key)
    if rule and not rule[0].fullmatch(value):
        sys.exit(f"samconfig.sh: {path}: {key} {value!r} is not {rule[1]}")
    return value

with open(path, "rb") as f:
    doc = tomllib.load(f)
env = doc.get("default", {})
params = {**env.get("global", {}).get("parameters", {}), **env.get("deploy", {}).get("parameters", {})}
if key in params:
    value = params[key]
    print(checked(" ".join(value) if isinstance(value, list) else str(value)))
    sys.exit(0)
overrides = params.get("parameter_overrides", "")
items = overrides if isinstance(overrides, list) else shlex.split(overrides)
for item in items:
    name, _, value = item.partition("=")
    if name == key:
        print(checked(value))
PY
