# Tollgate — the two commands are `make run` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help
ARCH ?= arm64
PORT ?= 8080
EMULATORS := tests/harness/emulators.sh
# Tests that need DynamoDB (and run only where an endpoint is configured).
AWS_TESTS := binary(contract_dynamo) | binary(timers_sqs) | test(/^dynamo(::|_only_)/)

# Every Lambda function binary (one crate each under functions/): the registry's names
# (shared/api/src/functions.rs); tests/template.rs holds this list to it.
FUNCTIONS := ingress approvals settlement timers stall-watch replay replay-stream operator-stream websocket fanout notifier
CARGO_LAMBDA_ARCH = $(if $(filter arm64,$(ARCH)),--arm64,$(if $(filter x86_64,$(ARCH)),--x86-64,$(error ARCH must be arm64 or x86_64)))
# What `make build` writes and infra/template.yaml deploys: LAMBDA_DIR/<function>/bootstrap.zip,
# built with the Cargo profile LAMBDA_PROFILE (tests/template.rs holds the template's
# CodeUri paths and the profile's `panic = "unwind"` to these lines).
LAMBDA_DIR := target/lambda
LAMBDA_PROFILE := lambda
# The largest zip `make build` accepts, in bytes: 4 MB. Each HTTP function links only its
# own routes (its main names its registry constant). Measured when it was set (bytes):
# arm64 approvals 3,797,371, ingress 3,592,275, settlement 3,558,698, replay* 3,542,621,
# timers 3,241,472, stall-watch 3,220,818; x86_64 approvals 3,908,368, ingress 3,681,215,
# settlement 3,649,042, replay* 3,636,031, timers 3,330,024, stall-watch 3,303,872.
ZIP_LIMIT := 4000000
# `sam deploy --guided` saves its answers next to the template; later deploys use them.
SAMCONFIG := infra/samconfig.toml
SAM := tests/harness/sam-cli.sh
# The stack `make tokens` / `make destroy` act on: STACK=…, else the saved deploy's.
STACK ?= $(shell tests/harness/samconfig.sh stack_name $(SAMCONFIG) 2>/dev/null)

.PHONY: openapi help run test test-unit test-integration test-lambda cold-init lint lint-template emulators-up emulators-down bench build deploy tokens destroy chaos chaos-short fuzz

help:
	@echo "make run         build and start tollgate serve on 127.0.0.1:$(PORT) (embedded store)"
	@echo "make test        everything: unit, store contract on both adapters, integration on emulators"
	@echo "make test-unit   unit + contract + HTTP tests on the embedded store only (no emulators)"
	@echo "make test-lambda each function under cargo lambda watch, invoked with API Gateway v2 / Function URL fixtures"
	@echo "make cold-init   cold init per function under the local Runtime API, and warm CPU per request modelled per MemorySize (release build)"
	@echo "make lint        rustfmt check + clippy -D warnings"
	@echo "make bench       append/replay benchmarks on the embedded store and DynamoDB Local; the MCP gateway's cost per call"
	@echo "make chaos       randomized workload over serve processes under injected faults and crashes, then the history checker (at most 10 min)"
	@echo "make fuzz        the parsers under proptest (many more cases than make test runs), then cargo-fuzz targets (FUZZ_SECONDS each)"
	@echo "make build       release bootstrap zips per function (ARCH=arm64|x86_64), each at most $(ZIP_LIMIT) bytes"
	@echo "make deploy      make build, then sam deploy of those zips (--guided the first time; GUIDED=1 asks again)"
	@echo "make tokens      export lines for the deployed stack: URLs, an agent and an operator token (STACK=name)"
	@echo "make destroy     delete the stack; its tables and signing secret are kept (STACK=name)"
	@echo "make emulators-up / emulators-down   start/stop DynamoDB Local + LocalStack (SQS) by hand"

run:
	cargo build -p tollgate
	./target/debug/tollgate serve --port $(PORT)

