package main

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/stress"
	"go.etcd.io/etcd/server/v3/embed"
)

func TestMain(m *testing.M) {
	register()
	if stress.IsWorker() {
		os.Exit(stress.WorkerMain(os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// startEtcd starts a single-member embedded etcd on loopback.
func startEtcd(t *testing.T) string {
	t.Helper()
	var ports []int
	for i := 0; i < 2; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
		l.Close()
	}
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	cu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", ports[0]))
	pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", ports[1]))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "error"
	return startWith(t, cfg, cu.String())
}

func startWith(t *testing.T, cfg *embed.Config, ep string) string {
	t.Helper()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd not ready in 30s")
	}
	return ep
}

// TestStressOnEtcd runs the stress workload (steals, IfAvailable, timeouts,
// shared requests) and its checkers on embedded etcd, and then a run whose
// workers break nothing but are SIGKILLed: their locks go with their leases.
func TestStressOnEtcd(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ep := startEtcd(t)
	for _, c := range []struct {
		name string
		args []string
	}{
		{"plain", []string{"--procs", "3", "--duration", "3s", "--steal", "0.05"}},
		{"chaos", []string{"--procs", "3", "--duration", "4s", "--chaos", "0.5", "--ttl", "1s"}},
		{"coalesce", []string{"--procs", "4", "--duration", "2s", "--features", "plain,coalesce"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "chaos" && testing.Short() {
				t.Skip("lease expiries take seconds")
			}
			var out, errb bytes.Buffer
			args := append([]string{"--endpoints", ep, "--names", "3", "--seed", "7"}, c.args...)
			code := run(args, []string{exe}, &out, &errb)
			t.Logf("%s\n%s", out.String(), errb.String())
			if code != 0 {
				t.Fatalf("exit %d", code)
			}
			if !strings.Contains(out.String(), "etcd") {
				t.Fatalf("report does not name the backend:\n%s", out.String())
			}
			if c.name == "coalesce" && !strings.Contains(out.String(), "results followed") {
				t.Fatalf("report has no coalesce row:\n%s", out.String())
			}
		})
	}
}

// TestStressFaults runs the workload and its checkers on an embedded
// 3-member cluster while the leader is killed, a follower is killed, every
// client is cut off for a moment and the cluster is compacted, in turn
// (shmlocks-etcd stress --embedded 3 --faults all): no double grant, no
// token out of order, no waiter stuck on a free name (a leaked key), no
// unexpected error, and the bucket empty at the end.
func TestStressFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-member cluster and 8 s of faults")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	args := []string{"stress", "--embedded", "3", "--faults", "all", "--fault-every", "700ms", "--duration", "8s",
		"--procs", "3", "--names", "3", "--steal", "0.05", "--seed", "11"}
	code := dispatch(args, []string{exe}, &out, &errb)
	t.Logf("%s", out.String())
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, tail(errb.String(), 4000))
	}
	for _, k := range faultKinds {
		if !strings.Contains(out.String(), k+" ") {
			t.Errorf("no %s fault injected", k)
		}
	}
	if strings.Contains(out.String(), "could not inject") {
		t.Error("a fault could not be injected")
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
