package consulstore_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/consulstore"
	"github.com/roamactors/roam/location/storetest"
)

// TestRootContract runs the RootStore contract suite (docs/PROTOCOL.md §3.5) on a
// real Consul.
func TestRootContract(t *testing.T) { storetest.RunRoots(t, harness()) }

// rootFixture is a store on a fresh prefix and a raw Consul client to look
// under it. Keys used with it need no escaping.
type rootFixture struct {
	s      *consulstore.Store
	prefix string
	kv     *api.KV
}

func newRootFixture(t *testing.T) rootFixture {
	prefix := fmt.Sprintf("roam-test/roots-%d", prefixes.Add(1))
	client, err := api.NewClient(&api.Config{Address: server.Addr})
	require.NoError(t, err)
	return rootFixture{s: storeAt(t, server.Addr, prefix), prefix: prefix, kv: client.KV()}
}

func (f rootFixture) manifestKey(key string) string { return f.prefix + "/root/" + key }

func (f rootFixture) partKey(key string, data []byte, n int) string {
	sum := sha256.Sum256(data)
	return f.manifestKey(key) + "/part/" + hex.EncodeToString(sum[:]) + "/" + strconv.Itoa(n)
}

// putParts writes data's parts the way PutRoot does, without a manifest:
// what a writer that crashed before its manifest leaves behind.
func (f rootFixture) putParts(t *testing.T, key string, data []byte) {
	for n := 0; n*consulstore.RootPartBytes < len(data); n++ {
		part := data[n*consulstore.RootPartBytes : min((n+1)*consulstore.RootPartBytes, len(data))]
		_, err := f.kv.Put(&api.KVPair{Key: f.partKey(key, data, n), Value: part}, nil)
		require.NoError(t, err)
	}
}

func (f rootFixture) keys(t *testing.T) []string {
	keys, _, err := f.kv.Keys(f.prefix+"/", "", nil)
	require.NoError(t, err)
	return keys
}

