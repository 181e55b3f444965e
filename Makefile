# Every target a forker expects. `make help` lists them from the ## comments.

GO   ?= go
# The toolchain without known vulnerabilities in what we call (C1): go.mod
# asks for it, and the go command fetches it through the module proxy once
# per machine. Exported, so every go command the targets run uses it.
export GOTOOLCHAIN := go1.27.3
SQLC := $(GO) run github.com/sqlc-dev/sqlc/cmd/sqlc@v1.31.1
OAPI := $(GO) run github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.8.2
GOLANGCI_LINT := $(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0
GOVULNCHECK   := $(GO) run golang.org/x/vuln/cmd/govulncheck@v1.9.0
# The Go vulnerability database as of this version of golang.org/x/vulndb
# (a module on the proxy; no other network). Move it forward to learn of
# newer vulnerabilities: go list -m golang.org/x/vulndb@latest
VULNDB_VERSION := v0.0.0-20261105234957-e22db6528018
# Its index, built once per version, outside the repository (like Go's own caches).
VULNDB_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/govulndb/$(VULNDB_VERSION)
BIN  := bin
# The TypeScript client's types are generated from openapi.yaml by
# openapi-typescript, pinned with the other Node tools in .tools/ (npm ci
# --prefix .tools). A field with a default stays optional, as the contract
# says, instead of required (the tool's default).
OPENAPI_TS := .tools/node_modules/.bin/openapi-typescript
OPENAPI_TS_FLAGS := --default-non-nullable false
TS_API := clients/typescript/src/api.gen.ts

.DEFAULT_GOAL := help
.PHONY: help run psql reset test bench loadtest loadtest-smoke loadtest-pgbench capacity capacity-standby capacity-smoke soak soak-smoke chaos fuzz fuzz-ci generate verify lint vuln build migrate-new rename upgrade-test

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {n++; name[n] = $$1; text[n] = $$2; if (length($$1) > w) w = length($$1)} \
		END {for (i = 1; i <= n; i++) printf "  %-" w "s  %s\n", name[i], text[i]}' $(MAKEFILE_LIST)

run: ## Run the API locally: private PostgreSQL (unless DATABASE_URL is set), demo tenant, curl examples
	@# The binary runs in make's place (exec), not under go run: Ctrl-C stops
	@# it cleanly and make reports no error. A cold build (a new machine, or
	@# a new toolchain) compiles some 550 packages, minutes on two cores, so
	@# it counts them as go build -v names them; other lines (downloads,
	@# errors) pass through, and the build's status is make's.
	@echo "building the API: the first build on a machine fetches go1.27.3 and the modules, then compiles about 550 packages (several minutes on 2 cores); later builds take seconds"
	@total=$$($(GO) list -deps ./cmd/api | wc -l); \
	{ $(GO) build -v -o $(BIN)/api ./cmd/api 2>&1; echo "build-status=$$?"; } | awk -v total="$$total" ' \
		/^build-status=/ { if (open) printf "\n"; sub(/^build-status=/, ""); exit $$0 } \
		/^[^ :]+$$/ { n++; open = 1; printf "\r  compiled %d of at most %d packages", n, total; fflush(); next } \
		{ if (open) printf "\n"; open = 0; print; fflush() }'
	exec ./$(BIN)/api dev

psql: ## Open psql on the development database of make run (.dev/ports); make run must be running
	@# make run keeps postgres=<port> in .dev/ports, and PostgreSQL's pid file
	@# exists only while the server runs.
	@port=$$(sed -n 's/^postgres=//p' .dev/ports 2>/dev/null); \
	if [ -z "$$port" ]; then echo "psql: make run has not started its PostgreSQL here (no port in .dev/ports): run make run first (with DATABASE_URL set, use psql \"\$$DATABASE_URL\")"; exit 1; fi; \
	if [ ! -f .dev/postgres/postmaster.pid ]; then echo "psql: the development PostgreSQL is not running: start make run in another terminal"; exit 1; fi; \
	exec psql "postgres://postgres@127.0.0.1:$$port/payments?sslmode=disable"

reset: ## Forget the development state: the private PostgreSQL, the broker's storage and the demo key (.dev/)
	rm -rf .dev

test: ## Run every test on a real PostgreSQL (a throwaway cluster unless TEST_DATABASE_URL is set)
	$(GO) test -count=1 ./...
	@# The load benchmark's routes (the baselines, the claim-first peer)
	@# exist only in -tags loadtest builds: their tests run with the tag.
	$(GO) test -count=1 -tags loadtest -run '^(TestBaselineCreate|TestBaselinePayment|TestClaimFirstCreate)$$' ./internal/http/
	cd client && $(GO) test -count=1 ./...

bench: ## Run the benchmarks
	$(GO) test -run='^$$' -bench=. -benchmem ./...

loadtest: ## Load benchmark: real server, durable PostgreSQL, vegeta at c=32; prints the ratios, round trips per request, RSS (a few minutes)
	$(GO) run ./tools/loadtest $(LOADTEST_FLAGS)

loadtest-smoke: ## The load benchmark's short mode (what CI runs): it must finish and print, speed is not judged
	$(GO) run ./tools/loadtest -short $(LOADTEST_FLAGS)

loadtest-pgbench: ## What one create costs PostgreSQL (CPU per transaction), and each piece of the pattern, driven by pgbench
	$(GO) run ./tools/loadtest -pgbench $(LOADTEST_FLAGS)

capacity: ## Commits/s per vCPU of the primary and commits per request (create, payment, mix); results in docs/capacity/ (some 8 minutes)
	$(GO) run ./tools/loadtest -capacity -capacity-json docs/capacity/results-$$(date +%F).json $(CAPACITY_FLAGS)

capacity-standby: ## The same with a synchronous streaming standby (synchronous_commit on); its own results file
	$(GO) run ./tools/loadtest -capacity -sync-standby -capacity-json docs/capacity/results-$$(date +%F)-sync-standby.json $(CAPACITY_FLAGS)

capacity-smoke: ## The capacity's short mode with the standby (what CI runs): one round of 2 s per scenario, checked, no results file
	$(GO) run ./tools/loadtest -capacity -sync-standby -short $(CAPACITY_FLAGS)

soak: ## A day of churn in half an hour: 30 minutes at 600 requests/s, the API's horizons divided by 432, judged; plot and CSV in docs/soak/
	$(GO) run ./tools/loadtest -soak 30m -soak-rate 600 -soak-plot docs/soak/soak-$$(date +%F).png $(SOAK_FLAGS)

soak-smoke: ## The soak's short mode (what CI runs): one minute, a row every 10 s; its traffic is checked, its verdict not required
	$(GO) run ./tools/loadtest -soak 1m -soak-interval 10s -soak-rate 300 $(SOAK_FLAGS)

chaos: ## Patroni failover and split brain, pooler, NATS cluster and link faults against a local HA deployment, then the checker (CHAOS_FLAGS=-short: what CI runs)
	$(GO) run ./tools/chaos $(CHAOS_FLAGS)

FUZZTIME ?= 30s
fuzz: ## Fuzz the key parser, the canonicalizer, the strict decoder and the whole request path (FUZZTIME each)
	$(GO) test -run='^$$' -fuzz='^FuzzParseKey$$' -fuzztime=$(FUZZTIME) ./internal/idem/
	$(GO) test -run='^$$' -fuzz='^FuzzCanonicalize$$' -fuzztime=$(FUZZTIME) ./internal/idem/
	$(GO) test -run='^$$' -fuzz='^FuzzDecodeStrict$$' -fuzztime=$(FUZZTIME) ./internal/idem/
	$(GO) test -run='^$$' -fuzz='^FuzzRequest$$' -fuzztime=$(FUZZTIME) ./internal/http/

# fuzz-ci compiles each package's test binary once and runs it for each of
# its targets, where go test -fuzz would link it again per target. Only this
# module's packages are instrumented: go test -fuzz instruments every
# dependency too (pgx, NATS, the standard library), a cold compile of
# minutes, and the instrumented dependencies make each input ~15 times
# slower to run, so a few seconds find fewer new inputs, not more. Targets
# are found by their func Fuzz lines; each runs in its package's directory,
# where its testdata/fuzz corpus is, and shares go test's fuzz cache.
fuzz-ci: FUZZTIME = 3s
fuzz-ci: ## Fuzz every target for a few seconds each (FUZZTIME=3s; what CI runs), one instrumented test binary per package
	@set -e; bin=$$(mktemp -d); trap 'rm -rf "$$bin"' EXIT; \
	module=$$($(GO) list -m); cache=$$($(GO) env GOCACHE)/fuzz; \
	for dir in $$(grep -rl --include='*_test.go' --exclude-dir='.?*' '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
	  pkg=$$($(GO) list $$dir); test=$$bin/$$(echo $${dir#./} | tr / -).test; \
	  echo "go test -c $$pkg (instrumented for fuzzing)"; \
	  $(GO) test -c -o $$test -gcflags="$$module/...=-d=libfuzzer" $$dir; \
	  for name in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$dir/*_test.go); do \
	    echo "fuzz $$pkg $$name for $(FUZZTIME)"; \
	    (cd $$dir && $$test -test.run='^$$' -test.fuzz="^$$name\$$" -test.fuzztime=$(FUZZTIME) -test.fuzzcachedir=$$cache/$$pkg); \
	  done; \
	done

generate: ## Regenerate the sqlc code (internal/db/dbsqlc), the Go and TypeScript clients' types (client/api, clients/typescript/src/api.gen.ts) from openapi.yaml, and db/schema.sql from the migrations
	$(SQLC) generate
	cd client/api && $(OAPI) -config oapi-codegen.yaml ../../openapi.yaml
	@test -x $(OPENAPI_TS) || { echo "generate: $(OPENAPI_TS) is not installed: run npm ci --prefix .tools"; exit 1; }
	$(OPENAPI_TS) openapi.yaml $(OPENAPI_TS_FLAGS) -o $(TS_API)
	$(GO) run ./tools/schema -o db/schema.sql

verify: ## Fail if generated code (the Go and TypeScript clients' types too), db/schema.sql or go.mod is out of date
	$(SQLC) diff
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
	sed 's|^output: .*|output: '$$tmp'/api.gen.go|' client/api/oapi-codegen.yaml > $$tmp/config.yaml && \
	$(OAPI) -config $$tmp/config.yaml openapi.yaml && \
	diff -u client/api/api.gen.go $$tmp/api.gen.go || { echo "client/api/api.gen.go is stale: run make generate"; exit 1; }
	@# The TypeScript client's types, when the Node tools are installed
	@# (CI installs them; without them only CI fails here).
	@if [ -x $(OPENAPI_TS) ]; then \
	  tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
	  $(OPENAPI_TS) openapi.yaml $(OPENAPI_TS_FLAGS) -o $$tmp/api.gen.ts >/dev/null && \
	  diff -u $(TS_API) $$tmp/api.gen.ts || { echo "$(TS_API) is stale: run make generate"; exit 1; }; \
	elif [ -n "$$CI" ]; then echo "verify: $(OPENAPI_TS) is not installed: run npm ci --prefix .tools"; exit 1; \
	else echo "verify: $(TS_API) not checked: openapi-typescript is not installed (npm ci --prefix .tools)"; fi
	$(GO) run ./tools/schema -check db/schema.sql
	$(GO) mod tidy -diff
	cd client && $(GO) mod tidy -diff
	cd tools/peers && $(GO) mod tidy -diff

lint: ## go vet, gofmt and golangci-lint (v2.15.0, the linters and exclusions of .golangci.yml)
	$(GO) vet ./...
	cd client && $(GO) vet ./...
	cd tools/peers && $(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GOLANGCI_LINT) run ./...
	cd client && $(GOLANGCI_LINT) run ./...
	cd tools/peers && $(GOLANGCI_LINT) run ./...

vuln: ## Fail on a known vulnerability in code we call: govulncheck over a local copy of the Go vulnerability database
	@if [ ! -f "$(VULNDB_DIR)/index/db.json" ]; then \
	  echo "vuln: indexing golang.org/x/vulndb@$(VULNDB_VERSION) into $(VULNDB_DIR) (once per version)"; \
	  $(GO) mod download golang.org/x/vulndb@$(VULNDB_VERSION) && \
	  src=$$($(GO) list -m -f '{{.Dir}}' golang.org/x/vulndb@$(VULNDB_VERSION)) && \
	  rm -rf "$(VULNDB_DIR).tmp" && mkdir -p "$$(dirname "$(VULNDB_DIR)")" && \
	  $(GO) run golang.org/x/vulndb/cmd/indexdb@$(VULNDB_VERSION) -vulns "$$src/data/osv" -out "$(VULNDB_DIR).tmp" && \
	  rm -rf "$(VULNDB_DIR)" && mv "$(VULNDB_DIR).tmp" "$(VULNDB_DIR)"; \
	fi
	$(GOVULNCHECK) -db "file://$(VULNDB_DIR)" ./...
	cd client && $(GOVULNCHECK) -db "file://$(VULNDB_DIR)" ./...

build: ## Build bin/api
	$(GO) build -o $(BIN)/api ./cmd/api

# make image: the API's container image from deploy/Containerfile, with
# nothing pulled (a static binary on scratch). Its build context is
# $(BIN)/image: the binary, the CA bundle of this machine and a passwd and
# group line for the non-root user. IMAGE names it; CONTAINER is the tool
# (CONTAINER=docker reads the same Containerfile). The tag is the module
# version the go command stamps from git (a tag, or v0.0.0-<time>-<commit>,
# +dirty written -dirty), read back from the binary with go version -m.
# BUILDAH_LAYERS=false: Podman's step cache would reuse a LABEL step whose
# build arguments changed, keeping an earlier build's labels (and it leaves
# an intermediate image per step); Docker ignores the variable.
#
# Beside the image, the binary's bill of materials: cyclonedx-gomod reads
# the modules the go command recorded in the binary and writes a CycloneDX
# JSON SBOM to $(BIN)/sbom.cdx.json; the image's labels carry its sha256
# and the tag of the SBOM's own image, IMAGE:<tag>.sbom (a scratch image
# holding only /sbom.cdx.json, deploy/Containerfile.sbom), which make
# image-push pushes with the image. $(BIN)/image.tag keeps the tag for it.
IMAGE     ?= payments-api
CONTAINER ?= podman
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt
CYCLONEDX := $(GO) run github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@v1.10.0
SBOM_LABEL := io.github.idemref.payments.sbom
.PHONY: image image-push
image: ## Build the container image (deploy/Containerfile): a static bin/image/api on scratch, non-root, tagged with its version and latest; its CycloneDX SBOM beside it
	@test -r "$(CA_BUNDLE)" || { echo "image: no CA bundle at $(CA_BUNDLE): install ca-certificates, or set CA_BUNDLE"; exit 1; }
	rm -rf $(BIN)/image $(BIN)/sbom $(BIN)/sbom.cdx.json $(BIN)/image.tag && mkdir -p $(BIN)/image $(BIN)/sbom
	CGO_ENABLED=0 $(GO) build -tags nodev -trimpath -buildvcs=auto -ldflags='-s -w' -o $(BIN)/image/api ./cmd/api
	cp "$(CA_BUNDLE)" $(BIN)/image/ca-certificates.crt
	printf 'api:x:65532:65532:api:/nonexistent:/sbin/nologin\n' > $(BIN)/image/passwd
	printf 'api:x:65532:\n' > $(BIN)/image/group
	@set -e; \
	meta=$$($(GO) version -m $(BIN)/image/api); \
	version=$$(printf '%s\n' "$$meta" | awk '$$1 == "mod" {print $$3}'); \
	revision=$$(printf '%s\n' "$$meta" | sed -n 's/^[[:space:]]*build[[:space:]]*vcs.revision=//p'); \
	tag=$$(printf '%s' "$$version" | tr -c 'A-Za-z0-9_.-' '-'); \
	case "$$tag" in [A-Za-z0-9_]*) ;; *) tag=dev ;; esac; \
	echo "cyclonedx-gomod bin -json -output $(BIN)/sbom.cdx.json $(BIN)/image/api"; \
	$(CYCLONEDX) bin -json -version "$$version" -output $(BIN)/sbom.cdx.json $(BIN)/image/api; \
	sbom=$$(sha256sum $(BIN)/sbom.cdx.json | cut -d' ' -f1); \
	cp $(BIN)/sbom.cdx.json $(BIN)/sbom/; \
	echo "$(CONTAINER) build -f deploy/Containerfile -t $(IMAGE):$$tag -t $(IMAGE):latest $(BIN)/image (version $$version)"; \
	BUILDAH_LAYERS=false $(CONTAINER) build -f deploy/Containerfile \
	  --build-arg VERSION="$$version" --build-arg REVISION="$${revision:-unknown}" \
	  --build-arg CREATED="$$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
	  --label "$(SBOM_LABEL).digest=sha256:$$sbom" --label "$(SBOM_LABEL).tag=$$tag.sbom" \
	  -t $(IMAGE):$$tag -t $(IMAGE):latest $(BIN)/image; \
	BUILDAH_LAYERS=false $(CONTAINER) build -f deploy/Containerfile.sbom \
	  --label "org.opencontainers.image.description=CycloneDX SBOM of $(IMAGE):$$tag" \
	  -t $(IMAGE):$$tag.sbom $(BIN)/sbom; \
	echo "$$tag" > $(BIN)/image.tag; \
	echo "image: $(IMAGE):$$tag (and :latest), $$($(CONTAINER) image inspect --format '{{.Size}}' $(IMAGE):$$tag) bytes; the binary $(BIN)/image/api $$(wc -c < $(BIN)/image/api) bytes; SBOM $(BIN)/sbom.cdx.json (sha256:$$sbom, image $(IMAGE):$$tag.sbom)"

# make image-push: the image make image built last, at its version tag, and
# its SBOM's image, to REGISTRY/<name>:<tag> and REGISTRY/<name>:<tag>.sbom;
# a REGISTRY of oci:DIR writes both into a local OCI layout instead (refs
# <name>:<tag> and <name>:<tag>.sbom), which is how the test reads a push back.
image-push: ## Push the image and its SBOM image: make image-push REGISTRY=registry.example.com/team (or REGISTRY=oci:DIR, a local OCI layout)
	@test -n "$(REGISTRY)" || { echo "image-push: name the registry: make image-push REGISTRY=registry.example.com/team (or REGISTRY=oci:/some/dir)"; exit 1; }
	@test -s $(BIN)/image.tag || { echo "image-push: no $(BIN)/image.tag: run make image first"; exit 1; }
	@set -e; tag=$$(cat $(BIN)/image.tag); name=$$(basename $(IMAGE)); \
	case "$(REGISTRY)" in oci:*) dest="$(REGISTRY):$$name" ;; *) dest="$(REGISTRY)/$$name" ;; esac; \
	for t in "$$tag" "$$tag.sbom"; do \
	  echo "$(CONTAINER) push $(IMAGE):$$t $$dest:$$t"; \
	  $(CONTAINER) push $(IMAGE):$$t "$$dest:$$t"; \
	done

# make manifests: the Kubernetes objects of an overlay
# (deploy/kubernetes/overlays/OVERLAY, or OVERLAY=a folder), rendered by
# the kustomize CLI from the module proxy, to stdout; refused while a
# FILL-IN is left, so that a placeholder never reaches a cluster: in the
# rendered objects, or in the overlay's .env files (a Secret's values are
# rendered in base64, where the word does not show).
KUSTOMIZE := $(GO) run sigs.k8s.io/kustomize/kustomize/v5@v5.8.1
OVERLAY   ?= dev
.PHONY: manifests
manifests: ## Render a Kubernetes overlay with kustomize (OVERLAY=dev or production) to stdout; refuses while a FILL-IN is left
	@set -e; dir=$(if $(findstring /,$(OVERLAY)),$(OVERLAY),deploy/kubernetes/overlays/$(OVERLAY)); \
	out=$$($(KUSTOMIZE) build "$$dir"); \
	left=$$({ printf '%s\n' "$$out" | grep -n FILL-IN | sed 's/^/rendered line /'; \
	  for f in "$$dir"/*.env; do [ ! -f "$$f" ] || grep -Hn FILL-IN "$$f"; done; } || true); \
	if [ -n "$$left" ]; then \
	  echo "manifests: $$dir still says FILL-IN; set these in its files first:" >&2; \
	  printf '%s\n' "$$left" >&2; exit 1; \
	fi; \
	printf '%s\n' "$$out"

migrate-new: ## Create the next pair of migration files: make migrate-new NAME=add_things
	@# POSIX sh only (Debian's /bin/sh is dash): expr reads the zero-padded
	@# number as decimal. Nothing is created unless every step succeeded.
	@echo "$(NAME)" | grep -Eq '^[a-z0-9_]+$$' || { echo "usage: make migrate-new NAME=add_things (lower case letters, digits and _)"; exit 2; }
	@last=$$(ls db/migrations/*.up.sql | sed 's|.*/\([0-9]*\)_.*|\1|' | sort -n | tail -1) && \
	next=$$(printf '%06d' "$$(expr "$$last" + 1)") && \
	test "$$next" != 000000 && \
	touch db/migrations/$${next}_$(NAME).up.sql db/migrations/$${next}_$(NAME).down.sql && \
	echo "created db/migrations/$${next}_$(NAME).up.sql and .down.sql"

rename: ## Give a fork its own module path and names: make rename MODULE=example.com/acme/orders [NAME= KEY_PREFIX=]
	@# Empty values take the command's defaults; it checks every value itself.
	$(GO) run ./tools/rename -module '$(MODULE)' -name '$(NAME)' -key-prefix '$(KEY_PREFIX)'

# make upgrade-test (G8): the previous release's binary, built from its own
# tree, serves beside this tree's on the schema this tree migrated. Which
# revision is the previous release: UPGRADE_FROM, else the rule of
# docs/forking.md ("Upgrades without downtime"). Skips on a shallow clone,
# unless CI is set.
upgrade-test: ## The previous release's api serve beside this one on this schema: order, replay, payment (UPGRADE_FROM=rev)
	$(GO) run ./tools/upgrade -from '$(UPGRADE_FROM)'
