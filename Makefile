# shmlocks: `make test` is what CI runs (.ci/run); `make bench` measures.
GO      ?= go
TIMEOUT ?= 8m

.PHONY: all build lib lang-build test-lang bench-lang run demo test test-suites test-vets release-check docs nested-build fmt vet race faults poll 386run 386 can386 cross cross-darwin cross-windows cross-freebsd cross-386 prom etcd etcd-vet bench clean

all: build

build:
	$(GO) build ./...
	$(GO) build -o shmlocks ./cmd/shmlocks

# libshmlocks.so and shmlocks.h, the C ABI (docs/c-abi.md), in LIBDIR; the
# Python module (python/shmlocks) finds the library there. Needs gcc (cgo).
LIBDIR ?= lib
lib:
	@command -v $${CC:-gcc} >/dev/null || { echo "make lib needs a C compiler (gcc, or CC) for cgo"; exit 1; }
	CGO_ENABLED=1 $(GO) build -buildmode=c-shared -o $(LIBDIR)/libshmlocks.so ./capi
	rm -f $(LIBDIR)/libshmlocks.h
	cp capi/shmlocks.h $(LIBDIR)/shmlocks.h

# The cross-language tests (python/tests, python3's unittest): Python, C, Go
# and shmlocks exec on one table, the conformance cases through Python, fork,
# bad input, asyncio, a chaos run that SIGKILLs Python and Go holders, the
# examples. Needs gcc and python3 (3.9+); without them it says so and skips.
# From an empty cache the c-shared build compiles the standard library once
# more (-shared): about 26 s of a 2-CPU machine.
# make test compiles them in its vet lane (lang-build) and runs them after
# both lanes: their processes, SIGKILLed at random and spinning on a name,
# would otherwise compete with the suites' own timing-bounded chaos runs.
LANG_TIMEOUT ?= 8m
lang-build:
	@if ! command -v $${CC:-gcc} >/dev/null; then echo "lang-build: skipped: no gcc (or CC) for cgo"; \
	else $(MAKE) --no-print-directory lib && $(GO) build ./capi/agents/goagent ./cmd/shmlocks; fi
test-lang:
	@if ! command -v $${CC:-gcc} >/dev/null || ! command -v python3 >/dev/null; then \
		echo "test-lang: skipped: the cross-language tests need gcc (or CC) and python3 on PATH"; \
	else $(MAKE) --no-print-directory lib && \
		timeout -k 10 $(LANG_TIMEOUT) python3 -m unittest discover -s python/tests -t python/tests; fi

# The main job on the default table (see README): a 10-second stress run of
# every feature (plain holders, shmlocks exec wrappers with running
# commands, child grants, Coalesce leaders, AcquireAll holders, a process
# each) with 20 SIGKILLs a second spread over them, checked by independent
# checkers (kills per feature, violations per kind: docs/cli.md); halfway
# through, a dump of the live table.
run: build
	@./shmlocks stress --table default --names 4 --chaos 20 --duration 10s --max-gap 2s & pid=$$!; \
	sleep 5; ./shmlocks dump --table "$$(./shmlocks path)"; wait $$pid

# Several processes contend for a few names and print their grants.
demo: build
	./shmlocks demo

# Everything CI checks: formatting; vet on every system we build for (linux,
# the polling build, windows for the !unix fallbacks, darwin, freebsd, and
# the 32-bit build); the race-enabled suite; the tests that truncate a live
# table (without -race, which skips them); the suite on the polling
# fallback; the 32-bit suite where the kernel can run it; and the nested
# modules: prom (the Prometheus Collector) and etcd (the backend), each with
# its own go.mod so that the core module depends on neither.
#
# From empty caches (as CI starts) most of the time is compiling the
# standard library once per configuration, and the suites mostly wait (on
# child processes, quiet periods): so two lanes run side by side on one
# build cache, the suites and the vets of the other systems, and the vets
# fill the CPU the suites leave idle. Each lane orders its steps so that
# neither compiles what the other is compiling (the lanes' first steps
# build the race and the plain standard library). Then, alone, the
# cross-language tests (test-lang; the vet lane compiled them: lang-build,
# the c-shared library being one more standard library, ~26 s from empty
# caches): ~35 s. On an idle 2-CPU AMD EPYC guest (2026-12-06) the whole
# took 691-712 s from an empty GOCACHE (modules already downloaded) and
# 353 s with a warm one; the docs' command lines and the release check at
# the end of the vet lane instead of the suites' made no difference (712 s).
test: fmt
	$(MAKE) --no-print-directory -j2 -Oline test-suites test-vets
	$(MAKE) --no-print-directory test-lang

test-suites:
	$(MAKE) --no-print-directory race
	$(MAKE) --no-print-directory faults
	$(MAKE) --no-print-directory docs
	$(MAKE) --no-print-directory poll
	$(MAKE) --no-print-directory 386run
	$(MAKE) --no-print-directory cross-386
	$(MAKE) --no-print-directory prom
	$(MAKE) --no-print-directory etcd
	$(MAKE) --no-print-directory release-check

