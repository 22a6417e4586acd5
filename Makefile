# basalt — see README.md. `make run` starts one node; `make test` runs everything.
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/basalt-storage/basalt/internal/server.Version=$(VERSION)
BIN     := bin/basalt

.PHONY: build run test unit e2e deps fuzz race vet lint clean

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/basalt

run: build
	./$(BIN) server

deps:
	./scripts/deps.sh

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l cmd internal tests)" || (gofmt -l cmd internal tests; echo "gofmt needed"; exit 1)

# Unit tests, then end-to-end tests against real processes (tests/e2e).
# Besides the unit and e2e tests: the race detector over the packages whose
# goroutines share the data path (the NBD server, the block layers, the S3
# backend and its MD5 hasher), and
# every fuzz target for 500 inputs beyond its seed corpus — a count, not a
# time: the fuzzer fails a time-boxed run whose last inputs outlast the box
# ("context deadline exceeded"), which fsync-bound targets do on a busy disk.
test: deps vet build
	$(GO) test -count=1 -timeout 25m ./internal/...
	$(MAKE) race
	$(MAKE) fuzz FUZZTIME=$(CI_FUZZTIME)
	BASALT_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 25m ./tests/e2e/...

CI_FUZZTIME ?= 500x
RACE_PKGS   ?= ./internal/nbd/... ./internal/block/... ./internal/objects/... ./internal/md5lanes/...

race:
	$(GO) test -race -count=1 -timeout 15m $(RACE_PKGS)

# Static analysis beyond go vet (installs staticcheck from the Go proxy).
lint: vet
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

unit: vet
	$(GO) test -count=1 ./internal/...

e2e: build
	BASALT_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -v -timeout 25m ./tests/e2e/...

# Run each fuzz target for FUZZTIME (default 30s).
FUZZTIME ?= 30s
fuzz:
	@for pkg in $$($(GO) list ./internal/...); do \
	  for t in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$t"; $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

clean:
	rm -rf bin
