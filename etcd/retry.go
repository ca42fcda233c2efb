package etcd

import (
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// permanent reports whether an etcd call's error will not go away by
// retrying it: a request refused as invalid, not permitted or not
// implemented. Everything else (etcd unreachable, a member stopped, no
// leader, a timeout, too many requests) may: a waiting request retries it
// until its ctx ends or its lease is lost, as it waits for the lock.
func permanent(err error) bool {
	var code codes.Code
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code = ee.Code()
	} else if s, ok := status.FromError(err); ok {
		code = s.Code()
	} else {
		return false
	}
	switch code {
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.FailedPrecondition,
		codes.Unimplemented, codes.OutOfRange:
		return true
	}
	return false
}
