//go:build !linux

package table

// selfNS: namespaces are a Linux notion; 0 is unknown.
var selfNS namespaces

type namespaces struct{ pid, net uint64 }
