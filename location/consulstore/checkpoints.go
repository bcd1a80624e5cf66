package consulstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/roamactors/roam/location"
)

// Checkpoints (location.CheckpointStore) may be up to
// location.MaxCheckpointBytes, far over Consul's 512 KiB value and
// transaction limits, so one is a manifest and, past InlineCheckpointBytes,
// parts written before it:
//
//	<prefix>/checkpoint/<kind>/<escaped id>                 manifest (JSON)
//	<prefix>/checkpoint/<kind>/<escaped id>/part/<write>/<n> part n of one write
//
// A write's parts live under its own random write ID, so no other write
// ever touches them. The manifest is written last, by compare-and-set on
// its ModifyIndex (check-not-exists for expected 0), in one transaction
// that also checks every part is still at the index its write returned:
// the checkpoint changes exactly when that transaction applies, and the
// version is the manifest's ModifyIndex. Only then are the replaced
// write's parts deleted; a losing or failed write deletes its own. A
// reader reads the manifest, then its parts in one read-only transaction
// that checks the manifest is still at the index read, and verifies size
// and SHA-256: it sees a whole checkpoint or reads again, never a torn one.
// The manifest carries its write ID, so even identical bytes written again
// change the version.

// InlineCheckpointBytes is the largest checkpoint kept in its manifest
// (base64 in JSON, then base64 again in a transaction: about 230 KiB
// on the wire); a larger one is stored in parts of RootPartBytes.
const InlineCheckpointBytes = 128 << 10

// checkpointAttempts bounds the re-reads of a GetCheckpoint whose manifest
// changed between its two reads.
const checkpointAttempts = 8

const checkpointFormat = "roam.checkpoint.v1"

// partsDeleteTimeout bounds the best-effort removal of a replaced or lost
// write's parts.
const partsDeleteTimeout = 10 * time.Second

type checkpointManifest struct {
	Format    string `json:"format"`
	Kind      string `json:"kind"`
	ID        string `json:"id"`
	Write     string `json:"write"`
	Size      int    `json:"size"`
	SHA256    string `json:"sha256"`
	Parts     int    `json:"parts"`
	PartBytes int    `json:"part_bytes,omitempty"`
	Inline    []byte `json:"inline,omitempty"`
}

func (s *Store) checkpointKey(k location.AuthorityKey) string {
	return s.prefix + "/checkpoint/" + location.KindName(k.Kind) + "/" + escapeID(k.ID)
}

func (s *Store) checkpointParts(k location.AuthorityKey, write string) string {
	return s.checkpointKey(k) + "/part/" + write + "/"
}

// readCheckpointManifest reads key's manifest consistently: nil if none.
func (s *Store) readCheckpointManifest(ctx context.Context, key location.AuthorityKey) (*checkpointManifest, uint64, error) {
	what := "read checkpoint of " + key.String()
	pair, err := s.get(ctx, s.checkpointKey(key))
	if err != nil {
		return nil, 0, classify(what, err, false)
	}
	if pair == nil || pair.ModifyIndex == 0 {
		return nil, 0, nil
	}
	var m checkpointManifest
	if err := json.Unmarshal(pair.Value, &m); err != nil {
		return nil, 0, fmt.Errorf("%w: %s: key %s holds no checkpoint manifest: %v", location.ErrInvalid, what, pair.Key, err)
	}
	switch {
	case m.Format != checkpointFormat:
		err = fmt.Errorf("format %q, want %q", m.Format, checkpointFormat)
	case m.Kind != location.KindName(key.Kind) || m.ID != key.ID:
		err = fmt.Errorf("manifest names %s/%q", m.Kind, m.ID)
	case m.Size < 0 || m.Size > location.MaxCheckpointBytes:
		err = fmt.Errorf("size %d", m.Size)
	case m.Parts == 0 && len(m.Inline) != m.Size:
		err = fmt.Errorf("inline %d bytes, size %d", len(m.Inline), m.Size)
	case m.Parts > 0 && (m.PartBytes <= 0 || m.Parts != (m.Size+m.PartBytes-1)/m.PartBytes):
		err = fmt.Errorf("%d parts of %d bytes for size %d", m.Parts, m.PartBytes, m.Size)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %s: corrupt manifest: %v", location.ErrInvalid, what, err)
	}
	return &m, pair.ModifyIndex, nil
}

