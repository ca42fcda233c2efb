package manager

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// Mode is the lock mode of a request.
type Mode int

const (
	Exclusive Mode = iota // the default
	Shared
)

// String returns "exclusive" or "shared".
func (m Mode) String() string {
	switch m {
	case Exclusive:
		return "exclusive"
	case Shared:
		return "shared"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// MarshalJSON encodes the mode as "exclusive" or "shared".
func (m Mode) MarshalJSON() ([]byte, error) {
	if m != Exclusive && m != Shared {
		return nil, fmt.Errorf("%w: mode %d", ErrNotSupported, int(m))
	}
	return json.Marshal(m.String())
}

// UnmarshalJSON accepts "exclusive" or "shared".
func (m *Mode) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	switch s {
	case "exclusive":
		*m = Exclusive
	case "shared":
		*m = Shared
	default:
		return fmt.Errorf("%w: mode %q", ErrNotSupported, s)
	}
	return nil
}
