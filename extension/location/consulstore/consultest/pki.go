package consultest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
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
// a new directory under tb's temporary directory. Two calls make two
// unrelated CAs.
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
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return PKI{}, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "roam test CA " + filepath.Base(dir)},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return PKI{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return PKI{}, err
	}
	p := PKI{
		CAFile:         filepath.Join(dir, "ca.pem"),
		ServerCertFile: filepath.Join(dir, "server.pem"),
		ServerKeyFile:  filepath.Join(dir, "server-key.pem"),
		ClientCertFile: filepath.Join(dir, "client.pem"),
		ClientKeyFile:  filepath.Join(dir, "client-key.pem"),
	}
	if err := writePEM(p.CAFile, "CERTIFICATE", caDER); err != nil {
		return PKI{}, err
	}
	leaf := func(cn string, usage x509.ExtKeyUsage, certFile, keyFile string, dns []string, ips []net.IP) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			DNSNames:     dns,
			IPAddresses:  ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
			return err
		}
		return writePEM(keyFile, "EC PRIVATE KEY", keyDER)
	}
	if err := leaf(ServerName, x509.ExtKeyUsageServerAuth, p.ServerCertFile, p.ServerKeyFile,
		[]string{ServerName, "localhost"}, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}); err != nil {
		return PKI{}, fmt.Errorf("server certificate: %w", err)
	}
	if err := leaf("roam test client", x509.ExtKeyUsageClientAuth, p.ClientCertFile, p.ClientKeyFile, nil, nil); err != nil {
		return PKI{}, fmt.Errorf("client certificate: %w", err)
	}
	return p, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err)
	}
	return n
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
