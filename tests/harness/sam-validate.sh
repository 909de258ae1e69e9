#!/usr/bin/env bash
# `sam validate --lint` of infra/template.yaml with the pinned SAM CLI (installed into
# .cache/sam by sam-cli.sh), then tests/harness/sam-transformed-check.py on the template
# as the SAM translator turns it into CloudFormation. Offline: no AWS account or
# credentials (a region is given; nothing is sent).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
sam=$(TOLLGATE_SAM_PINNED=1 "$root/tests/harness/sam-cli.sh")
export SAM_CLI_TELEMETRY=0
"$sam" validate --lint --template-file "$root/infra/template.yaml" --region us-east-1 </dev/null
"$(dirname "$sam")/python" "$root/tests/harness/sam-transformed-check.py" "$root/infra/template.yaml"
