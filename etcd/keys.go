package etcd

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/shmlocks/shmlocks/manager"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Key layout under prefix P (P ends with no '/'; e is the escaped name):
//
//	P/e/x/<client>-<n>  an exclusive request (value: meta), lease of its Manager
//	P/e/s/<client>-<n>  a shared request
//	P/e/w/<client>-<n>  a WaitUnlocked or Watch call on the name (value: meta),
//	                    lease of its Manager: counted in NameState.Watchers
//	P/e/m               the steal marker: its mod revision is the token of the
//	                    last steal or of the last grant that had to take a
//	                    token above it (no lease: it outlives its writers)
//	P/!a/<client>       a Manager's agent key (value: meta), on its lease: it
//	                    goes in the same revision as the lease's request keys
//	P/!r/<feature>/<k>  a record of a feature's store (coalesce: a flight's
//	                    outcome), no lease (store.go)
//
// No escaped name starts with '!', so P/!a/ never holds a name's keys.
//
// A request's key is created once and never renamed: its create revision is
// its place in the queue and, unless it waited behind a steal, its fencing
// token. Escaping keeps '/' out of e, so P/e/ holds exactly the keys of one
// name and the x/ and s/ sub-ranges can be compared as ranges in one
// transaction (IfAvailable).

// agentDir is the directory of the agent keys under the prefix.
const agentDir = "!a/"

// readNames reads every name's keys under the prefix, in one revision: every
// escaped name starts with one of [%-.0-9A-Z_a-z~], all above '!', so the
// range from P/% to the prefix's end leaves out the package's own
// directories (P/!a/, and P/!r/ whose records may be a MiB each).
func (b *backend) readNames(ctx context.Context) (*clientv3.GetResponse, error) {
	return b.cli.Get(ctx, b.prefix+"%", clientv3.WithRange(clientv3.GetPrefixRangeEnd(b.prefix)))
}

// reserved reports whether the first key component e (after the prefix) is
// not an escaped name but one of the package's own directories.
func reserved(e string) bool { return strings.HasPrefix(e, "!") }

// meta is the value of a request key.
type meta struct {
	Client string `json:"c"`
	PID    int    `json:"p"`
	Steal  bool   `json:"st,omitempty"`
	// Since is when the request was made (Unix nanoseconds, the writer's
	// clock): NameState's Since of a pending request.
	Since int64 `json:"t,omitempty"`
	// Holds are the request keys (under the same prefix) of the grants its
	// task holds while it waits (manager.CarriedHolds): the task edges of
	// the wait-for graph (deadlock.go).
	Holds []string `json:"h,omitempty"`
}

// escapeName keeps [A-Za-z0-9._~-] and writes every other byte as %XX, so
// that an escaped name never holds '/' and decodes byte for byte (NUL and
// invalid UTF-8 included). The empty name is "%", which no escape yields.
func escapeName(name string) string {
	if name == "" {
		return "%"
	}
	var b strings.Builder
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(name); i++ {
		c := name[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '~' || c == '-' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// unescapeName is the inverse of escapeName.
func unescapeName(e string) (string, error) {
	if e == "%" {
		return "", nil
	}
	var b strings.Builder
	for i := 0; i < len(e); i++ {
		if e[i] != '%' {
			b.WriteByte(e[i])
			continue
		}
		if i+2 >= len(e) {
			return "", fmt.Errorf("%w: key name %q: short escape", ErrBadKey, e)
		}
		var v byte
		for _, c := range []byte{e[i+1], e[i+2]} {
			switch {
			case '0' <= c && c <= '9':
				v = v<<4 | (c - '0')
			case 'A' <= c && c <= 'F':
				v = v<<4 | (c - 'A' + 10)
			default:
				return "", fmt.Errorf("%w: key name %q: bad escape", ErrBadKey, e)
			}
		}
		b.WriteByte(v)
		i += 2
	}
	return b.String(), nil
}

// req is one request key as read from etcd.
type req struct {
	key       string
	createRev int64
	modRev    int64
	excl      bool
	meta      meta
}

// nameState is what one read of P/e/ says about a name: its requests in
// queue order and the steal marker's revision (0: none).
type nameState struct {
	reqs     []req
	marker   int64
	watchers int // WaitUnlocked and Watch calls (P/e/w/ keys)
}

// parseName reads the kvs of P/e/ (base is "P/e/").
func parseName(base string, kvs []*mvccpb.KeyValue) (nameState, error) {
	var st nameState
	for _, kv := range kvs {
		rest := strings.TrimPrefix(string(kv.Key), base)
		if rest == "m" {
			st.marker = kv.ModRevision
			continue
		}
		if strings.HasPrefix(rest, "w/") {
			st.watchers++
			continue
		}
		r, err := parseReq(rest, kv)
		if err != nil {
			return st, err
		}
		st.reqs = append(st.reqs, r)
	}
	sortQueue(st.reqs)
	return st, nil
}

// parseReq reads one request key; rest is the key after P/e/.
func parseReq(rest string, kv *mvccpb.KeyValue) (req, error) {
	r := req{key: string(kv.Key), createRev: kv.CreateRevision, modRev: kv.ModRevision}
	switch {
	case strings.HasPrefix(rest, "x/"):
		r.excl = true
	case strings.HasPrefix(rest, "s/"):
	default:
		return r, fmt.Errorf("%w: %q", ErrBadKey, kv.Key)
	}
	if err := json.Unmarshal(kv.Value, &r.meta); err != nil {
		return r, fmt.Errorf("%w: value of %q: %v", ErrBadKey, kv.Key, err)
	}
	return r, nil
}

// sortQueue puts requests in grant order: a steal first (only a granted
// steal can exist: a later steal deletes it), then by create revision.
func sortQueue(rs []req) {
	sort.Slice(rs, func(i, j int) bool {
		if rs[i].meta.Steal != rs[j].meta.Steal {
			return rs[i].meta.Steal
		}
		return rs[i].createRev < rs[j].createRev
	})
}

// grantable reports whether request i of queue rs may hold now (nothing
// conflicting ahead of it) and otherwise which request it waits for: the
// last conflicting one ahead (for an exclusive request, the one just ahead;
// for a shared one, the last exclusive one ahead).
func grantable(rs []req, i int) (bool, *req) {
	if rs[i].excl {
		if i == 0 {
			return true, nil
		}
		return false, &rs[i-1]
	}
	for j := i - 1; j >= 0; j-- {
		if rs[j].excl {
			return false, &rs[j]
		}
	}
	return true, nil
}

// holders returns the requests of rs that hold now.
func holders(rs []req) []req {
	var out []req
	for i := range rs {
		if ok, _ := grantable(rs, i); !ok {
			break
		}
		out = append(out, rs[i])
	}
	return out
}

func modeOf(r req) manager.Mode {
	if r.excl {
		return manager.Exclusive
	}
	return manager.Shared
}
