package consulstore_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// boardFixture is a store on a fresh prefix and a raw Consul client to
// look under it.
type boardFixture struct {
	prefix string
	kv     *api.KV
}

func newBoardFixture(t *testing.T) (boardFixture, location.Board) {
	prefix := fmt.Sprintf("roam-test/board-%d", prefixes.Add(1))
	client, err := api.NewClient(&api.Config{Address: server.Addr})
	require.NoError(t, err)
	return boardFixture{prefix: prefix, kv: client.KV()}, storeAt(t, server.Addr, prefix)
}

func (f boardFixture) get(t *testing.T, key string) *api.KVPair {
	pair, _, err := f.kv.Get(f.prefix+"/"+key, nil)
	require.NoError(t, err)
	require.NotNil(t, pair, "no key %s", key)
	return pair
}

// A note is kept under note/<escaped mesh>/<escaped rid>/<name>, in an
// envelope that `consul kv get` shows as JSON: a JSON note as it is,
// other bytes as base64.
func TestNoteLayoutIsReadable(t *testing.T) {
	f, b := newBoardFixture(t)
	ctx := context.Background()
	key := location.NoteKey{Mesh: "mesh/🚀", NodeRid: "rid 100%", Name: "status-1"}
	v1, err := b.WriteNote(ctx, key, 0, []byte(`{"state": "DONE"}`))
	require.NoError(t, err)
	pair := f.get(t, "note/mesh%2F%F0%9F%9A%80/rid%20100%25/status-1")
	require.Equal(t, `{"seq":1,"value":{"state": "DONE"}}`, string(pair.Value))
	require.EqualValues(t, v1, pair.ModifyIndex)

	binary := []byte{0, 0xff, '{'}
	v2, err := b.WriteNote(ctx, key, v1, binary)
	require.NoError(t, err)
	pair = f.get(t, "note/mesh%2F%F0%9F%9A%80/rid%20100%25/status-1")
	require.Equal(t, fmt.Sprintf(`{"seq":%d,"base64":"%s"}`, v1+1, base64.StdEncoding.EncodeToString(binary)), string(pair.Value))
	require.EqualValues(t, v2, pair.ModifyIndex)
}

// A key under note/ that does not hold a note, or sits at another depth,
// is reported (ErrInvalid), never read as a note or skipped.
func TestForeignKeyUnderNotesIsAnError(t *testing.T) {
	f, b := newBoardFixture(t)
	ctx := context.Background()
	key := location.NoteKey{Mesh: "m", NodeRid: "r", Name: "requests"}
	_, err := f.kv.Put(&api.KVPair{Key: f.prefix + "/note/m/r/requests", Value: []byte(`{"requests":[]}`)}, nil)
	require.NoError(t, err)
	_, err = b.ReadNote(ctx, key)
	require.ErrorIs(t, err, location.ErrInvalid)
	_, err = b.ListNotes(ctx, "m")
	require.ErrorIs(t, err, location.ErrInvalid)

	_, err = f.kv.Put(&api.KVPair{Key: f.prefix + "/note/m/r/requests", Value: []byte(`{"seq":1,"value":{}}`)}, nil)
	require.NoError(t, err)
	notes, err := b.ListNotes(ctx, "m")
	require.NoError(t, err)
	require.Len(t, notes, 1)
	_, err = f.kv.Put(&api.KVPair{Key: f.prefix + "/note/m/r/deeper/requests", Value: []byte(`{"seq":1,"value":{}}`)}, nil)
	require.NoError(t, err)
	_, err = b.ListNotes(ctx, "m")
	require.ErrorIs(t, err, location.ErrInvalid)
}

// UpdateNode writes without naming a session, and Consul keeps the
// lock's: the descriptor key stays held by the node's session, which is
// what deletes it when the lease ends (behaviour delete).
func TestUpdateNodeKeepsTheSessionOnTheKey(t *testing.T) {
	f, _ := newBoardFixture(t)
	s := storeAt(t, server.Addr, f.prefix)
	ctx := context.Background()
	n := &location.NodeDescriptor{Mesh: "m", NodeRid: "r", NodeGeneration: 1, EntrySpotId: "roam-entry-r", Address: "127.0.0.1:1"}
	lease, err := s.ClaimNode(ctx, n, 10*time.Second)
	require.NoError(t, err)
	cur, err := s.ReadNode(ctx, location.NodeKeyOf(n))
	require.NoError(t, err)
	next := proto.Clone(cur.Node).(*location.NodeDescriptor)
	next.Status = messages.NodeStatus_NODE_STATUS_DRAINING
	v, err := s.UpdateNode(ctx, next, cur.Version)
	require.NoError(t, err)
	pair := f.get(t, "node/m/r")
	require.Equal(t, string(lease.ID), pair.Session)
	require.EqualValues(t, v, pair.ModifyIndex)
}
