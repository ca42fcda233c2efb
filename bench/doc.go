// Package bench holds the benchmarks behind docs/benchmarks.md: the
// uncontended costs of one process, and the hand-offs, contention, waits
// and deaths between processes, each against its baselines (flock(2), a
// futex ping-pong, a ticket lock, a channel). They use the public API of
// package manager, and read the table file itself (package table) where a
// figure needs what the API does not show (a parked waiter, a watch).
//
// Run them with make bench (docs/bench.sh), which prints the medians,
// ratios and targets; one benchmark alone with, for example,
//
//	go test -run '^$' -bench '^BenchmarkHandoff$' -benchtime 1x ./bench
//
// The multi-process benchmarks re-execute the test binary as their
// children (internal/proctest): the loop children (proc_linux_test.go) and
// a holder that dies (death_unix_test.go).
package bench
