package main

import (
	"os"

	"github.com/shmlocks/shmlocks/etcd/internal/embedcluster"
)

// cluster is an embedded etcd cluster on loopback (stress --embedded): its
// members can be killed and restarted, and every client reaches a member
// through a TCP proxy that can be cut, as a network partition (or the death
// of the member's process) cuts its connections (internal/embedcluster,
// shared with the package's tests).
type cluster struct {
	*embedcluster.Cluster
	dir string
}

// startCluster starts n members (10 ms ticks, 100 ms elections, no fsync)
// in a temporary directory, and a proxy in front of each.
func startCluster(n int) (*cluster, error) {
	dir, err := os.MkdirTemp("", "shmlocks-etcd-")
	if err != nil {
		return nil, err
	}
	ec, err := embedcluster.Start(dir, n, embedcluster.Options{Token: "shmlocks-etcd-stress", Proxies: true})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &cluster{Cluster: ec, dir: dir}, nil
}

// stop stops every member and proxy and removes the data.
func (c *cluster) stop() {
	c.Close()
	os.RemoveAll(c.dir)
}
