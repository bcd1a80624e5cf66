package meshnode_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"strconv"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/devca"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/testwait"
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

// With TLS a node's identity is its name, which its certificate names: a
// peer may speak to a control actor only as the address it connected as,
// and only if its certificate names the node the store has there. A
// member's certificate on the same host does not speak for another
// member; a client's (naming no node) speaks for none.
func TestMutualTLSIdentityIsTheNodeNotTheHost(t *testing.T) {
	ca, err := devca.New("cluster")
	require.NoError(t, err)
	store := memstore.New()
	n := tlsNodeIn(t, ca, store, "n")
	m := tlsNodeIn(t, ca, store, "m")
	require.Equal(t, "m", m.Name(), "the name comes from the certificate")
	batch := func(sender string) *remote.RemoteMessage {
		return &remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: &remote.MessageBatch{
			TypeNames: []string{"roam.messages.RouteBarrier"},
			Targets:   []*actor.PID{{Address: n.Address(), Id: "roam/relocation"}},
			Senders:   []*actor.PID{{Address: sender, Id: "roam/relocation"}},
			Envelopes: []*remote.MessageEnvelope{{TypeId: 0, Target: 0, Sender: 1}},
		}}}
	}
	connect := func(address string) *remote.RemoteMessage {
		return &remote.RemoteMessage{MessageType: &remote.RemoteMessage_ConnectRequest{ConnectRequest: &remote.ConnectRequest{
			ConnectionType: &remote.ConnectRequest_ServerConnection{ServerConnection: &remote.ServerConnection{SystemId: "x", Address: address}}}}}
	}
	// speak opens a stream with creds, connects as declared (unless
	// empty) and sends a control message from sender; it returns how the
	// stream ended.
	// A Send that finds the stream already ended by the server (it
	// refused the connect before the batch went) says io.EOF; the status
	// is Recv's, as gRPC documents for client streams.
	speak := func(creds credentials.TransportCredentials, declared, sender string) error {
		s, err := dial(t, n.Address(), creds).Receive(context.Background())
		require.NoError(t, err)
		send := func(m *remote.RemoteMessage) bool {
			err := s.Send(m)
			if err != io.EOF {
				require.NoError(t, err)
			}
			return err == nil
		}
		if (declared == "" || send(connect(declared))) && send(batch(sender)) {
			require.NoError(t, s.CloseSend())
		}
		for {
			if _, err := s.Recv(); err != nil {
				return err
			}
		}
	}
	mallory := nodeCreds(t, ca, ca, "mallory", "127.0.0.1")
	refused := func(err error, what string) {
		t.Helper()
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", what, err)
	}
	refused(speak(mallory, "", m.Address()), "a control message before connecting")
	refused(speak(mallory, "10.9.9.9:1", m.Address()), "connecting as a host the certificate does not name")
	refused(speak(mallory, m.Address(), m.Address()), "another node's certificate on the same host")
	refused(speak(clientCreds(t, ca, ca, "127.0.0.1"), m.Address(), m.Address()), "a client's certificate")
	own := nodeCreds(t, ca, ca, "m", "127.0.0.1")
	refused(speak(own, m.Address(), "127.0.0.1:1"), "a sender other than the address connected as")
	require.ErrorIs(t, speak(own, m.Address(), m.Address()), io.EOF, "the node's own certificate speaks for it")

	// A control message without a sender needs the node's identity too.
	senderless := func(creds credentials.TransportCredentials, declared string) error {
		s, err := dial(t, n.Address(), creds).Receive(context.Background())
		require.NoError(t, err)
		require.NoError(t, s.Send(connect(declared)))
		b := batch(declared)
		b.GetMessageBatch().Senders, b.GetMessageBatch().Envelopes[0].Sender = nil, 0
		require.NoError(t, s.Send(b))
		require.NoError(t, s.CloseSend())
		for {
			if _, err := s.Recv(); err != nil {
				return err
			}
		}
	}
	refused(senderless(clientCreds(t, ca, ca, "127.0.0.1"), "127.0.0.1:1"), "a senderless control message from a client")
	require.ErrorIs(t, senderless(own, m.Address()), io.EOF, "and from the node itself")

	// A stream speaks for the one address it connected as: connecting
	// again as another node after the check is refused.
	s, err := dial(t, n.Address(), own).Receive(context.Background())
	require.NoError(t, err)
	require.NoError(t, s.Send(connect(m.Address())))
	require.NoError(t, s.Send(batch(m.Address())))
	require.NoError(t, s.Send(connect(n.Address())))
	require.NoError(t, s.Send(batch(n.Address())))
	require.NoError(t, s.CloseSend())
	for {
		if _, err = s.Recv(); err != nil {
			break
		}
	}
	refused(err, "a second connect request")
}

