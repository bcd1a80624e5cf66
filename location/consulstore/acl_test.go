package consulstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/consulstore"
	"github.com/roamactors/roam/location/consulstore/consultest"
	"github.com/roamactors/roam/location/storetest"
)

// managementToken is the initial management token of the test servers
// with ACLs.
const managementToken = "7e3c2a55-0b7c-4c7e-9a51-8f1d2b6c4e01"

// aclServer is a Consul with ACLs on, default policy deny, and a client
// with its management token that makes policies and tokens.
type aclServer struct {
	*consultest.Server
	admin *api.Client
	n     atomic.Int64
}

func startACL(t *testing.T) *aclServer {
	srv := consultest.StartWith(t, consultest.Options{ManagementToken: managementToken})
	admin, err := api.NewClient(&api.Config{Address: srv.Addr, Token: managementToken})
	require.NoError(t, err)
	return &aclServer{Server: srv, admin: admin}
}

// token makes a token with one policy of rules ("": a token with no
// policy, which default deny leaves no rights).
func (a *aclServer) token(t testing.TB, rules string) string {
	tok := &api.ACLToken{Description: "roam test"}
	if rules != "" {
		pol, _, err := a.admin.ACL().PolicyCreate(&api.ACLPolicy{Name: fmt.Sprintf("roam-test-%d", a.n.Add(1)), Rules: rules}, nil)
		require.NoError(t, err)
		tok.Policies = []*api.ACLTokenPolicyLink{{ID: pol.ID}}
	}
	tok, _, err := a.admin.ACL().TokenCreate(tok, nil)
	require.NoError(t, err)
	return tok.SecretID
}

func (a *aclServer) store(t testing.TB, prefix, token string) *consulstore.Store {
	s, err := consulstore.New(consulstore.Config{Address: a.Addr, Prefix: prefix, Token: token})
	require.NoError(t, err)
	return s
}

// requireDenied checks that err is ErrPermissionDenied, and none of the
// classes a caller retries or settles by re-reading.
func requireDenied(t *testing.T, err error, what string) {
	t.Helper()
	require.ErrorIs(t, err, location.ErrPermissionDenied, what)
	require.NotErrorIs(t, err, location.ErrUnavailable, what)
	require.NotErrorIs(t, err, location.ErrIndeterminate, what)
	require.NotErrorIs(t, err, location.ErrConflict, what)
	require.NotErrorIs(t, err, location.ErrNotFound, what)
	// Callers that only know the older classes do not retry it.
	require.ErrorIs(t, err, location.ErrInvalid, what)
}

// The Location Store and RootStore contract suites pass against a Consul
// with ACLs (default deny) through a token of exactly ACLPolicy(prefix):
// that policy is all the store needs. docs/CONSUL.md shows it.
func TestContractWithTheMinimumACLPolicy(t *testing.T) {
	acl := startACL(t)
	var n atomic.Int64
	h := storetest.Harness{
		New: func(t testing.TB) storetest.Instance {
			prefix := fmt.Sprintf("roam-acl/%d", n.Add(1))
			return storetest.Instance{Store: acl.store(t, prefix, acl.token(t, consulstore.ACLPolicy(prefix))), Pass: time.Sleep}
		},
		LeaseTTL: time.Second,
		Expiry:   2 * time.Second,
	}
	t.Run("Store", func(t *testing.T) { storetest.Run(t, h) })
	t.Run("Roots", func(t *testing.T) { storetest.RunRoots(t, h) })
}

