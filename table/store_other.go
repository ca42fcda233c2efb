//go:build !amd64

package table

import "sync/atomic"

// storeRelease64 is atomic.StoreUint64 where stores may be reordered or a
// 64-bit store torn (store_amd64.go says why amd64 needs no more than a
// plain store).
func storeRelease64(p *uint64, v uint64) { atomic.StoreUint64(p, v) }
