package consultest

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/roamactors/roam/internal/devca"
)

// PKI is a throwaway certificate authority and the certificates an HTTPS
// agent and its clients need, as PEM files in a test's temporary
// directory. Nothing else trusts it.
type PKI struct {
	// CAFile is the CA's certificate.
	CAFile string
	// ServerCertFile and ServerKeyFile are the agent's: valid for
	// 127.0.0.1, ::1, localhost and ServerName.
	ServerCertFile, ServerKeyFile string
	// ClientCertFile and ClientKeyFile are a client's, for an agent with
	// TLS.VerifyIncoming.
	ClientCertFile, ClientKeyFile string
}

// ServerName is a DNS name in the server certificate besides the loopback
// addresses (Consul's own convention for a server of datacenter dc1).
const ServerName = "server.dc1.consul"

// NewPKI makes a CA and a server and a client certificate signed by it in
// a new directory under tb's temporary directory (with internal/devca).
// Two calls make two unrelated CAs.
func NewPKI(tb testing.TB) PKI {
	tb.Helper()
	p, err := newPKI(tb.TempDir())
	if err != nil {
		tb.Fatalf("consultest: make certificates: %v", err)
	}
	return p
}

// TLS is the agent side of p for Options.TLS; verifyIncoming makes the
// agent require p's client certificate.
func (p PKI) TLS(verifyIncoming bool) *TLS {
	t := &TLS{CAFile: p.CAFile, CertFile: p.ServerCertFile, KeyFile: p.ServerKeyFile, VerifyIncoming: verifyIncoming}
	if verifyIncoming {
		t.ClientCertFile, t.ClientKeyFile = p.ClientCertFile, p.ClientKeyFile
	}
	return t
}

func newPKI(dir string) (PKI, error) {
	ca, err := devca.New("roam test CA " + filepath.Base(dir))
	if err != nil {
		return PKI{}, err
	}
	server, err := ca.WriteClient(dir, "server", ServerName, "localhost", "127.0.0.1", "::1")
	if err != nil {
		return PKI{}, fmt.Errorf("server certificate: %w", err)
	}
	client, err := ca.WriteClient(dir, "client")
	if err != nil {
		return PKI{}, fmt.Errorf("client certificate: %w", err)
	}
	return PKI{CAFile: server.CA, ServerCertFile: server.Cert, ServerKeyFile: server.Key,
		ClientCertFile: client.Cert, ClientKeyFile: client.Key}, nil
}