test: lint
	tests/harness/console.sh
	tests/harness/cfn-lint.sh
	tests/harness/sam-validate.sh
	cargo build -p tollgate
	tests/readme_tour.sh
	tests/harness/openapi.sh validate
	tests/harness/openapi.sh fuzz
	tests/harness/python-client.sh
	cargo build -p tollgate-tests --bin tollgate-mcp-echo
	MCP_TEST_STORES=memory tests/harness/mcp.sh
	tests/harness/typescript-client.sh
	$(EMULATORS) with $(MAKE) --no-print-directory test-integration

# Runs every test; the AWS-backed ones use whatever AWS_ENDPOINT_URL* is set. Then the
# Lambda-runtime tier: each function under `cargo lambda watch`, invoked with fixtures.
# The MCP gateway's suite runs here on DynamoDB only (`make test` ran it on the embedded
# store before the emulators were up).
test-integration:
	cargo build -p tollgate
	cargo build -p tollgate-tests --bin tollgate-mcp-echo
	tests/harness/browser.sh
	MCP_TEST_STORES=dynamodb tests/harness/mcp.sh
	cargo nextest run --workspace --no-fail-fast
	tests/lambda/run.sh
	$(MAKE) --no-print-directory chaos-short

# Only the Lambda-runtime tier (starts its own emulators).
test-lambda:
	$(EMULATORS) with tests/lambda/run.sh

# Cold init of each function under the local Runtime API (release build).
cold-init:
	$(EMULATORS) with tests/lambda/cold_init.sh

test-unit:
	cargo build -p tollgate
	cargo nextest run --workspace --no-fail-fast -E 'not ($(AWS_TESTS))'

# The HTTP contract's OpenAPI 3.1 document, generated from shared/protocol's types and
# operation list (tests/openapi.rs fails while the committed file differs).
openapi:
	cargo run -q -p tollgate -- openapi > openapi.json

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

lint-template:
	tests/harness/cfn-lint.sh
	tests/harness/sam-validate.sh

emulators-up:
	$(EMULATORS) up
	@echo "now: source .cache/emulators/env"

emulators-down:
	$(EMULATORS) down

# Release bootstrap zips for Lambda (provided.al2023), one per function, sizes printed;
# fails when one is larger than ZIP_LIMIT. Profile LAMBDA_PROFILE (Cargo.toml: release
# optimised for size, panics unwind). The zips go to LAMBDA_DIR/<function>/ (named
# explicitly: cargo-lambda's default, whatever the profile), recompressed with zopfli
# (tests/harness/lambda-zip.py), with LAMBDA_DIR/ARCH saying which architecture they are
# for. cargo-lambda, zig and zopfli: pinned copies in .cache/lambda-tools.
# arm64 needs `rustup target add aarch64-unknown-linux-gnu` first.
build:
	rm -f $(foreach f,$(FUNCTIONS),$(LAMBDA_DIR)/$(f)/bootstrap.zip) $(LAMBDA_DIR)/ARCH
	bin=$$(tests/harness/lambda-tools.sh) && PATH="$$bin:$$PATH" \
	  cargo lambda build --profile $(LAMBDA_PROFILE) $(CARGO_LAMBDA_ARCH) --output-format zip \
	    --lambda-dir $(LAMBDA_DIR) $(foreach f,$(FUNCTIONS),-p $(f)) && \
	  "$$bin/../venv/bin/python" tests/harness/lambda-zip.py $(foreach f,$(FUNCTIONS),$(LAMBDA_DIR)/$(f)/bootstrap.zip)
	@over=0; for f in $(FUNCTIONS); do \
	  z=$(LAMBDA_DIR)/$$f/bootstrap.zip; size=$$(stat -c %s $$z) || exit 1; \
	  printf '%-15s %s  %s bytes (%s)\n' "$$f" "$$z" "$$size" "$(ARCH)"; \
	  if [ "$$size" -gt $(ZIP_LIMIT) ]; then echo "  ^ larger than $(ZIP_LIMIT) bytes" >&2; over=1; fi; \
	done; \
	if [ $$over = 1 ]; then echo "make build: a zip is larger than ZIP_LIMIT ($(ZIP_LIMIT) bytes), this project's own budget for cold starts (AWS takes up to 50 MB zipped); ZIP_LIMIT=… raises it for one build" >&2; exit 1; fi
	echo $(ARCH) > $(LAMBDA_DIR)/ARCH