// With TLS, clients (certificates naming no node) have a connection limit
// of their own and spend a watch budget of their own certificate's: they
// cannot take the nodes' connections, nor spend a node's watches by
// claiming its address.
func TestWithTLSClientsCannotTakeTheNodesShare(t *testing.T) {
	ca, err := devca.New("cluster")
	require.NoError(t, err)
	f, err := ca.WriteNode(t.TempDir(), "n", "127.0.0.1")
	require.NoError(t, err)
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New(), Limits: meshnode.Limits{MaxConnections: 4, MaxRemoteWatchesPerPeer: 10},
		TLS: &meshnode.TLS{CertFile: f.Cert, KeyFile: f.Key, CAFile: f.CA}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	_, err = n.System().Root.SpawnNamed(actor.PropsFromFunc(func(actor.Context) {}), "app")
	require.NoError(t, err)

	client := clientCreds(t, ca, ca, "127.0.0.1")
	open := func(creds credentials.TransportCredentials, declared string) (remote.Remoting_ReceiveClient, error) {
		s, err := dial(t, n.Address(), creds).Receive(context.Background())
		if err == nil {
			err = s.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_ConnectRequest{ConnectRequest: &remote.ConnectRequest{
				ConnectionType: &remote.ConnectRequest_ServerConnection{ServerConnection: &remote.ServerConnection{SystemId: "x", Address: declared}}}}})
		}
		if err == nil {
			_, err = s.Recv() // the connect response
		}
		return s, err
	}
	// Watches: three streams of one client certificate, each claiming
	// another address, share one budget of 10.
	for i := range 3 {
		declared := "127.0.0.1:" + strconv.Itoa(i+1)
		s, err := open(client, declared)
		require.NoError(t, err)
		b := &remote.MessageBatch{TypeNames: []string{"actor.Watch"}, Targets: []*actor.PID{{Address: n.Address(), Id: "app"}}}
		for j := range 10 {
			data, _ := proto.Marshal(&actor.Watch{Watcher: &actor.PID{Address: declared, Id: "w" + strconv.Itoa(j)}})
			b.Envelopes = append(b.Envelopes, &remote.MessageEnvelope{TypeId: 0, Target: 0, MessageData: data})
		}
		require.NoError(t, s.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: b}}))
	}
	testwait.For(t, func() bool { return n.TransportRefusals().Watches == 20 }, "the client's watches past its budget were not refused")

	// Connections: clients fill theirs (3 streams above on 3
	// connections, one more fits) and are refused past it...
	_, err = open(client, "127.0.0.1:4")
	require.NoError(t, err)
	_, err = open(client, "127.0.0.1:5")
	require.Error(t, err, "a client connection past the clients' limit")
	// ...while a node still connects.
	_, err = open(nodeCreds(t, ca, ca, "m", "127.0.0.1"), "127.0.0.1:6")
	require.NoError(t, err, "a node's connection")
}

// tlsNodeIn starts node name with mutual TLS under ca on store, its name
// taken from its certificate.
func tlsNodeIn(t *testing.T, ca *devca.CA, store location.Store, name string) *meshnode.Node {
	t.Helper()
	f, err := ca.WriteNode(t.TempDir(), name, "127.0.0.1")
	require.NoError(t, err)
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: store,
		TLS: &meshnode.TLS{CertFile: f.Cert, KeyFile: f.Key, CAFile: f.CA}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	return n
}

// nodeCreds are the credentials of node name's certificate from issuer,
// trusting the cluster CA for the server.
func nodeCreds(t *testing.T, cluster, issuer *devca.CA, name string, hosts ...string) credentials.TransportCredentials {
	t.Helper()
	certPEM, keyPEM, err := issuer.IssueNode(name, hosts...)
	require.NoError(t, err)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cluster.Cert)
	return credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS13})
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

	// The certificate must name the node: not another name, not none.
	_, err = meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New(), Name: "other",
		TLS: &meshnode.TLS{CertFile: own.Cert, KeyFile: own.Key, CAFile: own.CA}})
	require.ErrorIs(t, err, location.ErrInvalid)
	client, err := ca.WriteClient(t.TempDir(), "client", "127.0.0.1")
	require.NoError(t, err)
	_, err = meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New(),
		TLS: &meshnode.TLS{CertFile: client.Cert, KeyFile: client.Key, CAFile: client.CA}})
	require.ErrorIs(t, err, location.ErrInvalid)
	require.ErrorContains(t, err, "names no roam node")
}
