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
# A count, not a duration: with -fuzztime=10s Go's fuzzing coordinator can
# fail a clean run with a bare "context deadline exceeded" when the deadline
# fires while a worker is mid-input (golang/go#75804; seen in make test
# here, no failing input written). A count has no deadline to race.
# 200000 inputs is ~5s on this box, ~12s on a slow day.
FUZZTIME ?= 200000x
TEST_TIMEOUT ?= 15m
# GOTESTFLAGS=-count=1 bypasses the test cache (CI sets it).
GOTESTFLAGS ?=

.PHONY: help
help: ## List the targets by group, what each builds first, and the variables.
	@awk -f tools/help.awk $(MAKEFILE_LIST)

$(TOOLS): tools/go.mod tools/go.sum
	@echo ">> installing pinned tools into $(BIN) (buf takes a few minutes on a cold cache)"
	cd tools && GOBIN=$(BIN) $(GO) install tool
	@touch $(TOOLS)

.PHONY: tools
tools: $(TOOLS) ## Install the pinned build tools (buf, protoc plugins) into ./bin.

.PHONY: proto
proto: $(TOOLS) ## Regenerate pkg/wire from proto/.
	buf generate

# A cold Go build cache (a fresh machine) compiles every dependency, etcd's
# server and gRPC included: about 2 minutes on two idle cores (170 CPU-s
# measured here), downloads aside. After that a build takes seconds.
.PHONY: build
build: ## Build the tenure server binary and tenurectl into ./bin (first run ~2 min, then seconds).
	@echo ">> building bin/tenure and bin/tenurectl (the first run, with a cold Go cache, takes ~2 min; then seconds)"
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./cmd/...

.PHONY: demo
demo: build ## Run the embedded dev cluster and a scripted failover (ARGS=--keep keeps it up for tenurectl); builds first (~2 min the first time).
	$(BIN)/tenure dev $(ARGS)

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
gotest: ## go test -race on every package but the chaos suite (chaos-short runs it, alone).
	$(GO) test -race -timeout $(TEST_TIMEOUT) $(GOTESTFLAGS) $$($(GO) list ./... | grep -v '/internal/chaos$$')

# The chaos suite's short budget runs after the other packages, not beside
# them: each of its runs is a whole cluster under faults with 2 s leases, and
# next to the mass-failover test on two cores both starve.
.PHONY: chaos-short
chaos-short: ## The chaos suite's short budget (2 seeds of every fault kind), as make test runs it.
	$(GO) test -race -timeout $(TEST_TIMEOUT) $(GOTESTFLAGS) ./internal/chaos

# -benchtime=1x: each benchmark runs its shapes once, for -bench.duration;
# a smoke run that proves the harness and both clusters still start,
# acknowledge and drain (the first failed append fails it). No speed is
# asserted: speed is not a test.
.PHONY: bench-check
bench-check: ## The bench module (its own go.mod, so ./... above skips it): vet, its tests, and every benchmark once for 300ms.
	cd bench && $(GO) vet ./...
	cd bench && $(GO) test -race -timeout $(TEST_TIMEOUT) $(GOTESTFLAGS) -bench=. -benchtime=1x -bench.duration=300ms ./...

# Every RPC fuzzed against a real server (internal/rpcfuzz): an input is a
# network round trip, ~400-1500 a second here, so these take a count of
# their own. A long run: make fuzz RPC_FUZZTIME=1000000x.
RPC_FUZZTIME ?= 5000x
# Minimisation is bounded by a count, not left at Go's default of 60 s: with
# a count limit (-fuzztime=Nx) the coordinator reserves N/workers executions
# for every input it minimises, and hands out no fuzzing work while the
# reservation and the count reach N, so a long run stalled at 0 execs/s for
# up to a minute at a time, and for good near its end (seen at 899k of 1M).
# A count makes each reservation that small.
FUZZ_MINIMIZE ?= 500x
# The servers' data (Badger, the journal, embedded etcd) go on tmpfs when
# there is one: a fuzz target checks what a server does with its input, not
# the disk, and an fsync per accepted input would make most of the time an
# input costs the disk's.
FUZZ_TMPDIR ?= $(if $(wildcard /dev/shm/.),/dev/shm,$(or $(TMPDIR),/tmp))
RPC_FUZZ = TMPDIR=$(FUZZ_TMPDIR) $(GO) test -run='^$$' -fuzztime=$(RPC_FUZZTIME) -fuzzminimizetime=$(FUZZ_MINIMIZE)

