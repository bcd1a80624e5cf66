package consulstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/hashicorp/consul/api"

	"github.com/roamactors/roam/location"
)

// Roots (docs/PROTOCOL.md §3.5) are up to location.MaxRootBytes, over Consul's
// 512 KiB value and transaction limits (PROTOCOL.md §3.6), so one root is stored
// as parts of at most RootPartBytes and a small manifest:
//
//	<prefix>/root/<escaped key>                       manifest (JSON)
//	<prefix>/root/<escaped key>/part/<sha256 hex>/<n>  part n, n = 0, 1, …
//
// The parts are written first, the manifest last and create-only, in one
// transaction that also checks every part is still at the index its write
// returned. A root is therefore readable only once its manifest exists, and
// a manifest only exists over its complete parts. Parts are addressed by
// the content's SHA-256, so two writers racing with different bytes under
// one key never overwrite each other's parts: the manifest decides which
// of them wins, and the winner's parts are untouched by the loser. Writers
// of identical bytes write identical parts, which Consul does not even
// re-index (PROTOCOL.md §3.6).
//
// GetRoot reads the manifest consistently, then its parts in one read-only
// transaction that checks the manifest is still at the index read, and
// verifies size and SHA-256; a mismatch is an error and no bytes are
// returned. DeleteRoot deletes the manifest first, then the parts.
//
// A PutRoot and a DeleteRoot of the same key must not run concurrently: the
// protocol deletes a root only once nothing points at it. If they do, the
// worst outcome is a root that GetRoot reports as corrupt, never one that
// returns wrong bytes.

// RootPartBytes is the largest part of a stored root: in a transaction it
// is sent base64-encoded, about 342 KiB, under the 512 KiB request limit.
const RootPartBytes = 256 << 10

// rootAttempts bounds the retries when parts or the manifest change under
// a PutRoot or GetRoot (only a concurrent DeleteRoot does that).
const rootAttempts = 3

const rootFormat = "roam.root.v1"

// rootManifest is the manifest's JSON, readable with `consul kv get`.
type rootManifest struct {
	Format    string `json:"format"`
	Key       string `json:"key"`
	Size      uint64 `json:"size"`
	SHA256    string `json:"sha256"`
	Parts     int    `json:"parts"`
	PartBytes int    `json:"part_bytes"`
}

func (s *Store) rootKey(key string) string { return s.prefix + "/root/" + escapeID(key) }

func (s *Store) rootPartKey(key string, sum [sha256.Size]byte, n int) string {
	return s.rootKey(key) + "/part/" + hex.EncodeToString(sum[:]) + "/" + strconv.Itoa(n)
}

func partCount(size uint64) int {
	return int((size + RootPartBytes - 1) / RootPartBytes)
}

func newManifest(ref location.RootRef) rootManifest {
	return rootManifest{
		Format:    rootFormat,
		Key:       ref.Key,
		Size:      ref.Size,
		SHA256:    hex.EncodeToString(ref.SHA256[:]),
		Parts:     partCount(ref.Size),
		PartBytes: RootPartBytes,
	}
}

// ref checks a manifest read from key and returns the reference it holds.
func (m rootManifest) ref(key string) (location.RootRef, error) {
	ref := location.RootRef{Key: key, Size: m.Size}
	sum, err := hex.DecodeString(m.SHA256)
	switch {
	case m.Format != rootFormat:
		err = fmt.Errorf("format %q, want %q", m.Format, rootFormat)
	case m.Key != key:
		err = fmt.Errorf("manifest names key %q", m.Key)
	case err != nil || len(sum) != sha256.Size:
		err = fmt.Errorf("bad sha256 %q", m.SHA256)
	case m.Size > location.MaxRootBytes:
		err = fmt.Errorf("size %d over %d", m.Size, location.MaxRootBytes)
	case m.PartBytes != RootPartBytes || m.Parts != partCount(m.Size):
		err = fmt.Errorf("%d parts of %d bytes for size %d", m.Parts, m.PartBytes, m.Size)
	}
	if err != nil {
		return location.RootRef{}, fmt.Errorf("%w: root %q has a corrupt manifest: %v", location.ErrInvalid, key, err)
	}
	copy(ref.SHA256[:], sum)
	return ref, nil
}

// readManifest reads a root's manifest consistently; a nil manifest means
// the root does not exist.
func (s *Store) readManifest(ctx context.Context, key string) (*rootManifest, location.RootRef, uint64, error) {
	pair, err := s.get(ctx, s.rootKey(key))
	if err != nil {
		return nil, location.RootRef{}, 0, classify(fmt.Sprintf("read root %q", key), err, false)
	}
	if pair == nil || pair.ModifyIndex == 0 {
		return nil, location.RootRef{}, 0, nil
	}
	var m rootManifest
	if err := json.Unmarshal(pair.Value, &m); err != nil {
		return nil, location.RootRef{}, 0, fmt.Errorf("%w: key %s holds no root manifest: %v", location.ErrInvalid, pair.Key, err)
	}
	ref, err := m.ref(key)
	if err != nil {
		return nil, location.RootRef{}, 0, err
	}
	return &m, ref, pair.ModifyIndex, nil
}

