# Every entry point a person uses. `make test` is what CI runs (via .ci/run);
# `make demo` runs the embedded dev cluster. Nothing needs installing first:
# build tools are pinned Go tools (tools/go.mod) installed into ./bin here.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

BIN := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)
GO ?= go
GOFILES = $(shell git ls-files --cached --others --exclude-standard '*.go')
TOOLS := $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-connect-go
FUZZTIME ?= 10s
TEST_TIMEOUT ?= 15m
# GOTESTFLAGS=-count=1 bypasses the test cache (CI sets it).
GOTESTFLAGS ?=

.PHONY: help
help: ## List the targets.
	@grep -hE '^[a-z][a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

$(TOOLS): tools/go.mod tools/go.sum
	@echo ">> installing pinned tools into $(BIN) (buf takes a few minutes on a cold cache)"
	cd tools && GOBIN=$(BIN) $(GO) install tool
	@touch $(TOOLS)

.PHONY: tools
tools: $(TOOLS) ## Install the pinned build tools (buf, protoc plugins) into ./bin.

.PHONY: proto
proto: $(TOOLS) ## Regenerate pkg/wire from proto/.
	buf generate

.PHONY: build
build: ## Build the tenure server binary and tenurectl into ./bin.
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./cmd/...

.PHONY: fmt-check
fmt-check: ## Fail if gofmt would change any file.
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

.PHONY: vet
vet: ## go vet.
	$(GO) vet ./...

.PHONY: lint
lint: $(TOOLS) ## buf lint (STANDARD rules).
	buf lint

.PHONY: proto-check
proto-check: $(TOOLS) ## Fail if buf generate would change pkg/wire.
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	buf generate -o "$$tmp"; \
	if ! diff -r "$$tmp/pkg/wire/tenure" pkg/wire/tenure; then \
		echo "pkg/wire is stale: run 'make proto' and commit the result"; exit 1; fi

.PHONY: gotest
gotest: ## go test -race ./...
	$(GO) test -race -timeout $(TEST_TIMEOUT) $(GOTESTFLAGS) ./...

.PHONY: fuzz
fuzz: ## A short fuzz run of the journal decoder (FUZZTIME=10s).
	$(GO) test -run='^$$' -fuzz=FuzzOpen -fuzztime=$(FUZZTIME) ./pkg/journal

.PHONY: test
test: fmt-check vet lint proto-check gotest fuzz ## Everything CI checks, in order, stopping at the first failure.

.PHONY: bench
bench: ## Benchmarks (journal Record cost).
	$(GO) test -run='^$$' -bench=. -benchtime=2s -count=3 ./pkg/journal

.PHONY: clean
clean: ## Remove ./bin.
	rm -rf $(BIN)