# Deploys exactly what `make build` makes: the template's CodeUri are the zips (no
# `sam build`). Needs AWS credentials; the SAM CLI is PATH's if recent enough, else the
# pinned copy tests/harness/sam-cli.sh installs into .cache/sam. The first deploy is
# guided (stack name `tollgate` offered) and saves its answers in SAMCONFIG; later ones
# deploy with those answers and pass no parameter (so nothing saved is reset), building
# for the saved Architecture. GUIDED=1 asks every question again, the saved answers as
# defaults (GUIDED=1 ARCH=… first changes the saved Architecture). A failed first create
# is deleted (--on-failure DELETE), so it can be retried.
deploy:
	@set -euo pipefail; \
	case "$(ARCH)" in arm64|x86_64) ;; *) echo "make deploy: ARCH must be arm64 or x86_64" >&2; exit 2;; esac; \
	if { [ ! -f $(SAMCONFIG) ] || [ -n "$(GUIDED)" ]; } && [ ! -t 0 ]; then \
	  echo "make deploy: a guided deploy asks questions; run it in a terminal" >&2; exit 2; \
	fi; \
	sam=$$($(SAM)); echo "SAM CLI: $$sam ($$("$$sam" --version))"; \
	if [ -f $(SAMCONFIG) ]; then \
	  arch=$$(tests/harness/samconfig.sh Architecture $(SAMCONFIG)); arch=$${arch:-arm64}; \
	  if [ "$(origin ARCH)" = "command line" ] && [ "$(ARCH)" != "$$arch" ] && [ -z "$(GUIDED)" ]; then \
	    echo "make deploy: $(SAMCONFIG) deploys Architecture=$$arch; to change it: make deploy GUIDED=1 ARCH=$(ARCH)" >&2; exit 2; \
	  fi; \
	  if [ -n "$(GUIDED)" ] && [ "$(origin ARCH)" = "command line" ] && [ "$(ARCH)" != "$$arch" ]; then \
	    sed -i 's/Architecture=\\"'"$$arch"'\\"/Architecture=\\"$(ARCH)\\"/' $(SAMCONFIG); \
	    arch=$$(tests/harness/samconfig.sh Architecture $(SAMCONFIG)); \
	    [ "$$arch" = "$(ARCH)" ] || { echo "make deploy: cannot set Architecture in $(SAMCONFIG); edit it" >&2; exit 2; }; \
	  fi; \
	else arch=$(ARCH); fi; \
	$(MAKE) --no-print-directory build ARCH=$$arch; \
	if [ ! -f $(SAMCONFIG) ]; then \
	  echo "First deploy: answer the questions (README, Deploy on AWS). Enter accepts a default."; \
	  "$$sam" deploy --guided --template-file infra/template.yaml --on-failure DELETE \
	    --no-fail-on-empty-changeset --stack-name tollgate --parameter-overrides Architecture=$$arch; \
	elif [ -n "$(GUIDED)" ]; then \
	  "$$sam" deploy --guided --template-file infra/template.yaml --on-failure DELETE \
	    --no-fail-on-empty-changeset; \
	else \
	  "$$sam" deploy --template-file infra/template.yaml --on-failure DELETE \
	    --no-fail-on-empty-changeset; \
	fi; \
	saved=$$(tests/harness/samconfig.sh Architecture $(SAMCONFIG)); \
	if [ -n "$$saved" ] && [ "$$saved" != "$$arch" ]; then \
	  echo "make deploy: the zips are $$arch, the answer was Architecture=$$saved: run make deploy again (it builds for $$saved)" >&2; exit 1; \
	fi

