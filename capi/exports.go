//go:build linux && cgo

package main

/*
#include <stdlib.h>
#include "shmlocks.h"
*/
import "C"

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"time"
	"unsafe"

	"github.com/shmlocks/shmlocks/manager"
)

// The Go half of every function of shmlocks.h (shim.c calls these after
// its fork check). Each recovers its panics (guard) and validates every
// pointer and handle before use.

// openOptions is options_json of shmlocks_open.
type openOptions struct {
	MaxResources int               `json:"maxResources"`
	MaxRequests  int               `json:"maxRequests"`
	MaxAgents    int               `json:"maxAgents"`
	MaxNameLen   int               `json:"maxNameLen"`
	FileMode     uint32            `json:"fileMode"`
	Fairness     *manager.Fairness `json:"fairness"`
}

func parseOptions(s *C.char) (*manager.OpenOptions, *apiError) {
	if s == nil {
		return nil, nil
	}
	var o openOptions
	dec := json.NewDecoder(bytes.NewReader([]byte(C.GoString(s))))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return nil, errf(codeInvalid, "shmlocks: options_json: %v", err)
	}
	if o.FileMode&^0o777 != 0 {
		return nil, errf(codeInvalid, "shmlocks: options_json: fileMode %#o has bits beyond 0777", o.FileMode)
	}
	opts := &manager.OpenOptions{MaxResources: o.MaxResources, MaxRequests: o.MaxRequests,
		MaxAgents: o.MaxAgents, MaxNameLen: o.MaxNameLen, FileMode: os.FileMode(o.FileMode)}
	if o.Fairness != nil {
		opts.Fairness = *o.Fairness
	}
	return opts, nil
}

//export shmlocksgo_open
func shmlocksgo_open(path, optionsJSON *C.char, out *C.uint64_t, e *C.shmlocks_error) (rc C.int) {
	defer guard(e, &rc)
	if out == nil {
		return errf(codeInvalid, "shmlocks: open: table (the output) is NULL").put(e)
	}
	p := manager.DefaultPath()
	if path != nil {
		p = C.GoString(path)
	}
	opts, aerr := parseOptions(optionsJSON)
	if aerr != nil {
		return aerr.put(e)
	}
	m, err := manager.Open(p, opts)
	if err != nil {
		return fromGo(err).put(e)
	}
	noteTable(m.Path())
	st, err := m.Stats()
	if err != nil {
		m.Close()
		return fromGo(err).put(e)
	}
	h := newHandle(kindTable)
	registry.mu.Lock()
	registry.tables[h] = &tableEntry{m: m, maxNameLen: st.Geometry.MaxNameLen}
	registry.mu.Unlock()
	*out = C.uint64_t(h)
	return codeOK
}

//export shmlocksgo_close
func shmlocksgo_close(table C.uint64_t, e *C.shmlocks_error) (rc C.int) {
	defer guard(e, &rc)
	registry.mu.Lock()
	t := registry.tables[uint64(table)]
	_, closed := registry.closed[uint64(table)]
	if t != nil {
		delete(registry.tables, uint64(table))
		registry.closed[uint64(table)] = struct{}{}
	}
	registry.mu.Unlock()
	if closed {
		return errf(codeClosed, "shmlocks: table handle %#x was closed already", uint64(table)).put(e)
	}
	if t == nil {
		return badHandle(uint64(table), kindTable).put(e)
	}
	// The lock handles of the table stay until released: their lost
	// descriptors become readable now, and their release says ErrClosed.
	return fromGo(t.m.Close()).put(e)
}

