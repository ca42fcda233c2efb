//go:build linux && cgo

package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"time"
	"unicode/utf8"

	"github.com/shmlocks/shmlocks/manager"
)

// queryInfo is one held lock or pending request in shmlocks_query's JSON:
// the Web Locks query fields, a holder's fencing token (as shmlocks dump
// --json gives it) and, for a name that is not valid UTF-8 (which JSON
// cannot carry exactly), the name's bytes in base64.
type queryInfo struct {
	Name       string       `json:"name"`
	NameBase64 string       `json:"nameBase64,omitempty"`
	Mode       manager.Mode `json:"mode"`
	ClientID   string       `json:"clientId"`
	PID        int          `json:"pid"`
	Token      uint64       `json:"token,omitempty"`
}

type queryResult struct {
	Held    []queryInfo `json:"held"`
	Pending []queryInfo `json:"pending"`
}

// queryTimeout bounds a query: it waits for no lock, only for the table's
// bucket latches, held for microseconds by live processes.
const queryTimeout = 10 * time.Second

func queryJSON(m *manager.Manager) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	snap, err := m.Query(ctx)
	if err != nil {
		return nil, err
	}
	// Tokens come from each held name's State, read just after: a holder
	// that changed in between has no token in the result.
	tokens := map[string]map[string]uint64{} // name -> clientID+mode -> token
	res := queryResult{Held: make([]queryInfo, 0, len(snap.Held)), Pending: make([]queryInfo, 0, len(snap.Pending))}
	for _, h := range snap.Held {
		byHolder, ok := tokens[h.Name]
		if !ok {
			byHolder = map[string]uint64{}
			if st, err := m.State(ctx, h.Name); err == nil {
				for _, r := range st.Held {
					byHolder[r.ClientID+"/"+r.Mode.String()] = r.Token
				}
			}
			tokens[h.Name] = byHolder
		}
		qi := info(h)
		qi.Token = byHolder[h.ClientID+"/"+h.Mode.String()]
		res.Held = append(res.Held, qi)
	}
	for _, p := range snap.Pending {
		res.Pending = append(res.Pending, info(p))
	}
	return json.Marshal(res)
}

func info(l manager.LockInfo) queryInfo {
	qi := queryInfo{Name: l.Name, Mode: l.Mode, ClientID: l.ClientID, PID: l.PID}
	if !utf8.ValidString(l.Name) {
		qi.NameBase64 = base64.StdEncoding.EncodeToString([]byte(l.Name))
	}
	return qi
}
