"""An SSE client dropped at random points while events are appended, through the
streaming Lambda under `cargo lambda watch` (issue 9: every sequence exactly once, in
order, whatever the drops).

Two things at once, both through watch's invoke API on loopback (the way
invoke_stream.py reaches a streaming function, and `cargo lambda invoke` a buffered one):

- the appender (a thread) sends EVENTS events to the `ingress` function in batches of
  BATCH, an API Gateway event each (APPEND_EVENT with its body replaced), checking each
  answer's sequences, then completes the run (COMPLETE_EVENT): the run ends at sequence
  EVENTS + 2 (run_started is 1, run_completed the last);
- the client streams `replay-stream` with STREAM_EVENT, a Function URL event carrying
  `accept: text/event-stream` (no `last-event-id` on the first connection, then the last
  id it received), reads the streamed body as it arrives, frame by frame, and closes the
  connection right after its k-th event frame for DROPS random k (mid-response: whatever
  the function was still sending is lost); after a response the server ended it waits the
  `retry:` hint, as an EventSource does, and resumes; it stops at `event: done`.

Asserted: every response is 200 `text/event-stream` in watch's streaming mode and starts
with `retry:`; every event frame's id is the last one + 1 and its data is the event
(`sequence` = id, `type` = the frame's event, this run's `run_id`); the ids received are
exactly 1..=EVENTS+2; `done` comes after the last one, names the run and its terminal
sequence, and ends the response; DROPS drops happened; everything within DEADLINE
seconds. Prints one summary line on stdout; on failure the reason on stderr, exit 1.

usage: sse_drops.py PORT RUN_ID APPEND_EVENT COMPLETE_EVENT STREAM_EVENT
       [--events N] [--batch N] [--pace S] [--drops N] [--deadline S] [--seed N] [--log]
(--seed replays a run's drop points; --log: one line per response on stderr)
"""
import argparse
import copy
import http.client
import json
import random
import sys
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("port", type=int)
parser.add_argument("run_id")
parser.add_argument("append_event")
parser.add_argument("complete_event")
parser.add_argument("stream_event")
parser.add_argument("--events", type=int, default=1000)
parser.add_argument("--batch", type=int, default=25)
parser.add_argument("--pace", type=float, default=0.1, help="seconds between batches")
parser.add_argument("--drops", type=int, default=20)
parser.add_argument("--deadline", type=float, default=60.0)
parser.add_argument("--seed", type=int, default=None)
parser.add_argument("--log", action="store_true", help="one line per response on stderr")
args = parser.parse_args()

SEED = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
LAST = args.events + 2  # run_started, the events, run_completed
START = time.monotonic()
DEADLINE = START + args.deadline
READ_TIMEOUT = 30  # one socket read; the first invoke may start the function


class Failed(Exception):
    pass


def left():
    remaining = DEADLINE - time.monotonic()
    if remaining <= 0:
        raise Failed(f"not done within {args.deadline:.0f} s")
    return remaining


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def post_invoke(function, event):
    """One invocation through watch's invoke API; returns the open response."""
    conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=min(READ_TIMEOUT, left()))
    conn.request(
        "POST",
        f"/2015-03-31/functions/{function}/invocations",
        body=json.dumps(event).encode(),
        headers={"content-type": "application/json"},
    )
    return conn, conn.getresponse()


def with_body(event, body):
    event = copy.deepcopy(event)
    event["body"] = json.dumps(body, separators=(",", ":"))
    event["headers"]["content-length"] = str(len(event["body"].encode()))
    return event


# ------------------------------------------------------------------ the appender

appender_error = []
appended = {"batches": 0, "done_at": None}


def invoke_ingress(event, what):
    conn, resp = post_invoke("ingress", event)
    try:
        payload = resp.read()
    finally:
        conn.close()
    try:
        answer = json.loads(payload)
        body = json.loads(answer["body"])
    except (ValueError, KeyError, TypeError):
        raise Failed(f"{what}: ingress answered {resp.status} {payload[:300]!r}")
    if answer.get("statusCode") != 200:
        raise Failed(f"{what}: status {answer.get('statusCode')}: {body}")
    return body


def append_all():
    try:
        template, complete = load(args.append_event), load(args.complete_event)
        n = 0
        while n < args.events:
            k = min(args.batch, args.events - n)
            events = [{"type": "agent.message", "n": n + i, "text": "through the drops"}
                      for i in range(k)]
            body = invoke_ingress(with_body(template, {"events": events}),
                                  f"append batch {appended['batches'] + 1}")
            want = list(range(n + 2, n + 2 + k))
            if body.get("sequences") != want:
                raise Failed(f"append batch {appended['batches'] + 1}: sequences "
                             f"{body.get('sequences')}, expected {want[0]}..{want[-1]}")
            n += k
            appended["batches"] += 1
            time.sleep(min(args.pace, left()))
        invoke_ingress(complete, "complete")
        appended["done_at"] = time.monotonic() - START
    except Exception as e:  # noqa: BLE001 - reported by the main thread
        appender_error.append(e)


# ------------------------------------------------------------------ the client


def parse_frame(text):
    frame = {"comment": False}
    for line in text.split("\n"):
        if line.startswith(":"):
            frame["comment"] = True
            continue
        field, sep, value = line.partition(": ")
        if not sep or field not in ("id", "event", "data", "retry") or field in frame:
            raise Failed(f"unexpected SSE line {line!r} in frame {text!r}")
        frame[field] = value
    return frame


