package futex

import (
	"errors"
	"unsafe"
)

// ErrInvalidAddr is returned by Wait and Wake when addr is nil or not 4-byte
// aligned. Errors from the futex system call itself are returned wrapped, so
// errors.Is(err, unix.EFAULT) and similar work; their messages also start with
// "futex: ".
var ErrInvalidAddr = errors.New("futex: address is nil or not 4-byte aligned")

// checkAddr validates addr identically for both implementations.
func checkAddr(addr *uint32) error {
	if addr == nil || uintptr(unsafe.Pointer(addr))%4 != 0 {
		return ErrInvalidAddr
	}
	return nil
}
