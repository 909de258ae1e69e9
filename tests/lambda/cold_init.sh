#!/usr/bin/env bash
# Cold init of each HTTP function under cargo-lambda's local Runtime API: the time from
# starting the function process to the answer of its first invocation, which was queued
# before the process started (so it is handed over by the first
# `GET /runtime/invocation/next`). The event is an unknown route (a 404 that touches
# no storage), so the figure is process start + init (config, AWS SDK, table check) +
# one Runtime API round trip; the warm round trip is printed beside it. The init
# includes the one Secrets Manager read of the signing secret (TOLLGATE_SECRET_ARN: a
# secret this script creates in the emulator), as deployed functions do.
#
#   tests/harness/emulators.sh with tests/lambda/cold_init.sh [--debug] [--samples N]
#       [--work N] [--bin-dir DIR]
#
# Three configurations per function:
#   deployed        TOLLGATE_CREATE_TABLES unset (a deployed stack owns its tables)
#   tables-exist    TOLLGATE_CREATE_TABLES=1, tables already there (the test tier)
#   tables-create   TOLLGATE_CREATE_TABLES=1, tables created at start (fresh prefix)
# Builds with --release unless --debug; --bin-dir DIR measures the binaries in DIR
# instead, without building: DIR/<function>/bootstrap (what `cargo lambda build`
# leaves in target/lambda) or DIR/<function>.
# Needs the emulator environment (DynamoDB, Secrets Manager).
# Prints a table; the numbers depend on the machine and its load.
#
# Then the memory size (`MemorySize`) of the hot path: `ingress` creating a run (one
# transaction), WORK invocations warm, with the CPU time the process spent on them
# (every thread's /proc/<pid>/task/*/schedstat, ns) beside the wall time. Lambda gives
# a function CPU in proportion to its memory (1,769 MB = one vCPU, AWS Lambda developer
# guide, "Configuring function memory"), so each size is modelled as the wall time with
# its CPU part stretched by 1769/MB (waiting on DynamoDB does not stretch), and priced
# per million invocations (arm64, $0.0000133334/GB-s, billed per ms).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${TOLLGATE_CACHE:-$REPO/.cache}
PROFILE=release
BIN_DIR=
SAMPLES=5
WORK=200
FUNCTIONS=(ingress approvals replay)
while (($#)); do
  case $1 in
    --debug) PROFILE=debug ;;
    --samples) SAMPLES=$2; shift ;;
    --work) WORK=$2; shift ;;
    --bin-dir) BIN_DIR=$(cd "$2" && pwd); shift ;;
    *) echo "usage: $0 [--debug] [--samples N] [--work N] [--bin-dir DIR]" >&2; exit 2 ;;
  esac
  shift
done

