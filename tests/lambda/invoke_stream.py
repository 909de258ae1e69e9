"""Invokes a response-streaming function through cargo lambda watch's invoke API and
prints the answer in the shape `cargo lambda invoke` prints for buffered HTTP functions,
plus `"streamed": true`, so the same jq expectations apply.

Watch turns the stream's prelude (status, headers) into the HTTP status and headers of
its own answer and marks it `lambda-runtime-function-response-mode: streaming`.

usage: invoke_stream.py PORT FUNCTION EVENT_FILE
"""
import json
import sys
import urllib.error
import urllib.request

port, function, event_file = sys.argv[1:4]
with open(event_file, "rb") as f:
    event = f.read()
request = urllib.request.Request(
    f"http://127.0.0.1:{port}/2015-03-31/functions/{function}/invocations",
    data=event,
    method="POST",
)
try:
    response = urllib.request.urlopen(request, timeout=900)
except urllib.error.HTTPError as answered:  # a 4xx/5xx from the function itself
    response = answered
body = response.read().decode("utf-8")
headers = {k.lower(): v for k, v in response.headers.items()}
print(
    json.dumps(
        {
            "statusCode": response.status,
            "headers": headers,
            "body": body,
            "isBase64Encoded": False,
            "streamed": headers.get("lambda-runtime-function-response-mode") == "streaming",
        }
    )
)
