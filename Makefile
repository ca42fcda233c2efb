# shmlocks: `make test` is what CI runs (.ci/run); `make bench` measures.
GO      ?= go
TIMEOUT ?= 8m

.PHONY: all build demo test fmt vet race poll 386 cross bench clean

all: build

build:
	$(GO) build ./...

# The main job on a default table (see README).
demo:
	$(GO) run ./cmd/shmlocks demo

# Everything CI checks: formatting, vet, the race-enabled suite, the suite on
# the polling fallback, a 32-bit run (64-bit atomics alignment) and the
# cross-compiles of every package and its tests.
test: fmt vet race poll 386 cross

fmt:
	@out=$$(gofmt -l $$(find . -name '*.go' -not -path './.git/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...
	$(GO) vet -tags shmlocks_poll ./...

race:
	$(GO) test -race -count=1 -timeout $(TIMEOUT) ./...

poll:
	$(GO) test -tags shmlocks_poll -short -count=1 -timeout $(TIMEOUT) ./...

386:
	GOARCH=386 $(GO) test -short -count=1 -timeout $(TIMEOUT) ./...

cross:
	GOOS=darwin  GOARCH=arm64 $(GO) vet ./...
	GOOS=freebsd GOARCH=amd64 $(GO) vet ./...
	GOOS=windows GOARCH=amd64 $(GO) vet ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./...

clean:
	rm -rf bench-out shmlocks
