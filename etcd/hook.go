package etcd

import "sync/atomic"

// hook is a test hook: set only by tests (export nothing), read by the code
// under test from any goroutine, also one that outlives the test.
type hook[F any] struct{ p atomic.Pointer[F] }

func (h *hook[F]) get() F {
	if p := h.p.Load(); p != nil {
		return *p
	}
	var zero F
	return zero
}

func (h *hook[F]) set(f F) { h.p.Store(&f) }