// GetCheckpoint implements location.CheckpointStore.
func (s *Store) GetCheckpoint(ctx context.Context, key location.AuthorityKey) ([]byte, location.StoreVersion, error) {
	if err := key.Validate(); err != nil {
		return nil, 0, err
	}
	what := "read checkpoint of " + key.String()
	for attempt := 0; attempt < checkpointAttempts; attempt++ {
		m, index, err := s.readCheckpointManifest(ctx, key)
		if err != nil {
			return nil, 0, err
		}
		if m == nil {
			return nil, 0, fmt.Errorf("%w: checkpoint of %s", location.ErrNotFound, key)
		}
		data := m.Inline
		if m.Parts > 0 {
			var changed bool
			if data, changed, err = s.readCheckpointParts(ctx, key, m, index); err != nil {
				return nil, 0, err
			}
			if changed {
				continue // replaced or deleted since the manifest was read
			}
		}
		if sum := sha256.Sum256(data); len(data) != m.Size || hex.EncodeToString(sum[:]) != m.SHA256 {
			return nil, 0, fmt.Errorf("%w: %s: %d bytes with sha256 %x, the manifest says %d bytes with %s",
				location.ErrInvalid, what, len(data), sum, m.Size, m.SHA256)
		}
		if data == nil {
			data = []byte{}
		}
		return data, location.StoreVersion(index), nil
	}
	return nil, 0, fmt.Errorf("%w: %s: the checkpoint kept changing", location.ErrUnavailable, what)
}

// readCheckpointParts reads m's parts in one snapshot with the manifest
// still at index; changed: it no longer is.
func (s *Store) readCheckpointParts(ctx context.Context, key location.AuthorityKey, m *checkpointManifest, index uint64) ([]byte, bool, error) {
	what := "read checkpoint of " + key.String()
	parts := s.checkpointParts(key, m.Write)
	// A transaction holds at most 128 ops (docs/CONSUL.md); a checkpoint
	// of 16 MiB has 64 parts.
	ops := make(api.TxnOps, 0, m.Parts+1)
	ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: s.checkpointKey(key), Index: index}})
	for i := 0; i < m.Parts; i++ {
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVGetOrEmpty, Key: parts + strconv.Itoa(i)}})
	}
	var ok bool
	var resp *api.TxnResponse
	err := s.on(ctx, readCall, func(ctx context.Context, c *api.Client) (err error) {
		ok, resp, _, err = c.Txn().Txn(ops, s.consistent(ctx))
		return err
	})
	if err != nil {
		return nil, false, classify(what, err, false)
	}
	if !ok {
		if denied := deniedOps(resp); denied != "" {
			return nil, false, fmt.Errorf("%w: %s: consul refused the ACL token: %s", location.ErrPermissionDenied, what, denied)
		}
		return nil, true, nil
	}
	if len(resp.Results) != len(ops) {
		return nil, false, fmt.Errorf("%w: %s: consul hid %d of %d keys: the ACL token may not read them", location.ErrPermissionDenied, what, len(ops)-len(resp.Results), len(ops))
	}
	got := make(map[string][]byte, m.Parts)
	for _, r := range resp.Results[1:] {
		if r.KV != nil && r.KV.ModifyIndex != 0 {
			got[r.KV.Key] = r.KV.Value
		}
	}
	data := make([]byte, 0, m.Size)
	for i := 0; i < m.Parts; i++ {
		part, ok := got[parts+strconv.Itoa(i)]
		if !ok {
			return nil, false, fmt.Errorf("%w: %s: part %d of %d is missing", location.ErrInvalid, what, i, m.Parts)
		}
		data = append(data, part...)
	}
	return data, false, nil
}