test-vets:
	$(MAKE) --no-print-directory vet
	$(MAKE) --no-print-directory cross-windows
	$(MAKE) --no-print-directory cross-darwin
	$(MAKE) --no-print-directory cross-freebsd
	$(MAKE) --no-print-directory nested-build
	$(MAKE) --no-print-directory lang-build

# The nested modules' tests compiled, not run (-run '^$$'): the vet lane ends
# first, so it builds them for the suites lane, which then only runs them.
nested-build:
	cd prom && $(GO) test -race -count=1 -run '^$$' ./...
	cd etcd && $(GO) test $(ETCD_RACE) -count=1 -run '^$$' ./...

fmt:
	@out=$$(gofmt -l $$(find . -name '*.go' -not -path './.git/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...
	$(GO) vet -tags shmlocks_poll ./...

race:
	$(GO) test -race -count=1 -timeout $(TIMEOUT) ./...

# The tests that truncate a live table under running goroutines, on the
# default build without the race detector, which skips them (see
# skipFaultsUnderRace in manager/helpers_test.go).
faults:
	$(GO) test -count=1 -timeout $(TIMEOUT) -run '^(TestTruncatedUnderUs|TestTruncatedUnderUsOperations|TestLogCorrupt)$$' ./manager

# Every command line of README.md and docs/cli.md that can run on a fresh
# machine, run as written (TestDocsCommandLines), on the build without the
# race detector (which skips it: its stress runs would take minutes).
docs:
	$(GO) test -count=1 -timeout $(TIMEOUT) -run '^TestDocsCommandLines$$' ./cmd/shmlocks

poll:
	$(GO) test -tags shmlocks_poll -short -count=1 -timeout $(TIMEOUT) ./...

# The 32-bit suite (64-bit atomics alignment is a run-time check) where
# the kernel can execute 386 binaries (386run: nothing otherwise, and it
# says so; 386: vets the 32-bit build and its tests instead; cross-386: the
# vet, always). Some VMs have no IA32 emulation.
386run:
	@if $(MAKE) --no-print-directory can386 >/dev/null 2>&1; then \
		GOARCH=386 $(GO) test -short -count=1 -timeout $(TIMEOUT) ./...; \
	else echo "386: this kernel cannot run 32-bit binaries: the 32-bit suite is skipped (make cross-386 vets it)"; fi
386:
	@if $(MAKE) --no-print-directory can386 >/dev/null 2>&1; then \
		GOARCH=386 $(GO) test -short -count=1 -timeout $(TIMEOUT) ./...; \
	else echo "386: this kernel cannot run 32-bit binaries: vetting the 32-bit build and its tests only"; \
		GOARCH=386 $(GO) vet ./...; fi
can386:
	@d=$$(mktemp -d); printf 'package main\nfunc main() {}\n' > $$d/p.go; \
	GOARCH=386 $(GO) build -o $$d/p $$d/p.go && $$d/p; rc=$$?; rm -rf $$d; exit $$rc

# The other systems and the 32-bit build, compiled and vetted side by side
# (make test runs them in its vet lane).
cross:
	$(MAKE) --no-print-directory -j4 386 cross-darwin cross-windows cross-freebsd
cross-darwin:
	GOOS=darwin  GOARCH=arm64 $(GO) vet ./...
cross-windows:
	GOOS=windows GOARCH=amd64 $(GO) vet ./...
cross-freebsd:
	GOOS=freebsd GOARCH=amd64 $(GO) vet ./...
cross-386:
	GOARCH=386 $(GO) vet ./...

# The nested modules build against this checkout of the core module through
# go.work (workspace mode: one module graph for the three, so etcd is built
# with prom's newer Prometheus client, for example; go.work replaces the
# root's release version, which the nested go.mod files require, with ./).
# Their go.mod files have no replace: make release-check builds them as a
# user gets them.
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

# The nested modules as a user requires them: a file-system module proxy
# serving the working tree's three modules at the version etcd/go.mod and
# prom/go.mod name for the root, and an outside module built and run
# against it with GOWORK=off, GOFLAGS=-mod=mod and no replace
# (.ci/release-check; docs/release.md says how a release is tagged).
release-check:
	GO=$(GO) bash .ci/release-check

# The benchmarks of docs/benchmarks.md: medians of COUNT runs, ratios and the
# issue targets; raw output and summary in bench-out/ (about 5 minutes).
COUNT ?= 3
bench:
	GO=$(GO) COUNT=$(COUNT) OUT=bench-out bash docs/bench.sh
	$(MAKE) --no-print-directory bench-lang

# Uncontended acquire+release from Python and from C against flock in the
# same language (capi/bench; docs/benchmarks.md, "Other languages").
bench-lang: lib
	COUNT=$(COUNT) OUT=bench-out LIBDIR=$(LIBDIR) bash capi/bench/bench-lang.sh

clean:
	rm -rf bench-out shmlocks $(LIBDIR)
