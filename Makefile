# shmlocks: `make test` is what CI runs (.ci/run); `make bench` measures.
GO      ?= go
TIMEOUT ?= 8m

.PHONY: all build run demo test fmt vet race poll checks 386 cross cross-darwin cross-windows cross-freebsd prom etcd etcd-vet bench clean

all: build

build:
	$(GO) build ./...
	$(GO) build -o shmlocks ./cmd/shmlocks

# The main job on the default table (see README): a 10-second stress run in
# which a worker holding a lock is SIGKILLed twice a second, checked by
# independent checkers; halfway through, a dump of the live table.
run: build
	@./shmlocks stress --table default --procs 4 --names 4 --chaos 2 --duration 10s --max-gap 2s & pid=$$!; \
	sleep 5; ./shmlocks dump --table "$$(./shmlocks path)"; wait $$pid

# Several processes contend for a few names and print their grants.
demo: build
	./shmlocks demo

# Everything CI checks: formatting, vet, the race-enabled suite, the suite on
# the polling fallback, the compile-only checks (the 32-bit build, run where
# the kernel can run it, and the darwin/windows vets), side by side, and the
# nested modules: prom (the Prometheus Collector) and etcd (the backend),
# each with its own go.mod so that the core module depends on neither.
# From empty caches (CI) this takes about 8 minutes on 2 CPUs, most of it
# compiling the standard library for each configuration.
test: fmt vet race poll checks prom etcd

checks:
	$(MAKE) --no-print-directory -j3 386 cross-darwin cross-windows

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

# A 32-bit run where the kernel can execute 386 binaries; where it cannot
# (no IA32 emulation, as on some VMs), the 32-bit tests are compiled only, so
# that 64-bit atomics alignment is still checked by the layout tests' types
# and the compiler, and the run says so.
386:
	@d=$$(mktemp -d); printf 'package main\nfunc main() {}\n' > $$d/p.go; \
	if GOARCH=386 $(GO) build -o $$d/p $$d/p.go && $$d/p 2>/dev/null; then \
		echo "GOARCH=386 go test -short ./..."; \
		GOARCH=386 $(GO) test -short -count=1 -timeout $(TIMEOUT) ./... || { rm -rf $$d; exit 1; }; \
	else \
		echo "386: this kernel cannot run 32-bit binaries: vetting the 32-bit build and its tests only"; \
		GOARCH=386 $(GO) vet ./... || { rm -rf $$d; exit 1; }; \
	fi; rm -rf $$d

# The other systems: darwin stands for the BSDs in make test (freebsd builds
# the same files: unix && !linux, tty_bsd.go); make cross adds freebsd.
cross: cross-darwin cross-windows cross-freebsd
cross-darwin:
	GOOS=darwin  GOARCH=arm64 $(GO) vet ./...
cross-windows:
	GOOS=windows GOARCH=amd64 $(GO) vet ./...
cross-freebsd:
	GOOS=freebsd GOARCH=amd64 $(GO) vet ./...

prom:
	cd prom && $(GO) vet ./... && $(GO) test -race -count=1 -timeout $(TIMEOUT) ./...

# The etcd backend, a nested module (etcd/, its own go.mod: etcd stays out
# of the core module): its tests on embedded etcd clusters (loopback,
# t.TempDir; docs/etcd.md), with go test's own vet checks. ETCD_RACE=-race
# adds the race detector (the embedded etcd server is then several times
# slower). make etcd-vet runs the full vet: from an empty cache it analyses
# all of etcd's dependencies (over two minutes), so make test leaves it out.
ETCD_RACE ?=
etcd:
	cd etcd && $(GO) test $(ETCD_RACE) -count=1 -timeout $(TIMEOUT) ./...
etcd-vet:
	cd etcd && $(GO) vet ./...

# The benchmarks of docs/benchmarks.md: medians of COUNT runs, ratios and the
# issue targets; raw output and summary in bench-out/ (about 5 minutes).
COUNT ?= 3
bench:
	GO=$(GO) COUNT=$(COUNT) OUT=bench-out bash docs/bench.sh

clean:
	rm -rf bench-out shmlocks
