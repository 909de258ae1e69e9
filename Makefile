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
FUNCTIONS := ingress approvals settlement timers stall-watch replay replay-stream operator-stream
CARGO_LAMBDA_ARCH := $(if $(filter arm64,$(ARCH)),--arm64,$(if $(filter x86_64,$(ARCH)),--x86-64,$(error ARCH must be arm64 or x86_64)))

.PHONY: help run test test-unit test-integration test-lambda cold-init lint lint-template emulators-up emulators-down bench build deploy

help:
	@echo "make run         build and start tollgate serve on 127.0.0.1:$(PORT) (embedded store)"
	@echo "make test        everything: unit, store contract on both adapters, integration on emulators"
	@echo "make test-unit   unit + contract + HTTP tests on the embedded store only (no emulators)"
	@echo "make test-lambda each function under cargo lambda watch, invoked with API Gateway v2 / Function URL fixtures"
	@echo "make cold-init   cold init per function under the local Runtime API (release build)"
	@echo "make lint        rustfmt check + clippy -D warnings"
	@echo "make bench       append/replay benchmarks on the embedded store and DynamoDB Local"
	@echo "make build       release bootstrap zips per function (ARCH=arm64|x86_64)"
	@echo "make deploy      sam build + sam deploy --guided"
	@echo "make emulators-up / emulators-down   start/stop DynamoDB Local + LocalStack (SQS) by hand"

run:
	cargo build -p tollgate
	./target/debug/tollgate serve --port $(PORT)

test: lint
	tests/harness/console.sh
	tests/harness/cfn-lint.sh
	cargo build -p tollgate
	tests/readme_tour.sh
	$(EMULATORS) with $(MAKE) --no-print-directory test-integration

# Runs every test; the AWS-backed ones use whatever AWS_ENDPOINT_URL* is set. Then the
# Lambda-runtime tier: each function under `cargo lambda watch`, invoked with fixtures.
test-integration:
	cargo build -p tollgate
	tests/harness/browser.sh
	cargo nextest run --workspace --no-fail-fast
	tests/lambda/run.sh

# Only the Lambda-runtime tier (starts its own emulators).
test-lambda:
	$(EMULATORS) with tests/lambda/run.sh

# Cold init of each function under the local Runtime API (release build).
cold-init:
	$(EMULATORS) with tests/lambda/cold_init.sh

test-unit:
	cargo build -p tollgate
	cargo nextest run --workspace --no-fail-fast -E 'not ($(AWS_TESTS))'

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

lint-template:
	tests/harness/cfn-lint.sh

emulators-up:
	$(EMULATORS) up
	@echo "now: source .cache/emulators/env"

emulators-down:
	$(EMULATORS) down

# Release bootstrap zips for Lambda (provided.al2023), one per function, sizes printed.
# Profile `lambda` (Cargo.toml: release optimised for size). The zips go to
# target/lambda/<function>/ (named explicitly: cargo-lambda's default, whatever the profile).
# arm64 needs `rustup target add aarch64-unknown-linux-gnu` first.
build:
	rm -f $(foreach f,$(FUNCTIONS),target/lambda/$(f)/bootstrap.zip)
	bin=$$(tests/harness/lambda-tools.sh) && PATH="$$bin:$$PATH" \
	  cargo lambda build --profile lambda $(CARGO_LAMBDA_ARCH) --output-format zip \
	    --lambda-dir target/lambda $(foreach f,$(FUNCTIONS),-p $(f))
	@for f in $(FUNCTIONS); do \
	  z=target/lambda/$$f/bootstrap.zip; \
	  printf '%-15s %s  %s bytes (%s)\n' "$$f" "$$z" "$$(stat -c %s $$z)" "$(ARCH)"; \
	done

# Needs the AWS SAM CLI and credentials; it cannot run on machines without AWS access.
deploy:
	sam build --template-file infra/template.yaml --parameter-overrides Architecture=$(ARCH)
	sam deploy --guided --parameter-overrides Architecture=$(ARCH)

bench:
	cargo build --release -p tollgate-tests --bin tollgate-bench
	$(EMULATORS) with ./target/release/tollgate-bench
