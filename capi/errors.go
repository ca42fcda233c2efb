//go:build linux && cgo

package main

/*
#include "shmlocks.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"unsafe"

	"github.com/shmlocks/shmlocks/manager"
)

// The error codes of shmlocks.h.
const (
	codeOK           = C.SHMLOCKS_OK
	codeNotSupported = C.SHMLOCKS_ERR_NOT_SUPPORTED
	codeAborted      = C.SHMLOCKS_ERR_ABORTED
	codeTimeout      = C.SHMLOCKS_ERR_TIMEOUT
	codeNotAvailable = C.SHMLOCKS_ERR_NOT_AVAILABLE
	codeStolen       = C.SHMLOCKS_ERR_STOLEN
	codeClosed       = C.SHMLOCKS_ERR_CLOSED
	codeTableFull    = C.SHMLOCKS_ERR_TABLE_FULL
	codeCorrupt      = C.SHMLOCKS_ERR_CORRUPT
	codeUnsafe       = C.SHMLOCKS_ERR_UNSAFE
	codeDeadlock     = C.SHMLOCKS_ERR_DEADLOCK
	codeBadHandle    = C.SHMLOCKS_ERR_BAD_HANDLE
	codeInvalid      = C.SHMLOCKS_ERR_INVALID
	codeOpen         = C.SHMLOCKS_ERR_OPEN
	codeInternal     = C.SHMLOCKS_ERR_INTERNAL
)

// apiError is an error on its way to the caller: a code of shmlocks.h and
// the message. nil is success.
type apiError struct {
	code C.int
	msg  string
}

func errf(code C.int, format string, args ...any) *apiError {
	return &apiError{code, fmt.Sprintf(format, args...)}
}

// fromGo maps an error of package manager to its code; the message is the
// error's own, which names the name, limit or field.
func fromGo(err error) *apiError {
	if err == nil {
		return nil
	}
	code := C.int(codeInternal)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		code = codeTimeout
	case errors.Is(err, manager.ErrAborted):
		code = codeAborted
	case errors.Is(err, manager.ErrNotAvailable):
		code = codeNotAvailable
	case errors.Is(err, manager.ErrStolen):
		code = codeStolen
	case errors.Is(err, manager.ErrClosed):
		code = codeClosed
	case errors.Is(err, manager.ErrNotSupported):
		code = codeNotSupported
	case errors.Is(err, manager.ErrTableFull):
		code = codeTableFull
	case errors.Is(err, manager.ErrCorrupt):
		code = codeCorrupt
	case errors.Is(err, manager.ErrUnsafeTable):
		code = codeUnsafe
	case errors.Is(err, manager.ErrDeadlock):
		code = codeDeadlock
	case errors.Is(err, manager.ErrReleased):
		code = codeBadHandle
	case errors.As(err, new(*fs.PathError)):
		code = codeOpen
	}
	return &apiError{code, err.Error()}
}

// put writes e into the caller's shmlocks_error (when not NULL) and returns
// its code.
func (e *apiError) put(out *C.shmlocks_error) C.int {
	if e == nil {
		return codeOK
	}
	if out != nil {
		out.code = C.int32_t(e.code)
		buf := unsafe.Slice((*byte)(unsafe.Pointer(&out.message[0])), len(out.message))
		n := copy(buf[:len(buf)-1], e.msg)
		buf[n] = 0
	}
	return e.code
}

// guard turns a panic of an exported function into SHMLOCKS_ERR_INTERNAL:
// a panic that escapes into C aborts the host process.
func guard(out *C.shmlocks_error, rc *C.int) {
	if r := recover(); r != nil {
		*rc = errf(codeInternal, "shmlocks: internal error (please report): %v", r).put(out)
	}
}
