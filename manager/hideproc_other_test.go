//go:build !linux

package manager_test

import "errors"

// hideProc: mount namespaces are a Linux notion.
func hideProc() error { return errors.New("no mount namespaces here") }

func becomeUser(string) error { return errors.New("not supported here") }
