package coalesce

import "errors"

// Errors of Do, besides the manager's (ErrNotSupported, ErrAborted,
// ErrClosed, ErrWouldDeadlock, ErrCorrupt). Test them with errors.Is; the
// wrapped message says which key and limit.
var (
	// ErrLeaderFailed: the leader of the flight, in another process (or
	// through another Manager), published an error; the wrapped message is
	// the leader's error text. (Followers that call through the leader's
	// Manager get its error value itself.)
	ErrLeaderFailed = errors.New("coalesce: leader failed")
	// ErrResultTooLarge: fn returned more than MaxResultSize bytes; the
	// leader and every follower of its flight get it, never a truncation.
	ErrResultTooLarge = errors.New("coalesce: result too large")
)
