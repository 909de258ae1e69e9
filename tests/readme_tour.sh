#!/usr/bin/env bash
# Runs the README's five-minute tour verbatim against a fresh `tollgate serve` and checks
# what it printed. Usage: tests/readme_tour.sh [path/to/tollgate]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-./target/debug/tollgate}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export TOLLGATE_SECRET=readme-tour-secret-0123456789abcdef0123
log=$(mktemp); out=$(mktemp)
"$bin" serve --port "$port" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -f "$log" "$out"' EXIT
for _ in $(seq 1 100); do grep -q "^export TOLLGATE_URL=" "$log" && break; sleep 0.1; done
eval "$(grep '^export ' "$log")"
# serve prints no tokens for a secret it was given: mint them as the README says.
AGENT_TOKEN=$("$bin" token --sub local-agent --role agent)
OPERATOR_TOKEN=$("$bin" token --sub local-operator --role operator)
export AGENT_TOKEN OPERATOR_TOKEN
tour=$(sed -n '/<!-- tour:start -->/,/<!-- tour:end -->/p' README.md | sed '1,2d;$d' | sed '$d')
bash -euo pipefail -c "$tour" >"$out" 2>&1 || { cat "$out"; echo "readme tour: the tour failed"; exit 1; }
check() { grep -q -- "$1" "$out" || { cat "$out"; echo "readme tour: expected $1"; exit 1; }; }
check '"sequences":\[2,3\]'
check '"sequences":\[3\]'
check '"display_id":"5f0c7a2e"'
check '"approved":true,"resolved":true,"state":"approved","expired":false'
check '"tool.approval_resolved"'
check '"state":"intent","sequence":6'
check '"state":"dispatched"'
check '"state":"completed"'
check '\[{"tool_name":"web_fetch","state":"completed","execution_status":"executed"}\]'
check '"tool_execution_started"'
check '"tool_execution"'
check '"state":"run_terminal"'
check '"terminal": true'
check '"run_completed"'
echo "readme tour: every step answered as the README says"
