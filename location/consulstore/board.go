package consulstore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/roamactors/roam/location"
)

var _ location.Board = (*Store)(nil)

// A note is kept under <prefix>/note/<escaped mesh>/<escaped rid>/<name>
// (a note name needs no escaping: location.NoteKey.Validate) in a small
// JSON envelope, readable with `consul kv get`:
//
//	{"seq":N,"value":<the note, when it is JSON>}
//	{"seq":N,"base64":"<the note, when it is not>"}
//
// seq is the expected version + 1, as a record's write_seq: Consul keeps
// ModifyIndex for a write of identical bytes, and every accepted note
// write must be a new version. The value is spliced in as written, so it
// reads back byte for byte; JSON with surrounding whitespace would lose
// it in the envelope and goes as base64.

func (s *Store) notePrefix(mesh string) string {
	if mesh == "" {
		return s.prefix + "/note/"
	}
	return s.prefix + "/note/" + escapeID(mesh) + "/"
}

func (s *Store) noteKey(k location.NoteKey) string {
	return s.notePrefix(k.Mesh) + escapeID(k.NodeRid) + "/" + k.Name
}

// noteKeyOf is the NoteKey of a Consul key under notePrefix("").
func (s *Store) noteKeyOf(key string) (location.NoteKey, error) {
	parts := strings.Split(strings.TrimPrefix(key, s.notePrefix("")), "/")
	if len(parts) != 3 {
		return location.NoteKey{}, fmt.Errorf("%w: key %s is not a note key", location.ErrInvalid, key)
	}
	mesh, err := unescapeID(parts[0])
	if err != nil {
		return location.NoteKey{}, fmt.Errorf("%w: key %s: %w", location.ErrInvalid, key, err)
	}
	rid, err := unescapeID(parts[1])
	if err != nil {
		return location.NoteKey{}, fmt.Errorf("%w: key %s: %w", location.ErrInvalid, key, err)
	}
	return location.NoteKey{Mesh: mesh, NodeRid: rid, Name: parts[2]}, nil
}

func encodeNote(seq uint64, value []byte) []byte {
	if len(value) > 0 && json.Valid(value) && len(bytes.TrimSpace(value)) == len(value) {
		return fmt.Appendf(nil, `{"seq":%d,"value":%s}`, seq, value)
	}
	b64, _ := json.Marshal(value) // a []byte is a base64 string; it cannot fail
	return fmt.Appendf(nil, `{"seq":%d,"base64":%s}`, seq, b64)
}

// noteEnvelope decodes what encodeNote wrote. A json.RawMessage keeps the
// value's bytes exactly as stored.
type noteEnvelope struct {
	Seq    uint64          `json:"seq"`
	Value  json.RawMessage `json:"value"`
	Base64 []byte          `json:"base64"`
}

func (s *Store) note(key location.NoteKey, pair *api.KVPair) (location.Note, error) {
	if pair == nil || pair.ModifyIndex == 0 {
		return location.Note{Key: key}, nil
	}
	var env noteEnvelope
	if err := json.Unmarshal(pair.Value, &env); err != nil || env.Seq == 0 {
		return location.Note{}, fmt.Errorf("%w: key %s holds no note: %v", location.ErrInvalid, pair.Key, err)
	}
	value := []byte(env.Value)
	if value == nil {
		value = env.Base64
	}
	return location.Note{Key: key, Value: value, Version: location.StoreVersion(pair.ModifyIndex)}, nil
}

// ReadNote implements location.Board.
func (s *Store) ReadNote(ctx context.Context, key location.NoteKey) (location.Note, error) {
	if err := key.Validate(); err != nil {
		return location.Note{}, err
	}
	pair, err := s.get(ctx, s.noteKey(key))
	if err != nil {
		return location.Note{}, classify("read "+key.String(), err, false)
	}
	n, err := s.note(key, pair)
	if err != nil {
		return n, err
	}
	if n.Version == 0 {
		return location.Note{}, fmt.Errorf("%w: %s", location.ErrNotFound, key)
	}
	return n, nil
}