func rootData(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

// Parts without a manifest are no root: GetRoot is ErrNotFound, and a
// PutRoot over them (same bytes or other bytes) then stores a whole root.
// Reference: PROTOCOL.md §3.5 (a crash half-way leaves nothing GetRoot
// returns).
func TestRootWithoutManifestIsNotFound(t *testing.T) {
	f := newRootFixture(t)
	ctx := context.Background()
	data := rootData(600 << 10)
	f.putParts(t, "crashed", data)
	require.Len(t, f.keys(t), 3)
	got, _, err := f.s.GetRoot(ctx, "crashed")
	require.ErrorIs(t, err, location.ErrNotFound)
	require.Nil(t, got)

	// The same bytes again: the parts are reused.
	ref, err := f.s.PutRoot(ctx, "crashed", data)
	require.NoError(t, err)
	require.Equal(t, location.NewRootRef("crashed", data), ref)
	got, _, err = f.s.GetRoot(ctx, "crashed")
	require.NoError(t, err)
	require.Equal(t, data, got)

	// Other bytes over a crashed writer's parts.
	f.putParts(t, "other", rootData(300<<10))
	other := rootData(400 << 10)
	other[0] ^= 0xff
	_, err = f.s.PutRoot(ctx, "other", other)
	require.NoError(t, err)
	got, _, err = f.s.GetRoot(ctx, "other")
	require.NoError(t, err)
	require.Equal(t, other, got)

	// DeleteRoot removes the crashed writer's parts too.
	require.NoError(t, f.s.DeleteRoot(ctx, "other"))
	for _, k := range f.keys(t) {
		require.False(t, strings.HasPrefix(k, f.manifestKey("other")), "left behind: %s", k)
	}
}

// A part changed, cut short or missing under a manifest is reported as an
// error (ErrInvalid), never returned, and never taken for a missing root.
// Reference: PROTOCOL.md §3.5 (GetRoot checks the bytes against their
// SHA-256).
func TestRootCorruptPartIsAnError(t *testing.T) {
	f := newRootFixture(t)
	ctx := context.Background()
	data := rootData(600 << 10)
	_, err := f.s.PutRoot(ctx, "r", data)
	require.NoError(t, err)
	part1 := append([]byte(nil), data[consulstore.RootPartBytes:2*consulstore.RootPartBytes]...)

	corrupt := func(what string, damage func()) {
		t.Helper()
		damage()
		got, ref, err := f.s.GetRoot(ctx, "r")
		require.Error(t, err, what)
		require.ErrorIs(t, err, location.ErrInvalid, what)
		require.NotErrorIs(t, err, location.ErrNotFound, what)
		require.Nil(t, got, what)
		require.Zero(t, ref, what)
		// Repair.
		_, err = f.kv.Put(&api.KVPair{Key: f.partKey("r", data, 1), Value: part1}, nil)
		require.NoError(t, err)
		got, _, err = f.s.GetRoot(ctx, "r")
		require.NoError(t, err)
		require.Equal(t, data, got)
	}
	corrupt("a flipped byte", func() {
		bad := append([]byte(nil), part1...)
		bad[100] ^= 1
		_, err := f.kv.Put(&api.KVPair{Key: f.partKey("r", data, 1), Value: bad}, nil)
		require.NoError(t, err)
	})
	corrupt("a part cut short", func() {
		_, err := f.kv.Put(&api.KVPair{Key: f.partKey("r", data, 1), Value: part1[:10]}, nil)
		require.NoError(t, err)
	})
	corrupt("a missing part", func() {
		_, err := f.kv.Delete(f.partKey("r", data, 1), nil)
		require.NoError(t, err)
	})

	// A manifest that is not one is an error too.
	_, err = f.kv.Put(&api.KVPair{Key: f.manifestKey("junk"), Value: []byte("not json")}, nil)
	require.NoError(t, err)
	_, _, err = f.s.GetRoot(ctx, "junk")
	require.ErrorIs(t, err, location.ErrInvalid)
}

// A root is stored as parts of at most 256 KiB (Consul values and
// transactions are ≤ 512 KiB, PROTOCOL.md §3.6) and a readable JSON manifest with
// its size, SHA-256 and part count. Reference: PROTOCOL.md §3.5.
func TestRootStoredAsPartsAndReadableManifest(t *testing.T) {
	f := newRootFixture(t)
	data := rootData(location.MaxRootBytes)
	_, err := f.s.PutRoot(context.Background(), "big/1", data)
	require.NoError(t, err)
	keys := f.keys(t)
	require.Len(t, keys, 6, "manifest and five parts: %v", keys)
	manifest := f.prefix + "/root/big%2F1"
	require.Contains(t, keys, manifest)
	for _, k := range keys {
		pair, _, err := f.kv.Get(k, nil)
		require.NoError(t, err)
		require.LessOrEqual(t, len(pair.Value), consulstore.RootPartBytes, k)
		if k != manifest {
			require.True(t, strings.HasPrefix(k, manifest+"/part/"), k)
		}
	}
	pair, _, err := f.kv.Get(manifest, nil)
	require.NoError(t, err)
	var doc struct {
		Key    string `json:"key"`
		Size   uint64 `json:"size"`
		SHA256 string `json:"sha256"`
		Parts  int    `json:"parts"`
	}
	require.NoError(t, json.Unmarshal(pair.Value, &doc), "manifest is JSON: %s", pair.Value)
	sum := sha256.Sum256(data)
	require.Equal(t, "big/1", doc.Key)
	require.EqualValues(t, len(data), doc.Size)
	require.Equal(t, hex.EncodeToString(sum[:]), doc.SHA256)
	require.Equal(t, 5, doc.Parts)
}

// Transport failures are classified as on every other call: a lost
// manifest write is Indeterminate (and a retried PutRoot of the same bytes
// tells), a lost part write or read is Unavailable (no manifest was
// written, so no root), and a store nobody listens on is Unavailable.
// Reference: PROTOCOL.md §3.3, §3.5, §3.6; docs/CONSUL.md ("Which error
// each failure gives").
func TestRootTransportFailures(t *testing.T) {
	p := startProxy(t)
	prefix := fmt.Sprintf("roam-test/roots-indet-%d", prefixes.Add(1))
	s, direct := storeAt(t, p.addr, prefix), storeAt(t, server.Addr, prefix)
	ctx := context.Background()

	// An empty root is only its manifest: its write is the one txn.
	p.set("drop-before")
	_, err := s.PutRoot(ctx, "cut", nil)
	require.ErrorIs(t, err, location.ErrIndeterminate)
	_, _, err = direct.GetRoot(ctx, "cut")
	require.ErrorIs(t, err, location.ErrNotFound)

	p.set("drop-after")
	_, err = s.PutRoot(ctx, "applied", nil)
	require.ErrorIs(t, err, location.ErrIndeterminate)
	ref, err := direct.PutRoot(ctx, "applied", nil)
	require.NoError(t, err, "the retry finds the root written")
	require.Equal(t, location.NewRootRef("applied", nil), ref)
	_, err = direct.PutRoot(ctx, "applied", []byte("other"))
	require.ErrorIs(t, err, location.ErrConflict)

	// A part write that fails leaves no root.
	p.set("500")
	_, err = s.PutRoot(ctx, "parts", rootData(300<<10))
	require.ErrorIs(t, err, location.ErrUnavailable)
	_, _, err = direct.GetRoot(ctx, "parts")
	require.ErrorIs(t, err, location.ErrNotFound)

	// A failed part read is Unavailable.
	_, err = direct.PutRoot(ctx, "stored", rootData(300<<10))
	require.NoError(t, err)
	_, _, err = s.GetRoot(ctx, "stored")
	require.ErrorIs(t, err, location.ErrUnavailable)
	p.set("pass")
	got, _, err := s.GetRoot(ctx, "stored")
	require.NoError(t, err)
	require.Equal(t, rootData(300<<10), got)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	l.Close()
	nobody := storeAt(t, addr, "roam-test/nobody")
	_, err = nobody.PutRoot(ctx, "r", []byte("x"))
	require.ErrorIs(t, err, location.ErrUnavailable)
	_, _, err = nobody.GetRoot(ctx, "r")
	require.ErrorIs(t, err, location.ErrUnavailable)
	require.ErrorIs(t, nobody.DeleteRoot(ctx, "r"), location.ErrUnavailable)
}

// TestCheckpointCheckInApply runs the OpCheckNoCheckpoint contract.
func TestCheckpointCheckInApply(t *testing.T) { storetest.RunCheckpointsInApply(t, harness()) }

// TestCheckpointContract runs the checkpoint store contract on a real
// Consul: manifests, parts and the torn-read guard.
func TestCheckpointContract(t *testing.T) {
	storetest.RunCheckpoints(t, storetest.CheckpointStoreOf(harness()))
}

// A replaced checkpoint's parts go once the replacement landed, a lost
// write's parts go with its loss, and a delete leaves nothing under the
// key: repeated checkpoints of a large state do not pile up in Consul.
func TestCheckpointPartsDoNotPileUp(t *testing.T) {
	f := newRootFixture(t)
	ctx := context.Background()
	key := location.Key(location.KindActor, "big")
	var v location.StoreVersion
	for i := 0; i < 4; i++ {
		nv, err := f.s.PutCheckpoint(ctx, key, v, rootData(600<<10+i))
		require.NoError(t, err)
		v = nv
	}
	_, err := f.s.PutCheckpoint(ctx, key, 1, rootData(700<<10)) // a lost write
	require.Error(t, err)
	// the manifest and the three parts of the last write
	require.Len(t, f.keys(t), 1+3, "%v", f.keys(t))
	nv, err := f.s.PutCheckpoint(ctx, key, v, []byte("small"))
	require.NoError(t, err)
	require.Equal(t, []string{f.prefix + "/checkpoint/actor/big"}, f.keys(t), "an inline checkpoint has no parts")
	require.NoError(t, f.s.DeleteCheckpoint(ctx, key, nv))
	require.Empty(t, f.keys(t))
}

func BenchmarkCheckpointPut(b *testing.B) { storetest.BenchmarkCheckpointPut(b, newStore(b)) }