// PutRoot implements location.RootStore (PROTOCOL.md §3.5). A failed part
// write is ErrUnavailable (no manifest, so no root: retrying is safe); a
// manifest write whose outcome is unknown is ErrIndeterminate, and a
// retried PutRoot of the same bytes then tells (it returns the reference
// once the root exists).
func (s *Store) PutRoot(ctx context.Context, key string, data []byte) (location.RootRef, error) {
	if err := location.ValidateRoot(key, data); err != nil {
		return location.RootRef{}, err
	}
	what := fmt.Sprintf("put root %q", key)
	ref := location.NewRootRef(key, data)
	manifest, err := json.Marshal(newManifest(ref))
	if err != nil {
		return location.RootRef{}, fmt.Errorf("%w: %s: encode manifest: %w", location.ErrInvalid, what, err)
	}
	create := &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: s.rootKey(key), Value: manifest, Index: 0}}
	if n := partCount(ref.Size); n <= 1 {
		// A root of one part (a cold activation's envelope, a creation
		// request) is written with its manifest in one transaction, without
		// reading first: one round trip on a cold activation's path. A
		// manifest already there rolls it back; the loop below then reads
		// and decides.
		txn := api.TxnOps{create}
		if n == 1 {
			txn = api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVSet, Key: s.rootPartKey(key, ref.SHA256, 0), Value: data}}, create}
		}
		_, failed, err := s.writeTxn(ctx, what, txn)
		if err != nil {
			return location.RootRef{}, err
		}
		if failed == nil {
			return ref, nil
		}
	}
	for attempt := 0; ; attempt++ {
		m, cur, _, err := s.readManifest(ctx, key)
		if err != nil {
			return location.RootRef{}, err
		}
		if m != nil {
			if cur != ref {
				return location.RootRef{}, &location.ConflictError{Op: what + " (other bytes stored)"}
			}
			return ref, nil
		}
		if attempt == rootAttempts {
			return location.RootRef{}, fmt.Errorf("%w: %s: its parts kept changing (a concurrent DeleteRoot?)", location.ErrUnavailable, what)
		}
		txn, err := s.putParts(ctx, what, ref, data)
		if err != nil {
			return location.RootRef{}, err
		}
		txn = append(txn, create)
		_, failed, err := s.writeTxn(ctx, what, txn)
		if err != nil {
			return location.RootRef{}, err
		}
		if failed == nil {
			return ref, nil
		}
		// The manifest exists (another writer won) or a part changed: read
		// again and decide.
	}
}

// putParts writes the parts of a root, one transaction each, and returns
// the checks that they are still as written.
func (s *Store) putParts(ctx context.Context, what string, ref location.RootRef, data []byte) (api.TxnOps, error) {
	n := partCount(ref.Size)
	checks := make(api.TxnOps, 0, n+1)
	for i := 0; i < n; i++ {
		if err := ctxUnavailable(ctx, what); err != nil {
			return nil, err
		}
		k := s.rootPartKey(ref.Key, ref.SHA256, i)
		part := data[i*RootPartBytes : min((i+1)*RootPartBytes, len(data))]
		var resp api.TxnResponse
		err := s.on(ctx, writeCall, func(ctx context.Context, c *api.Client) error {
			_, err := c.Raw().Write("/v1/txn", api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVSet, Key: k, Value: part}}}, &resp, s.writing(ctx))
			return err
		})
		if err != nil {
			// Without a manifest the root does not exist whatever became of
			// this part, so the PutRoot was not applied.
			return nil, classify(fmt.Sprintf("%s: part %d", what, i), err, false)
		}
		if len(resp.Results) != 1 || resp.Results[0].KV == nil || resp.Results[0].KV.ModifyIndex == 0 {
			return nil, fmt.Errorf("%w: %s: part %d: no index in the answer", location.ErrUnavailable, what, i)
		}
		checks = append(checks, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: k, Index: resp.Results[0].KV.ModifyIndex}})
	}
	return checks, nil
}