# Ready `export` lines for the deployed stack (read with the AWS SDK: the stack's outputs
# and its signing secret): TOLLGATE_URL, the stream URLs, AGENT_TOKEN and OPERATOR_TOKEN.
#   eval "$$(make -s tokens)"
tokens:
	@cargo build -q -p tollgate
	@./target/debug/tollgate token --stack "$(or $(STACK),tollgate)" \
	  $$(r=$$(tests/harness/samconfig.sh region $(SAMCONFIG) 2>/dev/null) && [ -n "$$r" ] && echo --region "$$r")

# Deletes the stack (sam delete asks first). Kept, on purpose: the five tables (runs,
# events, approvals, policies, mutations) and the signing secret, which derives every
# retained run's token; a stack of the same name cannot be created while they exist.
destroy:
	@set -euo pipefail; stack="$(or $(STACK),tollgate)"; sam=$$($(SAM)); \
	echo "Deleting stack $$stack. Kept (DeletionPolicy RetainExceptOnCreate): the tables"; \
	for t in runs events approvals policies mutations; do echo "  $$stack-$$t"; done; \
	echo "and the secret $$stack-signing-secret (the retained runs' tokens derive from it)."; \
	echo "See README, Deploy on AWS, to delete them too or deploy this stack name again."; \
	region=$$(tests/harness/samconfig.sh region $(SAMCONFIG) 2>/dev/null || true); \
	"$$sam" delete --stack-name "$$stack" $${region:+--region "$$region"}

# The randomized workload over serve processes with DynamoDB and SQS behind fault proxies,
# DynamoDB Local killed and restarted on its on-disk database, a serve process killed;
# then the history checker (tests/src/chaos/). One line per seed; fails on a violation.
# CHAOS_ARGS adds or overrides arguments (--seeds, --first-seed, --ops, --fault-rate, …).
CHAOS := ./target/debug/tollgate-chaos
chaos:
	cargo build -p tollgate
	cargo build -p tollgate-tests --bin tollgate-chaos
	$(EMULATORS) with $(CHAOS) --seeds 20 --ops 500 --total-seconds 570 $(CHAOS_ARGS)

# The short run `make test` does (inside test-integration: the emulators are up).
chaos-short:
	cargo build -p tollgate
	cargo build -p tollgate-tests --bin tollgate-chaos
	$(CHAOS) --seeds 2 --ops 300 --total-seconds 110 $(CHAOS_ARGS)

# The parsers under proptest with many more cases than `make test` runs, then each
# cargo-fuzz target (fuzz/, libFuzzer on the nightly toolchain) for FUZZ_SECONDS.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := request_bodies jwt run_token sse resume origin
fuzz:
	PROPTEST_CASES=$${PROPTEST_CASES:-10000} cargo nextest run -p tollgate-tests --test fuzz_parsers --no-fail-fast
	command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
	cd fuzz && for t in $(FUZZ_TARGETS); do \
	  mkdir -p corpus/$$t && seeds= && if [ -d seeds/$$t ]; then seeds=seeds/$$t; fi && \
	  cargo +nightly fuzz run $$t corpus/$$t $$seeds -- -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 || exit 1; \
	done

# The WebSocket phase runs a `tollgate serve` process: target/debug/tollgate (the tests'
# binary, tests/src/serve.rs), so it is built too.
bench:
	cargo build -p tollgate
	cargo build --release -p tollgate-tests --bin tollgate-bench --bin tollgate-mcp-bench --bin tollgate-mcp-echo
	cargo build --release -p tollgate
	$(EMULATORS) with ./target/release/tollgate-bench
	RUST_LOG=warn TOLLGATE_BIN=target/release/tollgate ./target/release/tollgate-mcp-bench