log() { printf 'cold-init: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
[[ -n ${AWS_ENDPOINT_URL_DYNAMODB:-}${AWS_ENDPOINT_URL:-} ]] ||
  die "no DynamoDB endpoint in the environment; run: tests/harness/emulators.sh with $0"
[[ -n ${AWS_ENDPOINT_URL_SECRETS_MANAGER:-}${AWS_ENDPOINT_URL:-} ]] ||
  die "no Secrets Manager endpoint in the environment; run: tests/harness/emulators.sh with $0"

TOOLS=$("$REPO/tests/harness/lambda-tools.sh")
export PATH="$TOOLS:$PATH"

if [[ -z $BIN_DIR ]]; then
  bins=()
  for f in "${FUNCTIONS[@]}"; do bins+=(--bin "$f"); done
  flag=()
  [[ $PROFILE == release ]] && flag=(--release)
  t0=$SECONDS
  (cd "$REPO" && cargo build "${flag[@]}" "${bins[@]}" </dev/null) >&2 ||
    die "cargo build failed"
  log "built ${FUNCTIONS[*]} ($PROFILE) in $((SECONDS - t0))s"
  TARGET_DIR=$(cd "$REPO" && cargo metadata --format-version 1 --no-deps 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
  BIN_DIR=$TARGET_DIR/$PROFILE
fi

while read -r v; do
  [[ $v == TOLLGATE_CACHE ]] || unset "$v"
done < <(compgen -e | grep '^TOLLGATE_' || true)
export AWS_REGION=${AWS_REGION:-us-east-1}

mkdir -p "$CACHE/lambda-test"
WORKDIR=$(mktemp -d "$CACHE/lambda-test/cold-init-XXXXXX")
trap 'rc=$?; ((rc == 0)) && rm -rf "$WORKDIR" || log "logs kept in $WORKDIR"' EXIT

python3 - "$REPO" "$BIN_DIR" "$WORKDIR" "$SAMPLES" "$WORK" "${FUNCTIONS[@]}" <<'PY'
import json, os, signal, socket, statistics, subprocess, sys, threading, time, urllib.request, uuid

repo, bindir, work, samples, work_n, *functions = sys.argv[1:]
samples, work_n = int(samples), int(work_n)
SECRET = "tollgate-lambda-fixtures-secret-not-for-production"

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

port = free_port()
watch_log = open(os.path.join(work, "watch.log"), "w")
watch = subprocess.Popen(
    ["cargo", "lambda", "watch", "--only-lambda-apis", "--color", "never",
     "--invoke-address", "127.0.0.1", "--invoke-port", str(port)],
    cwd=repo, stdin=subprocess.DEVNULL, stdout=watch_log, stderr=subprocess.STDOUT,
    start_new_session=True)

def stop(p):
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(5)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL); p.wait()

try:
    invoke_url = f"http://127.0.0.1:{port}/2015-03-31/functions/_/invocations"
    deadline = time.time() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            break  # listening
        except OSError:
            if time.time() > deadline or watch.poll() is not None:
                sys.exit("cold-init: cargo lambda watch did not start")
            time.sleep(0.1)

    with open(os.path.join(repo, "fixtures/lambda/ingress/09-unknown-route-apigw.json")) as f:
        event = f.read().encode()

    with open(os.path.join(repo, "fixtures/lambda/ingress/01-create-run-apigw.json")) as f:
        create_run = f.read()

    def invoke(result, timeout=60, data=None):
        try:
            req = urllib.request.Request(invoke_url, data=data or event, method="POST")
            with urllib.request.urlopen(req, timeout=timeout) as r:
                result["body"] = json.loads(r.read())
        except Exception as e:  # noqa: BLE001
            result["error"] = repr(e)
        result["t"] = time.perf_counter()

    def create_secret():
        """The signing secret in the emulator's Secrets Manager (a fresh name per run):
        the functions read it at cold start, as deployed."""
        endpoint = (os.environ.get("AWS_ENDPOINT_URL_SECRETS_MANAGER")
                    or os.environ["AWS_ENDPOINT_URL"])
        region = os.environ.get("AWS_REGION", "us-east-1")
        req = urllib.request.Request(
            endpoint.rstrip("/") + "/", method="POST",
            data=json.dumps({"Name": f"tollgate-coldinit-{uuid.uuid4().hex[:12]}",
                             "SecretString": SECRET,
                             "ClientRequestToken": str(uuid.uuid4())}).encode(),
            headers={
                "X-Amz-Target": "secretsmanager.CreateSecret",
                "Content-Type": "application/x-amz-json-1.1",
                # The emulator does not check signatures; it reads the region from here.
                "Authorization": f"AWS4-HMAC-SHA256 Credential=test/20200101/{region}/"
                                 "secretsmanager/aws4_request, SignedHeaders=host, Signature=0",
            })
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.load(r)["ARN"]
        except Exception as e:  # noqa: BLE001
            sys.exit(f"cold-init: CreateSecret at {endpoint} failed: {e!r}")

    base_env = {k: v for k, v in os.environ.items() if not k.startswith("TOLLGATE_")}
    base_env.update({
        "TOLLGATE_SECRET_ARN": create_secret(), "TOLLGATE_BACKEND": "aws", "RUST_LOG": "info",
        "AWS_LAMBDA_RUNTIME_API": f"http://127.0.0.1:{port}/.rt",
        "AWS_LAMBDA_FUNCTION_NAME": "_", "AWS_LAMBDA_FUNCTION_VERSION": "1",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512",
    })
    modes = {
        "deployed": lambda: {"TOLLGATE_TABLE_PREFIX": "tollgate-coldinit-"},
        "tables-exist": lambda: {"TOLLGATE_TABLE_PREFIX": "tollgate-coldinit-",
                                 "TOLLGATE_CREATE_TABLES": "1"},
        "tables-create": lambda: {"TOLLGATE_TABLE_PREFIX": f"tollgate-coldinit-{uuid.uuid4().hex[:8]}-",
                                  "TOLLGATE_CREATE_TABLES": "1"},
    }

    def binary(fn):
        for p in (os.path.join(bindir, fn, "bootstrap"), os.path.join(bindir, fn)):
            if os.path.isfile(p):
                return p
        sys.exit(f"cold-init: no {fn} binary in {bindir}")

    def sample(fn, extra):
        result = {}
        th = threading.Thread(target=invoke, args=(result,))
        th.start()
        time.sleep(0.3)  # the invoke is queued before the function exists
        env = dict(base_env, **extra)
        flog = open(os.path.join(work, f"{fn}.log"), "a")
        t0 = time.perf_counter()
        p = subprocess.Popen([binary(fn)], env=env, stdin=subprocess.DEVNULL,
                             stdout=flog, stderr=subprocess.STDOUT, start_new_session=True)
        th.join()
        cold = result["t"] - t0
        ok = result.get("body", {}).get("statusCode") == 404
        rss = None
        try:
            with open(f"/proc/{p.pid}/status") as f:
                rss = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
        except (OSError, StopIteration):
            pass
        warm = {}
        t1 = time.perf_counter()
        invoke(warm)
        warm_s = warm["t"] - t1
        ok = ok and warm.get("body", {}).get("statusCode") == 404
        stop(p)
        if not ok:
            sys.exit(f"cold-init: {fn}: unexpected answer {result} / {warm}; see {work}")
        return cold, warm_s, rss

    # One throw-away start, so that the tables of tables-exist exist and the binaries
    # are in the page cache (a Lambda cold start reads them from its own disk).
    for fn in functions:
        sample(fn, modes["tables-exist"]())

    print(f"cold init under cargo lambda's Runtime API ({bindir}, "
          f"{samples} samples; median [min-max] ms)")
    print(f"{'function':<9} {'config':<14} {'cold':>20} {'warm invoke':>12} {'max RSS':>8} {'binary':>8}")
    for fn in functions:
        size = os.path.getsize(binary(fn)) / 1e6
        for mode, make_env in modes.items():
            colds, warms, rsss = [], [], []
            for _ in range(samples):
                c, w, r = sample(fn, make_env())
                colds.append(c * 1000); warms.append(w * 1000)
                if r: rsss.append(r)
            cold = f"{statistics.median(colds):.0f} [{min(colds):.0f}-{max(colds):.0f}]"
            print(f"{fn:<9} {mode:<14} {cold:>20} {statistics.median(warms):>10.1f}ms "
                  f"{(max(rsss) if rsss else 0):>6.0f}MB {size:>6.1f}MB", flush=True)

    def cpu_ns(pid):
        """CPU time every thread of `pid` has run, in ns."""
        total = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except OSError:
                pass
        return total

    # The hot path warm: `ingress` creating runs, one after another (the fixture's token
    # lives for decades, as the Lambda tier allows).
    env = dict(base_env, **modes["tables-exist"](),
               TOLLGATE_MAX_TOKEN_LIFETIME_SECONDS="4000000000")
    flog = open(os.path.join(work, "ingress-work.log"), "a")
    p = subprocess.Popen([binary("ingress")], env=env, stdin=subprocess.DEVNULL,
                         stdout=flog, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def create():
            body = create_run.replace("__RUN_ID__", f"run-coldinit-{uuid.uuid4().hex[:16]}")
            r = {}
            invoke(r, data=body.encode())
            if r.get("body", {}).get("statusCode") != 201:
                sys.exit(f"cold-init: ingress create: unexpected answer {r}; see {work}")
        for _ in range(20):  # warm-up: connections, caches
            create()
        c0, t0 = cpu_ns(p.pid), time.perf_counter()
        for _ in range(work_n):
            create()
        wall = (time.perf_counter() - t0) / work_n * 1000
        cpu = (cpu_ns(p.pid) - c0) / work_n / 1e6
        with open(f"/proc/{p.pid}/status") as f:
            rss = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
    finally:
        stop(p)
    print(f"\nwarm ingress create run ({work_n} invocations): {wall:.2f} ms wall each here, "
          f"{cpu:.2f} ms of it CPU (the function process's threads), max RSS {rss:.0f} MB")
    print("memory size, modelled: CPU part × 1769/MB (Lambda's CPU share), the rest as here")
    print(f"{'MemorySize':>10} {'vCPU':>6} {'duration':>10} {'$/million (arm64)':>18}")
    for mb in (128, 256, 512, 1024):
        share = min(1.0, mb / 1769)
        dur = (wall - cpu) + cpu / share
        usd = mb / 1024 * (int(dur) + 1) / 1000 * 0.0000133334 * 1e6
        print(f"{mb:>8}MB {share:>6.3f} {dur:>8.1f}ms {usd:>18.2f}")
finally:
    stop(watch)
PY
