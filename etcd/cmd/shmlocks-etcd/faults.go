package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Faults injected into an embedded cluster while the stress workload runs
// (stress --embedded N --faults ...), one at a time, each undone before the
// next (so a 3-member cluster never loses its quorum):
//
//	leader   the leader is killed (raft stops at once, its connections drop),
//	         and restarted after --fault-down
//	member   a follower, the same
//	cut      every client is cut off from the cluster for --fault-down (all
//	         proxies cut): calls in flight fail without an answer, releases
//	         and withdrawals are retried
//	compact  the cluster is compacted at its current revision: the watches
//	         of waiting requests and observers start from compacted revisions
//
// A fault must end well within the workers' TTL: no lease may expire, so
// the checkers' rule that only a steal takes a lock away holds. (Faults
// that end leases are in the etcd package's tests.)
var faultKinds = []string{"leader", "member", "cut", "compact"}

type faultRunner struct {
	c     *cluster
	kinds []string
	every time.Duration
	down  time.Duration
	until time.Time // no fault starts after it

	mu     sync.Mutex
	counts map[string]int
	errs   []string
}

func parseFaults(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	if s == "all" {
		return faultKinds, nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		ok := false
		for _, known := range faultKinds {
			ok = ok || k == known
		}
		if !ok {
			return nil, fmt.Errorf("unknown fault %q (known: %s, all)", k, strings.Join(faultKinds, ", "))
		}
		out = append(out, k)
	}
	return out, nil
}

// run injects faults in turn until stop closes or until passes, then
// returns once the cluster is whole again.
func (f *faultRunner) run(stop <-chan struct{}) {
	f.counts = map[string]int{}
	admin, err := clientv3.New(clientv3.Config{Endpoints: f.c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		f.fail("admin client: %v", err)
		return
	}
	defer admin.Close()
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		case <-time.After(f.every):
		}
		if time.Now().Add(f.down + time.Second).After(f.until) {
			return
		}
		k := f.kinds[n%len(f.kinds)]
		if err := f.inject(k, admin); err != nil {
			f.fail("%s: %v", k, err)
			continue
		}
		f.mu.Lock()
		f.counts[k]++
		f.mu.Unlock()
	}
}

func (f *faultRunner) inject(kind string, admin *clientv3.Client) error {
	switch kind {
	case "leader", "member":
		i := f.c.Leader()
		if kind == "member" {
			i = f.c.Follower()
		}
		if i < 0 {
			return fmt.Errorf("no %s to stop", kind)
		}
		f.c.Kill(i)
		time.Sleep(f.down)
		if err := f.c.Restart(i); err != nil {
			return err
		}
		if f.c.WaitLeader(30*time.Second) < 0 {
			return fmt.Errorf("no leader 30s after member %d restarted", i)
		}
	case "cut":
		for _, p := range f.c.Proxies() {
			p.SetCut(true)
		}
		time.Sleep(f.down)
		for _, p := range f.c.Proxies() {
			p.SetCut(false)
		}
	case "compact":
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		g, err := admin.Get(ctx, "/", clientv3.WithCountOnly())
		if err != nil {
			return err
		}
		if _, err := admin.Compact(ctx, g.Header.Revision); err != nil {
			return err
		}
	}
	return nil
}

func (f *faultRunner) fail(format string, args ...any) {
	f.mu.Lock()
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
	f.mu.Unlock()
}

// summary is one line: how many faults of each kind, and the failures to
// inject one.
func (f *faultRunner) summary() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var parts []string
	for k, n := range f.counts {
		parts = append(parts, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(parts)
	s := "faults injected: " + strings.Join(parts, ", ")
	if len(f.errs) > 0 {
		s += "; could not inject: " + strings.Join(f.errs, "; ")
	}
	return s
}
