// Package devca makes a throwaway certificate authority and certificates
// for roam nodes: for tests, `make certs` and the TLS demo. Never for
// production: keys are written unencrypted and live ten days.
package devca

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
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority held in memory.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	PEM  []byte
}

// New makes a self-signed CA named name.
func New(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// NodeURI is the subject alternative name (a URI) by which a certificate
// names the roam node it is for.
func NodeURI(node string) string { return "urn:roam:node:" + node }

// Issue makes a certificate (server and client authentication) naming
// hosts (IPs or DNS names) and no roam node: a client's, or another
// service's; it returns the certificate and key in PEM.
func (ca *CA) Issue(name string, hosts ...string) (certPEM, keyPEM []byte, err error) {
	return ca.issue(name, "", hosts)
}

// IssueNode makes the certificate of roam node node, naming it (NodeURI)
// and hosts.
func (ca *CA) IssueNode(node string, hosts ...string) (certPEM, keyPEM []byte, err error) {
	return ca.issue(node, node, hosts)
}

func (ca *CA) issue(name, node string, hosts []string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(10 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if node != "" {
		u, err := url.Parse(NodeURI(node))
		if err != nil {
			return nil, nil, fmt.Errorf("node name %q: %w", node, err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// Files are the paths WriteNode wrote.
type Files struct{ CA, Cert, Key string }

// WriteNode writes ca.pem and <name>.pem / <name>-key.pem into dir (made
// if missing): the certificate of roam node name, naming hosts.
func (ca *CA) WriteNode(dir, name string, hosts ...string) (Files, error) {
	return ca.write(dir, name, name, hosts)
}

// WriteClient writes ca.pem and <name>.pem / <name>-key.pem into dir (made
// if missing): a certificate naming hosts and no roam node.
func (ca *CA) WriteClient(dir, name string, hosts ...string) (Files, error) {
	return ca.write(dir, name, "", hosts)
}

func (ca *CA) write(dir, name, node string, hosts []string) (Files, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Files{}, err
	}
	cert, key, err := ca.issue(name, node, hosts)
	if err != nil {
		return Files{}, err
	}
	f := Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+"-key.pem")}
	for path, b := range map[string][]byte{f.CA: ca.PEM, f.Cert: cert, f.Key: key} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return Files{}, fmt.Errorf("write %s: %w", path, err)
		}
	}
	return f, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}