.PHONY: fuzz
fuzz: ## Short fuzz runs: the journal decoder (FUZZTIME=200000x inputs), then every RPC of each service against a real server (RPC_FUZZTIME=5000x).
	$(GO) test -run='^$$' -fuzz=FuzzOpen -fuzztime=$(FUZZTIME) ./pkg/journal
	$(RPC_FUZZ) -fuzz=FuzzReplicaRPC ./services/replica
	$(RPC_FUZZ) -fuzz=FuzzLeaseRPC ./services/lease
	$(RPC_FUZZ) -fuzz=FuzzPromoterRPC ./services/promoter

.PHONY: test
test: fmt-check vet lint proto-check gotest bench-check chaos-short fuzz ## Everything CI checks, in order, stopping at the first failure.

.PHONY: bench
bench: ## Benchmarks (journal Record cost).
	$(GO) test -run='^$$' -bench=. -benchtime=2s -count=3 ./pkg/journal

# SEEDS seeds of every fault kind (14; the timeout allows a minute a run);
# each run takes 5-12 s under -race.
SEEDS ?= 5
CHAOS_FLAGS ?=

.PHONY: chaos
chaos: ## In-process chaos: SEEDS (default 5) seeded runs of every fault kind, ending with the scoreboard.
	@mkdir -p $(BIN)
	$(GO) test -race -count=1 -timeout $$(( $(SEEDS) * 14 * 60 + 300 ))s -run '^TestChaos$$' ./internal/chaos \
		-chaos.seeds=$(SEEDS) -chaos.scoreboard=$(BIN)/chaos-scoreboard.txt $(CHAOS_FLAGS) -v 2>&1 | grep -v '^=== RUN'
	@echo ">> scoreboard also in $(BIN)/chaos-scoreboard.txt"

.PHONY: clean
clean: ## Remove ./bin.
	rm -rf $(BIN)

# ---- docker compose deployment (deploy/compose) ---------------------------
# Images are built FROM scratch from static binaries built here: nothing is
# ever pulled. The legacy builder (DOCKER_BUILDKIT=0) needs no buildx plugin.
# COMPOSE is whichever of `docker compose` (v2 plugin) and `docker-compose`
# (v1) exists; override with COMPOSE=... .
COMPOSE ?= $(shell if docker compose version >/dev/null 2>&1; then echo "docker compose"; elif command -v docker-compose >/dev/null 2>&1; then echo docker-compose; else echo "echo 'no docker compose or docker-compose found' >&2; false"; fi)
COMPOSE_FILE := deploy/compose/docker-compose.yml
COMPOSE_PROJECT ?= tenure
ETCD_VERSION := v3.7.3
JAEGER_VERSION := v1.75.0
TENURE_IMAGE ?= tenure/tenure:dev
ETCD_IMAGE ?= tenure/etcd:$(ETCD_VERSION)
JAEGER_IMAGE ?= tenure/jaeger:$(JAEGER_VERSION)
export TENURE_IMAGE ETCD_IMAGE JAEGER_IMAGE
STATIC_GO := CGO_ENABLED=0 $(GO) build -trimpath -ldflags=-s
IMAGES_DIR := $(BIN)/images
SMOKE_TIMEOUT ?= 900

# Static binaries for the images; each depends on its sources, so a second
# `make images` only re-checks the images (seconds).
$(BIN)/static/tenure $(BIN)/static/tenurectl &: $(GOFILES) go.mod go.sum
	$(STATIC_GO) -o $(BIN)/static/ ./cmd/tenure ./cmd/tenurectl

$(BIN)/static/httpcheck: deploy/compose/httpcheck/main.go
	$(STATIC_GO) -o $@ ./deploy/compose/httpcheck

