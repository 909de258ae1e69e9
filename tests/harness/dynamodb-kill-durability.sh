#!/bin/bash
# Does DynamoDB Local (-dbPath) keep every transaction it acknowledged across a SIGKILL?
# Eight writers log each acknowledged TransactWriteItems (two items each); after SECONDS
# (default 3) DynamoDB Local is killed with SIGKILL and started again on the same
# database; the acknowledged transactions missing from it are printed. Measured: now and
# then one acknowledged in the last moments before the kill is gone, whole. The chaos
# checker (tests/src/chaos/checker.rs, KILL_WINDOW_MS) reports such losses apart.
#
#   tests/harness/dynamodb-kill-durability.sh [SECONDS]     (DynamoDB Local installed in
#                                                           ${TOLLGATE_CACHE:-.cache})
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${TOLLGATE_CACHE:-$HERE/../../.cache}
JAR=$(dirname "$(ls "$CACHE"/dynamodb-local/lib/dynamodb_local_*/DynamoDBLocal.jar)")
DB=$(mktemp -d); PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
ACK=$(mktemp)
start() { (cd $JAR && exec java -Djava.library.path=./DynamoDBLocal_lib -jar DynamoDBLocal.jar -sharedDb -disableTelemetry -port $PORT -dbPath $DB >/dev/null 2>&1) & PID=$!; for i in $(seq 100); do c ListTables '{}' >/dev/null 2>&1 && return; sleep 0.2; done; }
c() { curl -s -m 5 -X POST http://127.0.0.1:$PORT/ -H "X-Amz-Target: DynamoDB_20120810.$1" -H "Content-Type: application/x-amz-json-1.0" -H "Authorization: AWS4-HMAC-SHA256 Credential=test/20200101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0" -d "$2"; }
start
c CreateTable '{"TableName":"ttt","AttributeDefinitions":[{"AttributeName":"k","AttributeType":"S"}],"KeySchema":[{"AttributeName":"k","KeyType":"HASH"}],"BillingMode":"PAY_PER_REQUEST"}' >/dev/null
writer() { for i in $(seq 1 2000); do out=$(c TransactWriteItems "{\"TransactItems\":[{\"Put\":{\"TableName\":\"ttt\",\"Item\":{\"k\":{\"S\":\"w$1-t$i-a\"}}}},{\"Put\":{\"TableName\":\"ttt\",\"Item\":{\"k\":{\"S\":\"w$1-t$i-b\"}}}}]}"); if [ "$out" = "{}" ]; then echo "w$1-t$i" >> $ACK; else break; fi; done; }
for w in 1 2 3 4 5 6 7 8; do writer $w & done
sleep ${1:-3}; kill -9 $PID; wait
start
c Scan '{"TableName":"ttt","ProjectionExpression":"k"}' > /tmp/scan2.json
python3 - "$ACK" <<'PY'
import json,sys
d=json.load(open("/tmp/scan2.json"))
have=set(i["k"]["S"] for i in d["Items"])
acked=[l.strip() for l in open(sys.argv[1]) if l.strip()]
lost=[a for a in acked if a+"-a" not in have or a+"-b" not in have]
print("acked",len(acked),"items",len(have),"acked but lost",lost, "more pages", "LastEvaluatedKey" in d)
PY
kill -9 $PID; rm -rf $DB $ACK
