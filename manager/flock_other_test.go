//go:build !unix

package manager

import (
	"errors"
	"os"
)

func flockExclusive(*os.File) error { return errors.New("flock not supported") }
