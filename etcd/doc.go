// Package etcd runs the shmlocks manager API (W3C Web Locks semantics) on an
// etcd cluster, so that processes on several machines share one bucket. A
// program written against package manager switches from the table file by
// changing how it opens its Manager:
//
//	m, err := etcd.Open(ctx, cli, "/myapp/locks", nil) // instead of manager.Open(path, nil)
//
// Every request is one key under prefix/<escaped name>/, queued by its
// create revision and attached to the Manager's lease (Options.TTL):
//
//	Acquire ─▶ txn{put key; get name's keys} ─┬─▶ nothing conflicting ahead: held (token = create revision)
//	                                          └─▶ watch the last conflicting key ahead for its deletion,
//	                                              read the queue again, ... (one watcher per key: no herd)
//	IfAvailable ─▶ txn{if no conflicting key (range compares) then put}
//	Steal ─▶ txn{if the holders read are still the holders: delete them, put ours (first), touch marker}
//	Release ─▶ txn{if our key is still ours: delete}    lease lost ─▶ Lost closes, waiters fail
//
// Fencing tokens are create revisions, strictly increasing per name; a
// request granted behind a steal takes a fresh revision above it. A process
// that dies releases its locks when its lease expires, within TTL: this
// and the behaviour under network partitions are the differences from the
// table that cannot be removed (docs/etcd.md). The conformance suite
// manager/managertest runs on both backends.
package etcd