// Neither rule of ACLPolicy can go: without the session rule a node
// cannot claim its lease, and without the key rule it cannot write.
func TestTheMinimumACLPolicyIsMinimal(t *testing.T) {
	acl := startACL(t)
	ctx := context.Background()
	prefix := "roam-minimal"
	full := consulstore.ACLPolicy(prefix)
	keyRule, sessionRule, ok := strings.Cut(full, "session_prefix")
	require.True(t, ok, full)
	sessionRule = "session_prefix" + sessionRule

	noSessions := acl.store(t, prefix, acl.token(t, keyRule))
	_, err := noSessions.CompareAndSet(ctx, location.Key(location.KindActor, "a"), 0, record(1, 0))
	require.NoError(t, err)
	_, err = noSessions.ClaimNode(ctx, &location.NodeDescriptor{Mesh: "m", NodeRid: "r", NodeGeneration: 1, EntrySpotId: "roam-entry-r"}, 10*time.Second)
	requireDenied(t, err, "claim without the session rule")

	noKeys := acl.store(t, prefix, acl.token(t, sessionRule))
	_, err = noKeys.CompareAndSet(ctx, location.Key(location.KindActor, "b"), 0, record(1, 0))
	requireDenied(t, err, "write without the key rule")

	// Read-only keys: a write is refused, not a conflict.
	readOnly := acl.store(t, prefix, acl.token(t, strings.Replace(keyRule, `"write"`, `"read"`, 1)+sessionRule))
	v, err := readOnly.Read(ctx, location.Key(location.KindActor, "a"))
	require.NoError(t, err)
	_, err = readOnly.CompareAndSet(ctx, location.Key(location.KindActor, "a"), v.Version, record(2, 0))
	requireDenied(t, err, "write with read-only keys")
	_, err = readOnly.Apply(ctx, []location.Op{location.CreateOp(location.Key(location.KindActor, "c"), record(1, 0))})
	requireDenied(t, err, "create with read-only keys")
}

// A token without rights — one with no policy, one Consul does not know,
// or none at all (the anonymous token) — gets ErrPermissionDenied from
// every call, reads and writes, never Unavailable or Indeterminate, and a
// list is refused rather than answered empty.
func TestATokenWithoutRightsIsPermissionDenied(t *testing.T) {
	acl := startACL(t)
	ctx := context.Background()
	prefix := "roam-denied"
	// State to be refused: a record, a node with its lease, a root.
	owner := acl.store(t, prefix, acl.token(t, consulstore.ACLPolicy(prefix)))
	key := location.Key(location.KindActor, "a")
	v, err := owner.CompareAndSet(ctx, key, 0, record(1, 0))
	require.NoError(t, err)
	node := &location.NodeDescriptor{Mesh: "m", NodeRid: "r", NodeGeneration: 1, EntrySpotId: "roam-entry-r"}
	lease, err := owner.ClaimNode(ctx, node, 30*time.Second)
	require.NoError(t, err)
	node.LeaseId = string(lease.ID)
	_, err = owner.PutRoot(ctx, "root", []byte("bytes"))
	require.NoError(t, err)

	for name, token := range map[string]string{
		"no policy": acl.token(t, ""),
		"unknown":   "0b6f8f43-2f0e-4d55-9d5e-2a8f5c1e9b77",
		"anonymous": "",
	} {
		t.Run(name, func(t *testing.T) {
			s := acl.store(t, prefix, token)
			_, err := s.Read(ctx, key)
			requireDenied(t, err, "read")
			_, err = s.CompareAndSet(ctx, key, v, record(2, 0))
			requireDenied(t, err, "compare-and-set")
			_, err = s.Apply(ctx, []location.Op{location.CreateOp(location.Key(location.KindActor, "new"), record(1, 0))})
			requireDenied(t, err, "create")
			_, err = s.ClaimNode(ctx, &location.NodeDescriptor{Mesh: "m", NodeRid: "r2", NodeGeneration: 1, EntrySpotId: "roam-entry-r2"}, 10*time.Second)
			requireDenied(t, err, "claim node")
			requireDenied(t, s.RenewLease(ctx, lease.ID), "renew lease")
			_, err = s.ReadNode(ctx, location.NodeKeyOf(node))
			requireDenied(t, err, "read node")
			requireDenied(t, s.ReleaseNode(ctx, node), "release node")
			_, err = s.PutRoot(ctx, "root2", []byte("x"))
			requireDenied(t, err, "put root")
			_, _, err = s.GetRoot(ctx, "root")
			requireDenied(t, err, "get root")
			requireDenied(t, s.DeleteRoot(ctx, "root"), "delete root")
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			_, err = s.Watch(wctx, key, 0)
			cancel()
			requireDenied(t, err, "watch")
			if name != "anonymous" {
				// Consul tells a named token that it filtered a list, and
				// never the anonymous one: its lists come back empty.
				_, err = s.List(ctx, location.KindActor, location.PageRequest{Size: 10})
				requireDenied(t, err, "list")
				_, err = s.ListNodes(ctx, "m")
				requireDenied(t, err, "list nodes")
				_, err = s.LeaseAlive(ctx, lease.ID)
				requireDenied(t, err, "lease alive")
			}
		})
	}
	// Nothing was written or ended.
	got, err := owner.Read(ctx, key)
	require.NoError(t, err)
	require.Equal(t, v, got.Version)
	alive, err := owner.LeaseAlive(ctx, lease.ID)
	require.NoError(t, err)
	require.True(t, alive)
	_, _, err = owner.GetRoot(ctx, "root")
	require.NoError(t, err)
}

