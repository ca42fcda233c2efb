//go:build linux && cgo

// Command capi is libshmlocks.so, the C ABI of shmlocks (shmlocks.h,
// docs/c-abi.md), built with
//
//	go build -buildmode=c-shared -o lib/libshmlocks.so ./capi
//
// (make lib). It is a thin layer over package manager's public API: integer
// handles for tables, locks and cancel tokens (handles.go), error codes
// with messages (errors.go), the lost descriptor (lostfd.go) and the query
// as JSON (query.go). shim.c holds the exported C functions: each checks
// that it was not called in a forked child before it enters Go.
package main
