package meshnode

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/roamactors/roam/location"
)

// TLS makes every connection between nodes mutual TLS: a node accepts a
// connection only from a peer whose certificate the cluster CA signed, and
// dials only peers whose certificate the CA signed for the host it dials.
//
// A node's identity is its name, which its certificate names (a URI
// subject alternative name, NodeURI): a control message, or an answer to
// a question the node asked, is accepted only over a connection whose
// certificate names the node that the Location Store has at the address
// the connection speaks for. So two nodes on one host cannot speak for
// each other, and a client's certificate (naming no node) speaks for none.
// Without TLS, any process that can reach a node's port is trusted as far
// as the Location Store allows (docs/SECURITY.md).
type TLS struct {
	// CertFile and KeyFile are this node's certificate (PEM; its chain may
	// follow it) and private key. The certificate must name the host peers
	// dial (AdvertisedHost, else Host) and the node (NodeURI of its name;
	// a node without a name of its own takes the one its certificate
	// names), and allow both server and client authentication.
	CertFile, KeyFile string
	// CAFile holds the PEM certificates of the cluster CA(s) that sign
	// every member's certificate.
	CAFile string
}

// credentials loads the files and checks that the certificate is one the
// peers will accept for host ("": any host, for a client).
func (t *TLS) credentials(host string) (server, client credentials.TransportCredentials, err error) {
	sc, cc, err := t.configs(host)
	if err != nil {
		return nil, nil, err
	}
	return credentials.NewTLS(sc), credentials.NewTLS(cc), nil
}

// NodeURI is the URI subject alternative name by which a certificate
// names roam node name: "urn:roam:node:<name>".
func NodeURI(name string) string { return nodeURIPrefix + name }

const nodeURIPrefix = "urn:roam:node:"

// certNodes are the roam nodes a certificate names.
func certNodes(leaf *x509.Certificate) []string {
	var out []string
	for _, u := range leaf.URIs {
		if s := u.String(); strings.HasPrefix(s, nodeURIPrefix) && len(s) > len(nodeURIPrefix) {
			out = append(out, s[len(nodeURIPrefix):])
		}
	}
	return out
}

// tlsNodeName is the name a node with TLS runs under: the one configured,
// which its certificate must name, else the one its certificate names.
func tlsNodeName(configured string, named []string) (string, error) {
	how := "issue the node a certificate with the URI subject alternative name " + NodeURI("<name>") +
		" (`make certs` writes one per demo node)"
	switch {
	case configured != "" && slices.Contains(named, configured):
		return configured, nil
	case configured != "" && len(named) == 0:
		return "", fmt.Errorf("%w: cluster: the TLS certificate names no roam node, so it cannot speak for node %q: %s", location.ErrInvalid, configured, how)
	case configured != "":
		return "", fmt.Errorf("%w: cluster: the TLS certificate names node(s) %q, not %q", location.ErrInvalid, named, configured)
	case len(named) == 1:
		return named[0], nil
	case len(named) == 0:
		return "", fmt.Errorf("%w: cluster: the TLS certificate names no roam node: %s", location.ErrInvalid, how)
	}
	return "", fmt.Errorf("%w: cluster: the TLS certificate names several nodes (%q): give the node one of them as its name", location.ErrInvalid, named)
}

// configs are credentials' TLS configurations, which the chunk link uses
// as they are.
func (t *TLS) configs(host string) (server, client *tls.Config, err error) {
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: cluster: TLS certificate and key: %w", location.ErrInvalid, err)
	}
	pem, err := os.ReadFile(t.CAFile)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: cluster: TLS CA file: %w", location.ErrInvalid, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, nil, fmt.Errorf("%w: cluster: TLS CA file %s holds no PEM certificate", location.ErrInvalid, t.CAFile)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, nil, fmt.Errorf("%w: cluster: TLS certificate: %w", location.ErrInvalid, err)
	}
	inter := x509.NewCertPool()
	for _, c := range cert.Certificate[1:] {
		if ic, err := x509.ParseCertificate(c); err == nil {
			inter.AddCert(ic)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, DNSName: host,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, nil, fmt.Errorf("%w: cluster: this TLS certificate is not valid for %q under the cluster CA: %w", location.ErrInvalid, host, err)
	}
	server = &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS13,
	}
	client = &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		MinVersion:   tls.VersionTLS13,
	}
	return server, client, nil
}

// certifiedFor reports whether the connection's peer certificate names
// the host of address (host:port).
func certifiedFor(leaf *x509.Certificate, address string) bool {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return false
	}
	return leaf.VerifyHostname(host) == nil
}

// ClientRemoteOptions are the Proto.Actor remote options of a process that
// talks to roam nodes without being one (a client): roam's frame limits,
// so that it may send a node messages up to MaxMessageBytes, and with t
// the cluster's mutual TLS — the certificate must name the client's own
// host, which it speaks from; and the fixed flow-control window of a
// node's connections (remoteWindowBytes). They replace Proto.Actor's defaults. A node
// sends a process that is not a node messages of at most 4 MiB (gRPC's
// default limit): a larger reply is answered to the client's request as a
// DeliveryFailed of class capacity_exceeded.
func ClientRemoteOptions(t *TLS, host string) ([]remote.ConfigOption, error) {
	dial := []grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(MaxFrameBytes), grpc.MaxCallRecvMsgSize(MaxFrameBytes)),
		grpc.WithInitialWindowSize(remoteWindowBytes), grpc.WithInitialConnWindowSize(remoteWindowBytes),
	}
	server := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxFrameBytes), grpc.MaxSendMsgSize(MaxFrameBytes),
		grpc.InitialWindowSize(remoteWindowBytes), grpc.InitialConnWindowSize(remoteWindowBytes),
	}
	if t == nil {
		dial = append(dial, grpc.WithTransportCredentials(insecure.NewCredentials()))
	} else {
		sc, cc, err := t.credentials(host)
		if err != nil {
			return nil, err
		}
		dial = append(dial, grpc.WithTransportCredentials(cc))
		server = append(server, grpc.Creds(sc))
	}
	return []remote.ConfigOption{
		remote.WithDialOptions(dial...), remote.WithServerOptions(server...),
		remote.WithCallOptions(grpc.MaxCallSendMsgSize(MaxFrameBytes), grpc.MaxCallRecvMsgSize(MaxFrameBytes)),
	}, nil
}

// TLSFromDir is the TLS of a directory as `make certs` writes it: ca.pem,
// <name>.pem and <name>-key.pem; nil for an empty dir (plain TCP).
func TLSFromDir(dir, name string) *TLS {
	if dir == "" {
		return nil
	}
	return &TLS{CertFile: filepath.Join(dir, name+".pem"), KeyFile: filepath.Join(dir, name+"-key.pem"), CAFile: filepath.Join(dir, "ca.pem")}
}