// WriteNote implements location.Board.
func (s *Store) WriteNote(ctx context.Context, key location.NoteKey, expected location.StoreVersion, value []byte) (location.StoreVersion, error) {
	if err := location.ValidateNote(key, value); err != nil {
		return 0, err
	}
	what := "write " + key.String()
	k := s.noteKey(key)
	resp, failed, err := s.writeTxn(ctx, what, api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: k, Value: encodeNote(uint64(expected)+1, value), Index: uint64(expected)}},
	})
	if err != nil {
		return 0, err
	}
	if failed != nil {
		return 0, &location.ConflictError{Op: what, FailedOps: failed}
	}
	if len(resp.Results) == 1 && resp.Results[0].KV != nil && resp.Results[0].KV.Key == k {
		return location.StoreVersion(resp.Results[0].KV.ModifyIndex), nil
	}
	return 0, fmt.Errorf("%w: %s: no result for %s", location.ErrIndeterminate, what, k)
}

// DeleteNote implements location.Board. Consul's delete-cas of a missing
// key succeeds, as the contract wants.
func (s *Store) DeleteNote(ctx context.Context, key location.NoteKey, expected location.StoreVersion) error {
	if err := key.Validate(); err != nil {
		return err
	}
	what := "delete " + key.String()
	op := &api.KVTxnOp{Verb: api.KVDelete, Key: s.noteKey(key)}
	if expected != 0 {
		op.Verb, op.Index = api.KVDeleteCAS, uint64(expected)
	}
	_, failed, err := s.writeTxn(ctx, what, api.TxnOps{{KV: op}})
	if err != nil {
		return err
	}
	if failed != nil {
		return &location.ConflictError{Op: what, FailedOps: failed}
	}
	return nil
}

// WatchNote implements location.Board with Consul blocking queries, as
// Watch.
func (s *Store) WatchNote(ctx context.Context, key location.NoteKey, after location.StoreVersion) (location.Note, error) {
	if err := key.Validate(); err != nil {
		return location.Note{}, err
	}
	k := s.noteKey(key)
	var wait uint64
	for {
		var pair *api.KVPair
		var meta *api.QueryMeta
		err := s.on(ctx, blockingCall, func(ctx context.Context, c *api.Client) (err error) {
			q := s.consistent(ctx)
			q.WaitIndex = wait
			q.WaitTime = 5 * time.Minute
			pair, meta, err = c.KV().Get(k, q)
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return location.Note{}, fmt.Errorf("%w: watch %s: %w", location.ErrUnavailable, key, ctx.Err())
			}
			return location.Note{}, classify("watch "+key.String(), err, false)
		}
		n, err := s.note(key, pair)
		if err != nil {
			return n, err
		}
		if n.Version != after {
			return n, nil
		}
		// Consul's index can go backwards (snapshot restore): start over.
		if meta.LastIndex < wait {
			wait = 0
		} else {
			wait = meta.LastIndex
		}
	}
}

// ListNotes implements location.Board.
func (s *Store) ListNotes(ctx context.Context, mesh string) ([]location.Note, error) {
	if mesh != "" {
		if err := location.ValidateID("mesh", mesh); err != nil {
			return nil, err
		}
	}
	var pairs api.KVPairs
	var meta *api.QueryMeta
	err := s.on(ctx, readCall, func(ctx context.Context, c *api.Client) (err error) {
		pairs, meta, err = c.KV().List(s.notePrefix(mesh), s.consistent(ctx))
		return err
	})
	if err != nil {
		return nil, classify("list notes", err, false)
	}
	if err := filtered("list notes", meta); err != nil {
		return nil, err
	}
	out := make([]location.Note, 0, len(pairs))
	for _, p := range pairs {
		key, err := s.noteKeyOf(p.Key)
		if err != nil {
			return nil, err
		}
		n, err := s.note(key, p)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	// Consul lists in escaped-key order, which is not the IDs' order.
	location.SortNotes(out)
	return out, nil
}