$(BIN)/static/smoke: $(wildcard deploy/compose/smoke/*.go) $(GOFILES) go.mod go.sum
	$(STATIC_GO) -o $@ ./deploy/compose/smoke
	@chmod a+rx $@ # run as uid 65532 in the tenure image

$(BIN)/static/etcd: deploy/tools/etcd/go.mod deploy/tools/etcd/go.sum
	@echo ">> building etcd $(ETCD_VERSION) from its pinned module (about 2 minutes on a cold cache)"
	cd deploy/tools/etcd && $(STATIC_GO) -o $@ go.etcd.io/etcd/server/v3

# Jaeger is pinned to v1.75.0 (v1.76.0 is on the module proxy but is not an
# approved release): the build refuses a deploy/tools/jaeger/go.mod that
# selects another version, and stamps the version into the binary (what
# `jaeger version` and the UI's About menu show; a module build has none).
$(BIN)/static/jaeger: deploy/tools/jaeger/go.mod deploy/tools/jaeger/go.sum
	@v=$$(cd deploy/tools/jaeger && $(GO) list -m -f '{{.Version}}' github.com/jaegertracing/jaeger) && [ "$$v" = "$(JAEGER_VERSION)" ] || \
		{ echo "deploy/tools/jaeger/go.mod selects jaeger '$$v', the Makefile pins $(JAEGER_VERSION)" >&2; exit 1; }
	@echo ">> building jaeger $(JAEGER_VERSION) from its pinned module (6-15 minutes on a cold cache)"
	cd deploy/tools/jaeger && CGO_ENABLED=0 $(GO) build -trimpath \
		-ldflags='-s -X github.com/jaegertracing/jaeger/internal/version.latestVersion=$(JAEGER_VERSION)' \
		-o $@ github.com/jaegertracing/jaeger/cmd/jaeger

# The real Jaeger UI (jaeger-ui 1.68, built with npm upstream) from the Go
# module github.com/tonistiigi/jaeger-ui-rest, unpacked by
# deploy/tools/jaeger/uiassets into a tar the image ADDs; Jaeger's query
# extension serves it (ui.assets_path in deploy/compose/jaeger.yaml).
$(BIN)/static/jaeger-ui.tar: deploy/tools/jaeger/go.mod deploy/tools/jaeger/go.sum deploy/tools/jaeger/uiassets/main.go
	cd deploy/tools/jaeger && $(GO) run ./uiassets -tar $@

# image NAME TAG FILES...: stage a build context of hard links and build it.
define image
	@rm -rf $(IMAGES_DIR)/$(1) && mkdir -p $(IMAGES_DIR)/$(1)/tmp $(IMAGES_DIR)/$(1)/data && chmod 1777 $(IMAGES_DIR)/$(1)/tmp
	@ln -f $(3) $(IMAGES_DIR)/$(1)/
	@chmod -R a+rX $(IMAGES_DIR)/$(1) # the images run as uid 65532, whatever the umask
	DOCKER_BUILDKIT=0 docker build -q -t $(2) -f deploy/compose/images/$(1).Dockerfile $(IMAGES_DIR)/$(1) 2>&1 | \
		{ grep -v -e 'legacy builder is deprecated' -e 'BuildKit is currently disabled' -e 'environment-variable\.' -e '^$$' || true; }
endef

.PHONY: image-tenure image-etcd image-jaeger
image-tenure: $(BIN)/static/tenure $(BIN)/static/tenurectl
	$(call image,tenure,$(TENURE_IMAGE),$^)
image-etcd: $(BIN)/static/etcd $(BIN)/static/httpcheck
	$(call image,etcd,$(ETCD_IMAGE),$^)
image-jaeger: $(BIN)/static/jaeger $(BIN)/static/jaeger-ui.tar $(BIN)/static/httpcheck deploy/compose/jaeger.yaml
	$(call image,jaeger,$(JAEGER_IMAGE),$^)

# The first `make images` compiles etcd and Jaeger from source: ~14 minutes
# on two cores with a cold Go build cache (issue 30's reporter measured it),
# Jaeger most of it; after that seconds. images-note comes first among the
# prerequisites so the line is printed before the long builds start.
.PHONY: images-note
images-note:
	@echo ">> building the images (the first run compiles etcd and Jaeger: ~14 min with a cold Go cache; then seconds)"

.PHONY: images
images: images-note image-tenure image-etcd image-jaeger compose-certs ## Build the tenure, etcd and Jaeger images FROM scratch (static binaries; nothing is pulled; first run ~14 min), and the compose stack's certificates.

# The compose stack runs mutual TLS on every hop (etcd client and peer too):
# its CA and certificates, made by tenure itself (crypto/x509) into
# bin/compose-certs and mounted read-only at /certs in every container.
# Test certificates: the keys are made readable to the containers' uid
# 65532. Kept across runs (tenure certs init only adds what is missing).
COMPOSE_CERTS := $(BIN)/compose-certs
COMPOSE_HOSTS := lease-1,lease-2,replica-1,replica-2,replica-3,replica-4,promoter-1,promoter-2,etcd-1,etcd-2,etcd-3,jaeger
export TENURE_CERTS_DIR := $(COMPOSE_CERTS)

.PHONY: compose-certs
compose-certs: $(BIN)/static/tenure
	$(BIN)/static/tenure certs init $(COMPOSE_CERTS) --replicas replica-1,replica-2,replica-3,replica-4 \
		--promoters 1,2 --leases 1,2 --servers etcd-1,etcd-2,etcd-3,jaeger --hosts $(COMPOSE_HOSTS)
	@chmod a+rx $(COMPOSE_CERTS) && chmod a+r $(COMPOSE_CERTS)/*.pem

.PHONY: up
# The ports printed are the ones docker bound (TENURE_PUBLISH_* move them,
# see deploy/compose/docker-compose.yml); a port already taken fails before
# anything starts, naming the variable (deploy/compose/ports.sh).
up: images ## Start the compose stack (etcd x3, lease x2, replica x4 of which replica-4 is an idle spare, promoter x2, Jaeger) and wait for it to be healthy; builds the images first (~14 min the first time).
	deploy/compose/ports.sh check $(COMPOSE_PROJECT)
	$(COMPOSE) -p $(COMPOSE_PROJECT) -f $(COMPOSE_FILE) up -d
	COMPOSE="$(COMPOSE)" deploy/compose/wait-healthy.sh $(COMPOSE_PROJECT) 180
	@p() { deploy/compose/ports.sh get $(COMPOSE_PROJECT) $$1 $$2 || echo "$$1:$$2-unpublished"; }; \
		echo "lease-1 https://$$(p lease-1 7000), lease-2 https://$$(p lease-2 7000), replicas $$(p replica-1 7100) $$(p replica-2 7100) $$(p replica-3 7100) $$(p replica-4 7100) (replica-1..4; replica-4: the spare), promoters $$(p promoter-1 7200) $$(p promoter-2 7200)"; \
		echo "Jaeger UI: http://$$(p jaeger 16686)/trace/<trace id> (query API: /api/traces/<trace id>; /api/services lists services); OTLP/HTTP receiver https://$$(p jaeger 4318)"
	@echo "tenurectl on the stack's network: make ctl ARGS=status"

.PHONY: stop
stop: ## Stop the compose stack, keeping its volumes: make up starts it again with its ranges and records (not Jaeger's traces, kept in memory).
	$(COMPOSE) -p $(COMPOSE_PROJECT) -f $(COMPOSE_FILE) stop

.PHONY: down
down: ## Stop the compose stack and delete its volumes.
	$(COMPOSE) -p $(COMPOSE_PROJECT) -f $(COMPOSE_FILE) down -v --remove-orphans

.PHONY: ps
ps: ## Show the compose stack's containers and their health.
	$(COMPOSE) -p $(COMPOSE_PROJECT) -f $(COMPOSE_FILE) ps

.PHONY: compose-smoke
compose-smoke: images $(BIN)/static/smoke ## Bring up a separate compose stack, kill a leader, check no acknowledged record is lost and the promotion's trace; always tears it down.
	COMPOSE="$(COMPOSE)" SMOKE_BIN=$(BIN)/static/smoke timeout --kill-after=60 $(SMOKE_TIMEOUT) deploy/compose/smoke.sh

# The real Jaeger UI, in a real browser: load TRACE_ID's page from any
# Jaeger (a local one, or `make up`'s) in headless chromium and check the
# span tree it draws (deploy/compose/jaeger-ui-check.sh; exit 3: no chromium,
# so nothing was checked). make compose-smoke runs the same script.
# Without JAEGER_URL, the UI is looked for where the running stack of
# COMPOSE_PROJECT published it (TENURE_PUBLISH_JAEGER moves it, as for
# make ctl's trace links), else at Jaeger's own default port.
JAEGER_URL ?=
JAEGER_UI_SPANS ?= promote fence
.PHONY: jaeger-ui-check
jaeger-ui-check: ## Load TRACE_ID's page in Jaeger's UI (JAEGER_URL, default where make up published it, else http://127.0.0.1:16686) in headless chromium, check it draws the promote and fence spans (JAEGER_UI_SPANS); screenshot: bin/jaeger-trace.png.
	@[ -n "$(TRACE_ID)" ] || { echo "usage: make jaeger-ui-check TRACE_ID=<trace id> [JAEGER_URL=http://127.0.0.1:16686] [JAEGER_UI_SPANS='$(JAEGER_UI_SPANS)']" >&2; exit 2; }
	@url="$(JAEGER_URL)"; \
	[ -n "$$url" ] || url=http://$$(deploy/compose/ports.sh get $(COMPOSE_PROJECT) jaeger 16686 2>/dev/null || echo 127.0.0.1:16686); \
	echo "make jaeger-ui-check: Jaeger's UI at $$url" >&2; \
	JAEGER_UI_SCREENSHOT=$(BIN)/jaeger-trace.png deploy/compose/jaeger-ui-check.sh "$$url" $(TRACE_ID) $(JAEGER_UI_SPANS)

# The same UI files as a folder, for a Jaeger run outside the image.
$(BIN)/jaeger-ui/index.html: deploy/tools/jaeger/go.mod deploy/tools/jaeger/go.sum deploy/tools/jaeger/uiassets/main.go
	rm -rf $(BIN)/jaeger-ui
	cd deploy/tools/jaeger && $(GO) run ./uiassets -dir $(BIN)/jaeger-ui

.PHONY: jaeger-ui-local
jaeger-ui-local: $(BIN)/static/jaeger $(BIN)/jaeger-ui/index.html build ## Without Docker: run the image's Jaeger on loopback, export a promotion's trace from tenure dev, check it in headless chromium (bin/jaeger-trace.png); first run builds Jaeger (6-15 min).
	timeout --kill-after=30 600 deploy/compose/jaeger-ui-local.sh

CHAOS_COMPOSE_TIMEOUT ?= 1800

$(BIN)/static/chaos: $(wildcard deploy/compose/chaos/*.go) $(GOFILES) go.mod go.sum
	$(STATIC_GO) -o $@ ./deploy/compose/chaos

.PHONY: chaos-compose
chaos-compose: images $(BIN)/static/chaos ## Break a separate compose stack (kill, pause, disconnect, majority restart, damaged journal, paused lease services, replica replaced by the spare, a lease instance or etcd member killed) under load, check safety and liveness, print the scoreboard; always tears it down.
	COMPOSE="$(COMPOSE)" CHAOS_BIN=$(BIN)/static/chaos CHAOS_TENURECTL=$(BIN)/static/tenurectl timeout --kill-after=60 $(CHAOS_COMPOSE_TIMEOUT) deploy/compose/chaos.sh

.PHONY: ctl
# make ctl ARGS="status --json" | jq: stdout is tenurectl's alone, so the
# docker run line goes to stderr (make's own echo would go to stdout).
# Without the stack's network docker's own error ("network ... not found")
# says nothing of `make up`. tenurectl tries both promoters in turn, and
# either answers (a standby forwards to the elected one), so a stopped
# promoter-1 does not fail every command that asks the promoter while
# promoter-2 serves. The UI link tenurectl trace
# prints is Jaeger's port as published (TENURE_PUBLISH_JAEGER moves it).
ctl: ## Run tenurectl on the compose stack's network: make ctl ARGS="status".
	@docker network inspect $(COMPOSE_PROJECT)_tenure >/dev/null 2>&1 || \
		{ echo "make ctl: no compose stack of project $(COMPOSE_PROJECT) is up (no network $(COMPOSE_PROJECT)_tenure): make up first, with the same COMPOSE_PROJECT" >&2; exit 1; }
	@ui=$$(deploy/compose/ports.sh get $(COMPOSE_PROJECT) jaeger 16686 || echo 127.0.0.1:16686); \
	cmd=(docker run --rm -i --network $(COMPOSE_PROJECT)_tenure -v $(COMPOSE_CERTS):/certs:ro \
		-e TENURECTL_CACERT=/certs/ca.pem -e TENURECTL_CERT=/certs/operator.pem -e TENURECTL_KEY=/certs/operator-key.pem \
		-e TENURECTL_LEASE=https://lease-1:7000,https://lease-2:7000 -e TENURECTL_PROMOTER=https://promoter-1:7200,https://promoter-2:7200 -e TENURECTL_JAEGER=http://jaeger:16686 \
		-e TENURECTL_JAEGER_UI=http://$$ui $(TENURE_IMAGE) tenurectl); \
	echo "$${cmd[*]} $(ARGS)" >&2; \
	"$${cmd[@]}" $(ARGS)

# The services' Prometheus metrics are served in plaintext on the stack's
# network only (http://SERVICE:9090/metrics, not published); no tenure
# image has an HTTP client that prints a body, so the etcd image's
# httpcheck (--print) reads them from a throw-away container there.
.PHONY: metrics
metrics: ## Print a compose service's Prometheus metrics: make metrics SERVICE=replica-1 (lease-1/2, replica-1..4, promoter-1/2).
	@test -n "$(SERVICE)" || \
		{ echo "make metrics: name the service: make metrics SERVICE=replica-1 (lease-1, lease-2, replica-1..4, promoter-1, promoter-2)" >&2; exit 2; }
	@docker network inspect $(COMPOSE_PROJECT)_tenure >/dev/null 2>&1 || \
		{ echo "make metrics: no compose stack of project $(COMPOSE_PROJECT) is up (no network $(COMPOSE_PROJECT)_tenure): make up first, with the same COMPOSE_PROJECT" >&2; exit 1; }
	@docker run --rm --network $(COMPOSE_PROJECT)_tenure --entrypoint httpcheck $(ETCD_IMAGE) --timeout 5s --print http://$(SERVICE):9090/metrics