//export shmlocksgo_cancel_new
func shmlocksgo_cancel_new(out *C.uint64_t, e *C.shmlocks_error) (rc C.int) {
	defer guard(e, &rc)
	if out == nil {
		return errf(codeInvalid, "shmlocks: cancel_new: cancel (the output) is NULL").put(e)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := newHandle(kindCancel)
	registry.mu.Lock()
	registry.cancels[h] = &cancelEntry{ctx, cancel}
	registry.mu.Unlock()
	*out = C.uint64_t(h)
	return codeOK
}

//export shmlocksgo_cancel
func shmlocksgo_cancel(h C.uint64_t, e *C.shmlocks_error) (rc C.int) {
	defer guard(e, &rc)
	c, aerr := getCancel(uint64(h))
	if aerr != nil {
		return aerr.put(e)
	}
	c.cancel()
	return codeOK
}

//export shmlocksgo_cancel_free
func shmlocksgo_cancel_free(h C.uint64_t, e *C.shmlocks_error) (rc C.int) {
	defer guard(e, &rc)
	registry.mu.Lock()
	c := registry.cancels[uint64(h)]
	delete(registry.cancels, uint64(h))
	registry.mu.Unlock()
	if c == nil {
		return badHandle(uint64(h), kindCancel).put(e)
	}
	c.cancel()
	return codeOK
}

const (
	flagShared      = C.SHMLOCKS_SHARED
	flagIfAvailable = C.SHMLOCKS_IF_AVAILABLE
	flagSteal       = C.SHMLOCKS_STEAL
	flagsKnown      = flagShared | flagIfAvailable | flagSteal
)

//export shmlocksgo_request
func shmlocksgo_request(table C.uint64_t, name *C.char, nameLen C.size_t, flags C.uint32_t, timeoutMS C.int64_t,
	cancel C.uint64_t, lock *C.uint64_t, token *C.uint64_t, e *C.shmlocks_error) (rc C.int) {
	defer guard(e, &rc)
	t, aerr := getTable(uint64(table))
	if aerr != nil {
		return aerr.put(e)
	}
	switch {
	case lock == nil || token == nil:
		return errf(codeInvalid, "shmlocks: request: lock or token (the outputs) is NULL").put(e)
	case name == nil && nameLen > 0:
		return errf(codeInvalid, "shmlocks: request: name is NULL with name_len %d", uint64(nameLen)).put(e)
	case flags&^flagsKnown != 0:
		return errf(codeInvalid, "shmlocks: request: flags %#x has unknown bits %#x", uint32(flags), uint32(flags&^flagsKnown)).put(e)
	case uint64(nameLen) > uint64(t.maxNameLen):
		// Refused before the bytes are read: a wrong length must not make
		// us read far past the caller's buffer.
		return errf(codeNotSupported, "shmlocks: request: name of %d bytes is longer than the table's MaxNameLen (%d)",
			uint64(nameLen), t.maxNameLen).put(e)
	}
	n := ""
	if nameLen > 0 {
		n = C.GoStringN(name, C.int(nameLen))
	}
	ctx := context.Background()
	if cancel != 0 {
		c, aerr := getCancel(uint64(cancel))
		if aerr != nil {
			return aerr.put(e)
		}
		ctx = c.ctx
	}
	if timeoutMS >= 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(ctx, time.Duration(timeoutMS)*time.Millisecond)
		defer stop()
	}
	opts := manager.RequestOptions{IfAvailable: flags&flagIfAvailable != 0, Steal: flags&flagSteal != 0}
	if flags&flagShared != 0 {
		opts.Mode = manager.Shared
	}
	l, err := t.m.Acquire(ctx, n, opts)
	if err != nil {
		return fromGo(err).put(e)
	}
	h := newHandle(kindLock)
	registry.mu.Lock()
	registry.locks[h] = &lockEntry{l: l, table: uint64(table)}
	registry.mu.Unlock()
	*lock, *token = C.uint64_t(h), C.uint64_t(l.Token())
	return codeOK
}

//export shmlocksgo_release
func shmlocksgo_release(lock C.uint64_t, e *C.shmlocks_error) (rc C.int) {
	defer guard(e, &rc)
	registry.mu.Lock()
	le := registry.locks[uint64(lock)]
	delete(registry.locks, uint64(lock))
	registry.mu.Unlock()
	if le == nil {
		return badHandle(uint64(lock), kindLock).put(e)
	}
	err := le.l.Release()
	if err != nil && !errors.Is(err, manager.ErrStolen) && !errors.Is(err, manager.ErrClosed) &&
		!errors.Is(err, manager.ErrReleased) {
		// The table could not be updated (a latch held too long, say):
		// the lock is still held, and the handle stays for a retry.
		registry.mu.Lock()
		registry.locks[uint64(lock)] = le
		registry.mu.Unlock()
		return fromGo(err).put(e)
	}
	if le.watch != nil {
		le.watch.stop()
	}
	return fromGo(err).put(e)
}

//export shmlocksgo_lost
func shmlocksgo_lost(lock C.uint64_t, lost *C.int, e *C.shmlocks_error) (rc C.int) {
	defer guard(e, &rc)
	le, aerr := getLock(uint64(lock))
	if aerr != nil {
		return aerr.put(e)
	}
	if lost == nil {
		return errf(codeInvalid, "shmlocks: lost: lost (the output) is NULL").put(e)
	}
	select {
	case <-le.l.Lost():
		*lost = 1
	default:
		*lost = 0
	}
	return codeOK
}

//export shmlocksgo_lost_fd
func shmlocksgo_lost_fd(lock C.uint64_t, fd *C.int, e *C.shmlocks_error) (rc C.int) {
	defer guard(e, &rc)
	if fd == nil {
		return errf(codeInvalid, "shmlocks: lost_fd: fd (the output) is NULL").put(e)
	}
	n, aerr := lostFD(uint64(lock))
	if aerr != nil {
		return aerr.put(e)
	}
	*fd = C.int(n)
	return codeOK
}

//export shmlocksgo_query
func shmlocksgo_query(table C.uint64_t, out **C.char, outLen *C.size_t, e *C.shmlocks_error) (rc C.int) {
	defer guard(e, &rc)
	t, aerr := getTable(uint64(table))
	if aerr != nil {
		return aerr.put(e)
	}
	if out == nil {
		return errf(codeInvalid, "shmlocks: query: json (the output) is NULL").put(e)
	}
	b, err := queryJSON(t.m)
	if err != nil {
		return fromGo(err).put(e)
	}
	*out = cString(b)
	if outLen != nil {
		*outLen = C.size_t(len(b))
	}
	return codeOK
}

//export shmlocksgo_client_id
func shmlocksgo_client_id(table C.uint64_t, out **C.char, e *C.shmlocks_error) (rc C.int) {
	defer guard(e, &rc)
	t, aerr := getTable(uint64(table))
	if aerr != nil {
		return aerr.put(e)
	}
	if out == nil {
		return errf(codeInvalid, "shmlocks: client_id: id (the output) is NULL").put(e)
	}
	*out = cString([]byte(t.m.ClientID()))
	return codeOK
}

// cString copies b into C memory with a NUL after it (freed by shmlocks_free).
func cString(b []byte) *C.char {
	p := C.malloc(C.size_t(len(b) + 1))
	buf := unsafe.Slice((*byte)(p), len(b)+1)
	copy(buf, b)
	buf[len(b)] = 0
	return (*C.char)(p)
}

func main() {}