// A root whose manifest the token may read but not its parts is refused,
// not reported corrupt: Consul leaves the hidden keys out of a
// transaction's answer without a word.
func TestHiddenRootPartsArePermissionDenied(t *testing.T) {
	acl := startACL(t)
	ctx := context.Background()
	prefix := "roam-parts"
	owner := acl.store(t, prefix, acl.token(t, consulstore.ACLPolicy(prefix)))
	_, err := owner.PutRoot(ctx, "root", []byte("some bytes"))
	require.NoError(t, err)
	manifestOnly := acl.store(t, prefix, acl.token(t, fmt.Sprintf(`key %q { policy = "read" }`, prefix+"/root/root")))
	_, _, err = manifestOnly.GetRoot(ctx, "root")
	requireDenied(t, err, "get root")
}

// Config.Token wins over CONSUL_HTTP_TOKEN and CONSUL_HTTP_TOKEN_FILE,
// even when it equals the first and the second names another token (the
// Consul client alone would take the file's); with no Config.Token, the
// environment's token is used.
func TestConfigTokenWinsOverTheEnvironment(t *testing.T) {
	acl := startACL(t)
	ctx := context.Background()
	prefix := "roam-env-token"
	good, none := acl.token(t, consulstore.ACLPolicy(prefix)), acl.token(t, "")
	key := location.Key(location.KindActor, "a")

	t.Setenv("CONSUL_HTTP_TOKEN_FILE", "")
	t.Setenv("CONSUL_HTTP_TOKEN", good)
	_, err := acl.store(t, prefix, "").CompareAndSet(ctx, key, 0, record(1, 0))
	require.NoError(t, err, "CONSUL_HTTP_TOKEN is used")
	_, err = acl.store(t, prefix, none).Read(ctx, key)
	requireDenied(t, err, "Config.Token wins over CONSUL_HTTP_TOKEN")

	file := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(file, []byte(none+"\n"), 0o600))
	t.Setenv("CONSUL_HTTP_TOKEN_FILE", file)
	_, err = acl.store(t, prefix, "").Read(ctx, key)
	requireDenied(t, err, "CONSUL_HTTP_TOKEN_FILE wins over CONSUL_HTTP_TOKEN")
	_, err = acl.store(t, prefix, good).Read(ctx, key)
	require.NoError(t, err, "Config.Token wins over CONSUL_HTTP_TOKEN_FILE")

	t.Setenv("CONSUL_HTTP_TOKEN_FILE", filepath.Join(t.TempDir(), "missing"))
	_, err = consulstore.New(consulstore.Config{Address: acl.Addr})
	require.ErrorIs(t, err, location.ErrInvalid, "a token file that cannot be read")
}

// docs/CONSUL.md shows the policy the tests above run with.
func TestTheDocumentedPolicyIsTheTestedOne(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "CONSUL.md"))
	require.NoError(t, err)
	require.Contains(t, string(doc), consulstore.ACLPolicy(""))
}