// PutCheckpoint implements location.CheckpointStore. A failed part write
// is ErrUnavailable (the manifest is unchanged, so nothing was applied);
// a manifest write whose outcome is unknown is ErrIndeterminate: a
// consistent read then tells (the version the caller expected, or a
// manifest naming this write).
func (s *Store) PutCheckpoint(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion, data []byte) (location.StoreVersion, error) {
	if err := location.ValidateCheckpoint(key, data); err != nil {
		return 0, err
	}
	what := fmt.Sprintf("put checkpoint of %s at version %d", key, expected)
	var id [12]byte
	_, _ = rand.Read(id[:])
	sum := sha256.Sum256(data)
	m := checkpointManifest{Format: checkpointFormat, Kind: location.KindName(key.Kind), ID: key.ID,
		Write: hex.EncodeToString(id[:]), Size: len(data), SHA256: hex.EncodeToString(sum[:])}
	var txn api.TxnOps
	if len(data) <= InlineCheckpointBytes {
		m.Inline = data
	} else {
		m.PartBytes = RootPartBytes
		m.Parts = (len(data) + RootPartBytes - 1) / RootPartBytes
		checks, err := s.putCheckpointParts(ctx, what, key, m, data)
		if err != nil {
			s.deleteParts(key, m.Write)
			return 0, err
		}
		txn = checks
	}
	manifest, err := json.Marshal(m)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: encode manifest: %w", location.ErrInvalid, what, err)
	}
	manifestKey := s.checkpointKey(key)
	if expected != 0 {
		// The replaced manifest, read in the same transaction just before
		// the swap: its parts go once this write landed.
		txn = append(txn, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVGetOrEmpty, Key: manifestKey}})
	}
	txn = append(txn, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: manifestKey, Value: manifest, Index: uint64(expected)}})
	resp, failed, err := s.writeTxn(ctx, what, txn)
	if err != nil {
		return 0, err // parts of an indeterminate write stay until the next delete: they may be in use
	}
	if failed != nil {
		s.deleteParts(key, m.Write)
		return 0, &location.ConflictError{Op: what, FailedOps: failed}
	}
	var version uint64
	var old checkpointManifest
	for i, r := range resp.Results {
		switch {
		case r.KV == nil || r.KV.Key != manifestKey:
		case i == len(resp.Results)-1:
			version = r.KV.ModifyIndex
		case len(r.KV.Value) > 0:
			_ = json.Unmarshal(r.KV.Value, &old)
		}
	}
	if version == 0 {
		return 0, fmt.Errorf("%w: %s: no index in the answer", location.ErrIndeterminate, what)
	}
	if old.Parts > 0 && old.Write != m.Write {
		s.deleteParts(key, old.Write)
	}
	return location.StoreVersion(version), nil
}

// putCheckpointParts writes m's parts, one transaction each, and returns
// the checks that they are still as written.
func (s *Store) putCheckpointParts(ctx context.Context, what string, key location.AuthorityKey, m checkpointManifest, data []byte) (api.TxnOps, error) {
	parts := s.checkpointParts(key, m.Write)
	checks := make(api.TxnOps, 0, m.Parts+1)
	for i := 0; i < m.Parts; i++ {
		if err := ctxUnavailable(ctx, what); err != nil {
			return nil, err
		}
		k := parts + strconv.Itoa(i)
		part := data[i*RootPartBytes : min((i+1)*RootPartBytes, len(data))]
		var resp api.TxnResponse
		err := s.on(ctx, writeCall, func(ctx context.Context, c *api.Client) error {
			_, err := c.Raw().Write("/v1/txn", api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVSet, Key: k, Value: part}}}, &resp, s.writing(ctx))
			return err
		})
		if err != nil {
			// Without its manifest no reader sees this write: not applied.
			return nil, fmt.Errorf("%w: %s: part %d: %w", location.ErrUnavailable, what, i, classify(what, err, false))
		}
		if len(resp.Results) != 1 || resp.Results[0].KV == nil || resp.Results[0].KV.ModifyIndex == 0 {
			return nil, fmt.Errorf("%w: %s: part %d: no index in the answer", location.ErrUnavailable, what, i)
		}
		checks = append(checks, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: k, Index: resp.Results[0].KV.ModifyIndex}})
	}
	return checks, nil
}

// deleteParts removes one write's parts, best effort (DeleteCheckpoint
// removes whatever is left under the key).
func (s *Store) deleteParts(key location.AuthorityKey, write string) {
	ctx, cancel := context.WithTimeout(context.Background(), partsDeleteTimeout)
	defer cancel()
	_ = s.on(ctx, writeCall, func(ctx context.Context, c *api.Client) error {
		_, err := c.KV().DeleteTree(s.checkpointParts(key, write), s.writing(ctx))
		return err
	})
}

// DeleteCheckpoint implements location.CheckpointStore: the manifest (by
// compare-and-set when expected is set), then every part under the key,
// those of writes that lost or crashed included.
func (s *Store) DeleteCheckpoint(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion) error {
	if err := key.Validate(); err != nil {
		return err
	}
	what := fmt.Sprintf("delete checkpoint of %s", key)
	op := &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: s.checkpointKey(key)}}
	if expected != 0 {
		op.KV.Verb, op.KV.Index = api.KVDeleteCAS, uint64(expected)
	}
	_, failed, err := s.writeTxn(ctx, what, api.TxnOps{op})
	if err != nil {
		return err
	}
	if failed != nil {
		if m, _, rerr := s.readCheckpointManifest(ctx, key); rerr == nil && m == nil {
			return nil // already gone
		}
		return &location.ConflictError{Op: what, FailedOps: failed}
	}
	// The trailing '/' keeps other IDs out: an escaped ID has no '/'.
	if err := s.on(ctx, writeCall, func(ctx context.Context, c *api.Client) error {
		_, err := c.KV().DeleteTree(s.checkpointKey(key)+"/", s.writing(ctx))
		return err
	}); err != nil {
		return classify(what+": parts", err, true)
	}
	return nil
}