// GetRoot implements location.RootStore (PROTOCOL.md §3.5). Bytes that do
// not match their manifest are an ErrInvalid error, never returned.
func (s *Store) GetRoot(ctx context.Context, key string) ([]byte, location.RootRef, error) {
	if err := location.ValidateID("root key", key); err != nil {
		return nil, location.RootRef{}, err
	}
	what := fmt.Sprintf("get root %q", key)
	for attempt := 0; attempt < rootAttempts; attempt++ {
		m, ref, index, err := s.readManifest(ctx, key)
		if err != nil {
			return nil, location.RootRef{}, err
		}
		if m == nil {
			return nil, location.RootRef{}, fmt.Errorf("%w: root %q", location.ErrNotFound, key)
		}
		if m.Parts == 0 {
			return s.checkRoot(ref, nil)
		}
		// One snapshot: the manifest still at the index read, and its parts.
		ops := make(api.TxnOps, 0, m.Parts+1)
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: s.rootKey(key), Index: index}})
		for i := 0; i < m.Parts; i++ {
			ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVGetOrEmpty, Key: s.rootPartKey(key, ref.SHA256, i)}})
		}
		var ok bool
		var resp *api.TxnResponse
		err = s.on(ctx, readCall, func(ctx context.Context, c *api.Client) (err error) {
			ok, resp, _, err = c.Txn().Txn(ops, s.consistent(ctx))
			return err
		})
		if err != nil {
			return nil, location.RootRef{}, classify(what, err, false)
		}
		if !ok {
			if denied := deniedOps(resp); denied != "" {
				return nil, location.RootRef{}, fmt.Errorf("%w: %s: consul refused the ACL token: %s", location.ErrPermissionDenied, what, denied)
			}
			// The manifest was deleted (or replaced) since it was read.
			continue
		}
		// Each op answers (a check its key, a get-or-empty its key, present
		// or not); Consul leaves out silently those the token may not read.
		if len(resp.Results) != len(ops) {
			return nil, location.RootRef{}, fmt.Errorf("%w: %s: consul hid %d of %d keys: the ACL token may not read them", location.ErrPermissionDenied, what, len(ops)-len(resp.Results), len(ops))
		}
		parts := make(map[string][]byte, len(resp.Results))
		for _, r := range resp.Results {
			if r.KV != nil && r.KV.ModifyIndex != 0 {
				parts[r.KV.Key] = r.KV.Value
			}
		}
		data := make([]byte, 0, ref.Size)
		for i := 0; i < m.Parts; i++ {
			part, ok := parts[s.rootPartKey(key, ref.SHA256, i)]
			if !ok {
				return nil, location.RootRef{}, fmt.Errorf("%w: root %q is corrupt: part %d of %d is missing", location.ErrInvalid, key, i, m.Parts)
			}
			if want := min(RootPartBytes, int(ref.Size)-i*RootPartBytes); len(part) != want {
				return nil, location.RootRef{}, fmt.Errorf("%w: root %q is corrupt: part %d is %d bytes, want %d", location.ErrInvalid, key, i, len(part), want)
			}
			data = append(data, part...)
		}
		return s.checkRoot(ref, data)
	}
	return nil, location.RootRef{}, fmt.Errorf("%w: %s: the manifest kept changing", location.ErrUnavailable, what)
}

// checkRoot returns data only if it is the content ref names.
func (s *Store) checkRoot(ref location.RootRef, data []byte) ([]byte, location.RootRef, error) {
	got := location.NewRootRef(ref.Key, data)
	if got.Size != ref.Size || !bytes.Equal(got.SHA256[:], ref.SHA256[:]) {
		return nil, location.RootRef{}, fmt.Errorf("%w: root %q is corrupt: %d bytes with sha256 %x, manifest says %d bytes with %x",
			location.ErrInvalid, ref.Key, got.Size, got.SHA256, ref.Size, ref.SHA256)
	}
	if data == nil {
		data = []byte{}
	}
	return data, ref, nil
}

// DeleteRoot implements location.RootStore (PROTOCOL.md §3.5): the manifest
// first, so that no reader sees the root once its parts start going, then
// every part under the root (those of writers that lost or crashed too).
func (s *Store) DeleteRoot(ctx context.Context, key string) error {
	if err := location.ValidateID("root key", key); err != nil {
		return err
	}
	what := fmt.Sprintf("delete root %q", key)
	if err := ctxUnavailable(ctx, what); err != nil {
		return err
	}
	if err := s.on(ctx, writeCall, func(ctx context.Context, c *api.Client) error {
		_, err := c.KV().Delete(s.rootKey(key), s.writing(ctx))
		return err
	}); err != nil {
		return classify(what, err, true)
	}
	// The trailing '/' keeps other roots out: an escaped key has no '/'.
	if err := s.on(ctx, writeCall, func(ctx context.Context, c *api.Client) error {
		_, err := c.KV().DeleteTree(s.rootKey(key)+"/", s.writing(ctx))
		return err
	}); err != nil {
		// The root is gone already; its parts stay until a retry.
		return classify(what+": parts", err, true)
	}
	return nil
}