class Stats:
    responses = 0
    ended_by_server = 0
    drops = 0
    keepalives = 0
    opened = []  # seconds from each invoke to its streamed prelude


def stream():
    template = load(args.stream_event)
    rng = random.Random(SEED)
    drop_after = set(rng.sample(range(1, LAST), args.drops))  # k-th event frame received
    seen = []
    retry_ms = None
    while True:
        left()
        event = copy.deepcopy(template)
        headers = event["headers"]
        if seen:
            headers["last-event-id"] = str(seen[-1])
        else:
            headers.pop("last-event-id", None)  # a fresh EventSource sends none
        t_open = time.monotonic()
        conn, resp = post_invoke("replay-stream", event)
        Stats.responses += 1
        n = Stats.responses
        t_headers, events_before, dropped = time.monotonic(), len(seen), False
        Stats.opened.append(t_headers - t_open)
        try:
            mode = resp.getheader("lambda-runtime-function-response-mode")
            ctype = resp.getheader("content-type") or ""
            if resp.status != 200 or mode != "streaming" or not ctype.startswith("text/event-stream"):
                raise Failed(f"response {n}: status {resp.status}, mode {mode!r}, content-type "
                             f"{ctype!r}: {resp.read(500)!r}")
            buf, first = b"", True
            while not dropped:
                chunk = resp.read1(65536)
                if not chunk:
                    if buf.strip():
                        raise Failed(f"response {n}: ended inside a frame: {buf[:200]!r}")
                    Stats.ended_by_server += 1
                    break
                buf += chunk
                while b"\n\n" in buf and not dropped:
                    raw, buf = buf.split(b"\n\n", 1)
                    frame = parse_frame(raw.decode("utf-8"))
                    if first:
                        if "retry" not in frame:
                            raise Failed(f"response {n}: first frame is not retry: {frame}")
                        retry_ms = int(frame["retry"])
                        first = False
                        continue
                    if frame["comment"]:
                        Stats.keepalives += 1
                        continue
                    if frame.get("event") == "done":
                        if "id" in frame:
                            raise Failed(f"done carries an id: {frame}")
                        done = json.loads(frame["data"])
                        if done != {"run_id": args.run_id, "terminal_sequence": LAST}:
                            raise Failed(f"done frame {done}, expected terminal_sequence {LAST}")
                        if seen != list(range(1, LAST + 1)):
                            raise Failed(f"done after {len(seen)} events (last "
                                         f"{seen[-1] if seen else None}), expected 1..={LAST}")
                        # done ends the response
                        rest = buf + resp.read()
                        if rest.strip():
                            raise Failed(f"frames after done: {rest[:200]!r}")
                        return seen, retry_ms
                    if "id" not in frame or "data" not in frame or "event" not in frame:
                        raise Failed(f"response {n}: incomplete event frame {frame}")
                    seq = int(frame["id"])
                    expected = seen[-1] + 1 if seen else 1
                    if seq != expected:
                        raise Failed(f"response {n}: id {seq} after {seen[-1] if seen else 'nothing'}"
                                     f" (duplicate or gap)")
                    data = json.loads(frame["data"])
                    if (data.get("sequence") != seq or data.get("type") != frame["event"]
                            or data.get("run_id") != args.run_id):
                        raise Failed(f"frame {seq}: data {frame['data'][:200]} does not match "
                                     f"id/event/run")
                    seen.append(seq)
                    if len(seen) in drop_after:
                        Stats.drops += 1
                        dropped = True
        finally:
            if args.log:
                print(f"response {n}: at {t_open - START:.2f} s, prelude after "
                      f"{t_headers - t_open:.3f} s, {len(seen) - events_before} events, "
                      f"{'dropped' if dropped else 'ended'} after "
                      f"{time.monotonic() - t_open:.3f} s", file=sys.stderr)
            # After a drop: the connection goes mid-response, whatever was coming is lost.
            resp.close()
            conn.close()
        if not dropped:
            time.sleep(min((retry_ms or 1000) / 1000, left()))
        else:
            time.sleep(min(rng.uniform(0, 0.05), left()))


def main():
    writer = threading.Thread(target=append_all, daemon=True)
    writer.start()
    try:
        seen, retry_ms = stream()
        writer.join(timeout=left())
        if writer.is_alive():
            raise Failed("the appender did not finish")
        if appender_error:
            raise appender_error[0]
        if Stats.drops != args.drops:
            raise Failed(f"{Stats.drops} drops happened, expected {args.drops}")
    except Exception as e:  # noqa: BLE001 - timeouts, refused connections, bad JSON too
        why = appender_error[0] if appender_error else e
        if not isinstance(why, Failed):
            why = f"{type(why).__name__}: {why}"
        print(f"sse-drops: FAILED after {time.monotonic() - START:.1f} s "
              f"({Stats.responses} responses, {Stats.drops} drops; seed {SEED}): {why}",
              file=sys.stderr)
        sys.exit(1)
    opened = sorted(Stats.opened)
    print(f"sse-drops: sequences 1..={LAST} each exactly once, in order, then done; "
          f"{Stats.drops} drops by the client, {Stats.responses} streamed responses "
          f"({Stats.ended_by_server} ended by the function, retry {retry_ms} ms; prelude after "
          f"median {1000 * opened[len(opened) // 2]:.0f} ms, max {1000 * opened[-1]:.0f} ms), "
          f"{Stats.keepalives} keep-alives; "
          f"{args.events} events appended in {appended['batches']} ingress batches + complete "
          f"by {appended['done_at']:.1f} s; {time.monotonic() - START:.1f} s (seed {SEED})")


main()
