package meshnode_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/roamactors/roam/internal/devca"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
)

// tlsNode starts a node with mutual TLS under ca, its certificate naming
// 127.0.0.1.
func tlsNode(t *testing.T, ca *devca.CA) *meshnode.Node {
	t.Helper()
	f, err := ca.WriteNode(t.TempDir(), "node", "127.0.0.1")
	require.NoError(t, err)
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New(),
		TLS: &meshnode.TLS{CertFile: f.Cert, KeyFile: f.Key, CAFile: f.CA}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	return n
}

// clientCreds are the credentials of a client holding a certificate of
// issuer for hosts, trusting the cluster CA for the server.
func clientCreds(t *testing.T, cluster, issuer *devca.CA, hosts ...string) credentials.TransportCredentials {
	t.Helper()
	certPEM, keyPEM, err := issuer.Issue("client", hosts...)
	require.NoError(t, err)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cluster.Cert)
	return credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS13})
}

func dial(t *testing.T, address string, creds credentials.TransportCredentials) remote.RemotingClient {
	t.Helper()
	conn, err := grpc.Dial(address, grpc.WithTransportCredentials(creds))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return remote.NewRemotingClient(conn)
}

// With TLS a node serves only peers holding a certificate of the cluster
// CA: a plain connection and one with another CA's certificate get no
// call through; a member's certificate does.
func TestMutualTLSServesOnlyTheClusterCA(t *testing.T) {
	ca, err := devca.New("cluster")
	require.NoError(t, err)
	other, err := devca.New("outsider")
	require.NoError(t, err)
	n := tlsNode(t, ca)
	ctx := context.Background()

	_, err = dial(t, n.Address(), insecure.NewCredentials()).ListProcesses(ctx, &remote.ListProcessesRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err), "plain TCP: %v", err)
	_, err = dial(t, n.Address(), clientCreds(t, ca, other, "127.0.0.1")).ListProcesses(ctx, &remote.ListProcessesRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err), "another CA's certificate: %v", err)
	_, err = dial(t, n.Address(), clientCreds(t, ca, ca, "127.0.0.1")).ListProcesses(ctx, &remote.ListProcessesRequest{})
	require.Equal(t, codes.Unimplemented, status.Code(err), "a member reaches the service: %v", err)
	require.True(t, n.Valid())
}

// With TLS a control message's declared sender must be on a host the
// connection's certificate names: a member certified for "localhost" may
// speak as localhost:port, not as 127.0.0.1:port.
func TestMutualTLSBindsControlSendersToTheCertificate(t *testing.T) {
	ca, err := devca.New("cluster")
	require.NoError(t, err)
	n := tlsNode(t, ca)
	client := dial(t, n.Address(), clientCreds(t, ca, ca, "localhost"))
	batch := func(sender string) *remote.RemoteMessage {
		return &remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: &remote.MessageBatch{
			TypeNames: []string{"roam.messages.RouteBarrier"},
			Targets:   []*actor.PID{{Address: n.Address(), Id: "roam/relocation"}},
			Senders:   []*actor.PID{{Address: sender, Id: "roam/relocation"}},
			Envelopes: []*remote.MessageEnvelope{{TypeId: 0, Target: 0, Sender: 1}},
		}}}
	}

	forged, err := client.Receive(context.Background())
	require.NoError(t, err)
	require.NoError(t, forged.Send(batch("127.0.0.1:1")))
	_, err = forged.Recv()
	require.Equal(t, codes.InvalidArgument, status.Code(err), "a sender the certificate does not name: %v", err)

	connect, err := client.Receive(context.Background())
	require.NoError(t, err)
	require.NoError(t, connect.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_ConnectRequest{ConnectRequest: &remote.ConnectRequest{
		ConnectionType: &remote.ConnectRequest_ServerConnection{ServerConnection: &remote.ServerConnection{SystemId: "x", Address: "127.0.0.1:1"}}}}}))
	_, err = connect.Recv()
	require.Equal(t, codes.InvalidArgument, status.Code(err), "connecting as an address the certificate does not name: %v", err)

	own, err := client.Receive(context.Background())
	require.NoError(t, err)
	require.NoError(t, own.Send(batch("localhost:1")))
	require.NoError(t, own.CloseSend())
	_, err = own.Recv()
	require.ErrorIs(t, err, io.EOF, "its own host is accepted: %v", err)
}

// A node refuses to start with a certificate its peers would refuse: one
// that does not name its host, or that the CA did not sign.
func TestTLSConfigIsCheckedAtStart(t *testing.T) {
	ca, err := devca.New("cluster")
	require.NoError(t, err)
	other, err := devca.New("other")
	require.NoError(t, err)
	wrongHost, err := ca.WriteNode(t.TempDir(), "node", "10.9.9.9")
	require.NoError(t, err)
	_, err = meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New(),
		TLS: &meshnode.TLS{CertFile: wrongHost.Cert, KeyFile: wrongHost.Key, CAFile: wrongHost.CA}})
	require.ErrorIs(t, err, location.ErrInvalid)

	foreign, err := other.WriteNode(t.TempDir(), "node", "127.0.0.1")
	require.NoError(t, err)
	own, err := ca.WriteNode(t.TempDir(), "node", "127.0.0.1")
	require.NoError(t, err)
	_, err = meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New(),
		TLS: &meshnode.TLS{CertFile: foreign.Cert, KeyFile: foreign.Key, CAFile: own.CA}})
	require.ErrorIs(t, err, location.ErrInvalid)
}
