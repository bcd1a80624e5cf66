package relocation_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/devca"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
)

var tlsNodes atomic.Int64

// startTLSNode starts a node with mutual TLS under ca and the given
// remote options (an application's own, which must not undo roam's).
func startTLSNode(t *testing.T, store location.Store, ca *devca.CA, kinds []relocation.Kind, opts ...remote.ConfigOption) *testNode {
	t.Helper()
	// A node's TLS identity is its name: each its own certificate.
	f, err := ca.WriteNode(t.TempDir(), fmt.Sprintf("node-%d", tlsNodes.Add(1)), "127.0.0.1")
	require.NoError(t, err)
	return startMeshNode(t, meshnode.Config{Store: store, Logger: testLogger(), RemoteOptions: opts,
		TLS: &meshnode.TLS{CertFile: f.Cert, KeyFile: f.Key, CAFile: f.CA}}, relocation.Config{Logger: testLogger()}, kinds...)
}

// With mutual TLS — and an application's own server options beside it —
// a 9 MiB object moves with its state: roam's frame limits hold under
// any transport option.
func TestLargeObjectMovesOverMutualTLS(t *testing.T) {
	ca, err := devca.New("cluster")
	require.NoError(t, err)
	store := newStore(t)
	kind := relocation.Kind{StableType: "blob", Producer: func() actor.Actor { return &blob{} }, Policy: relocation.PreserveStateWith(blobState{size: 9 << 20})}
	own := remote.WithServerOptions(grpc.ConnectionTimeout(30 * time.Second))
	a := startTLSNode(t, store, ca, []relocation.Kind{kind}, own)
	b := startTLSNode(t, store, ca, []relocation.Kind{kind}, own)
	ctx := context.Background()
	key := location.Key(location.KindActor, "big-tls")
	pid, err := a.driver.Spawn(ctx, "blob", key.ID)
	require.NoError(t, err)
	out, err := a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	require.Equal(t, b.node.Descriptor().GetNodeRid(), out.To)
	res, err := a.node.System().Root.RequestFuture(pid, wrapperspb.String("len"), testwait.Patience(t)).Result()
	require.NoError(t, err)
	require.Equal(t, int64(9<<20), res.(*wrapperspb.Int64Value).Value)
}

// With mutual TLS an outsider without the cluster CA's certificate gets
// nothing through, not even a capability answer: its messages never
// reach the node (Proto.Actor dead-letters a request to an endpoint it
// cannot connect to).
func TestOutsiderWithoutACertificateReachesNothing(t *testing.T) {
	ca, err := devca.New("cluster")
	require.NoError(t, err)
	other, err := devca.New("outsider")
	require.NoError(t, err)
	store := memstore.New()
	b := startTLSNode(t, store, ca, []relocation.Kind{counterKind})
	for name, creds := range map[string]*devca.CA{"plain": nil, "another CA": other} {
		var opts []remote.ConfigOption
		if creds != nil {
			// It trusts the cluster's CA (so it would accept the node) but
			// holds a certificate of the other CA.
			certPEM, keyPEM, err := creds.Issue("outsider", "127.0.0.1")
			require.NoError(t, err)
			cert, err := tls.X509KeyPair(certPEM, keyPEM)
			require.NoError(t, err)
			pool := x509.NewCertPool()
			pool.AddCert(ca.Cert)
			opts = []remote.ConfigOption{remote.WithDialOptions(grpc.WithTransportCredentials(
				credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS13})))}
		}
		sys := actor.NewActorSystem()
		r := remote.NewRemote(sys, remote.Configure("127.0.0.1", 0, opts...))
		r.Start()
		// Absence is waited for a bounded time: a node that answered would
		// do so in milliseconds (a slow machine can only make this pass).
		_, err := sys.Root.RequestFuture(relocation.PID(b.node.Address()), &messages.CapabilityQuery{Kind: location.KindActor, StableType: "counter"},
			2*time.Second).Result()
		require.Error(t, err, name)
		r.Shutdown(false)
	}
	require.True(t, b.node.Valid())
}
