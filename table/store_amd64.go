package table

// storeRelease64 stores v at *p with release order: every store before it
// in program order is visible before it, to a reader that loads *p
// atomically. x86-64 keeps stores in program order and an aligned 8-byte
// MOV is atomic, so a plain store does it, where atomic.StoreUint64 (an
// XCHG, a full barrier) costs a locked instruction: one of about twenty a
// queued grant executes (docs/experiments.md). The compiler keeps stores in
// program order. Use it only where no load after it must be ordered after
// it (no Dekker-style handshake): markHeld, which is followed by a load of
// the park mark, keeps atomic.StoreUint64.
func storeRelease64(p *uint64, v uint64) { *p = v }
