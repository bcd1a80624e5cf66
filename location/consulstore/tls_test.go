package consulstore_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/consulstore"
	"github.com/roamactors/roam/location/consulstore/consultest"
)

// clearConsulEnv empties the CONSUL_* variables the Consul client reads,
// so that only what a test sets counts.
func clearConsulEnv(t *testing.T) {
	for _, v := range []string{"CONSUL_HTTP_ADDR", "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE", "CONSUL_HTTP_SSL",
		"CONSUL_HTTP_SSL_VERIFY", "CONSUL_CACERT", "CONSUL_CAPATH", "CONSUL_CLIENT_CERT", "CONSUL_CLIENT_KEY", "CONSUL_TLS_SERVER_NAME"} {
		t.Setenv(v, "")
	}
}

// works checks that s serves reads, writes and leases.
func works(t *testing.T, s *consulstore.Store, id string) {
	t.Helper()
	ctx := context.Background()
	key := location.Key(location.KindActor, id)
	v, err := s.CompareAndSet(ctx, key, 0, record(1, 0))
	require.NoError(t, err)
	got, err := s.Read(ctx, key)
	require.NoError(t, err)
	require.Equal(t, v, got.Version)
	lease, err := s.ClaimNode(ctx, &location.NodeDescriptor{Mesh: "m", NodeRid: id, NodeGeneration: 1, EntrySpotId: "roam-entry-" + id}, 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, s.RenewLease(ctx, lease.ID))
}

// requireTLSFailure checks that a read and a write through s fail at once
// with the class of a TLS configuration error: ErrInvalid, wrapping the
// TLS failure, and none of the classes a caller retries or settles by
// re-reading. The calls' context outlives them by far: no retry loop ran.
func requireTLSFailure(t *testing.T, s *consulstore.Store, what string) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	key := location.Key(location.KindActor, "tls")
	_, rerr := s.Read(ctx, key)
	_, werr := s.CompareAndSet(ctx, key, 0, record(1, 0))
	_, cerr := s.ClaimNode(ctx, &location.NodeDescriptor{Mesh: "m", NodeRid: "tls", NodeGeneration: 1, EntrySpotId: "roam-entry-tls"}, 10*time.Second)
	for i, err := range []error{rerr, werr, cerr} {
		call := []string{"read", "write", "claim"}[i]
		require.ErrorIs(t, err, location.ErrInvalid, "%s: %s", what, call)
		require.ErrorContains(t, err, "TLS", "%s: %s", what, call)
		require.NotErrorIs(t, err, location.ErrUnavailable, "%s: %s", what, call)
		require.NotErrorIs(t, err, location.ErrIndeterminate, "%s: %s", what, call)
		require.NotErrorIs(t, err, location.ErrPermissionDenied, "%s: %s", what, call)
	}
	require.NoError(t, ctx.Err())
	return []error{rerr, werr, cerr}
}

func tlsStore(t *testing.T, cfg consulstore.Config) *consulstore.Store {
	t.Helper()
	if cfg.Prefix == "" {
		cfg.Prefix = fmt.Sprintf("roam-tls/%d", prefixes.Add(1))
	}
	s, err := consulstore.New(cfg)
	require.NoError(t, err)
	return s
}

// A Consul that serves HTTPS only (verify_incoming off) is reached with
// its CA given through Config.TLS, with or without an https:// scheme,
// by IP or by the certificate's server name, through one agent address
// or several (the multi-agent dialer); without its CA, with another CA,
// for another server name, or over plain HTTP the store fails at once
// with ErrInvalid (a TLS configuration error), never Unavailable or
// Indeterminate, for reads and writes alike.
func TestHTTPSWithTheRightCAOnly(t *testing.T) {
	clearConsulEnv(t)
	pki, other := consultest.NewPKI(t), consultest.NewPKI(t)
	srv := consultest.StartWith(t, consultest.Options{TLS: pki.TLS(false)})
	ca := consulstore.TLSConfig{CAFile: pki.CAFile}

	works(t, tlsStore(t, consulstore.Config{Address: srv.Addr, TLS: ca}), "bare")
	works(t, tlsStore(t, consulstore.Config{Address: "https://" + srv.Addr, TLS: ca}), "scheme")
	works(t, tlsStore(t, consulstore.Config{Address: srv.Addr, TLS: consulstore.TLSConfig{CAFile: pki.CAFile, ServerName: consultest.ServerName}}), "name")
	works(t, tlsStore(t, consulstore.Config{Addresses: []string{closedAddr(t), "https://" + srv.Addr}, TLS: ca}), "several")
	caDir := t.TempDir()
	caPEM, err := os.ReadFile(pki.CAFile)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(caDir, "ca.pem"), caPEM, 0o600))
	works(t, tlsStore(t, consulstore.Config{Address: srv.Addr, TLS: consulstore.TLSConfig{CAPath: caDir}}), "capath")

	var verify *tls.CertificateVerificationError
	for _, errs := range [][]error{
		requireTLSFailure(t, tlsStore(t, consulstore.Config{Address: "https://" + srv.Addr}), "no CA"),
		requireTLSFailure(t, tlsStore(t, consulstore.Config{Address: srv.Addr, TLS: consulstore.TLSConfig{CAFile: other.CAFile}}), "another CA"),
		requireTLSFailure(t, tlsStore(t, consulstore.Config{Address: srv.Addr, TLS: consulstore.TLSConfig{CAFile: pki.CAFile, ServerName: "consul.elsewhere.example"}}), "another name"),
	} {
		for _, err := range errs {
			require.True(t, errors.As(err, &verify), "%v", err)
		}
	}
	requireTLSFailure(t, tlsStore(t, consulstore.Config{Address: "http://" + srv.Addr}), "plain HTTP to HTTPS")
	requireTLSFailure(t, tlsStore(t, consulstore.Config{Address: "https://" + server.Addr, TLS: ca}), "HTTPS to plain HTTP")
	// Several agents, all misconfigured the same way: each is tried once,
	// and the call still fails as a TLS configuration error.
	requireTLSFailure(t, tlsStore(t, consulstore.Config{Addresses: []string{"https://" + srv.Addr, closedAddr(t), "https://localhost:" + port(t, srv.Addr)}, TLS: consulstore.TLSConfig{CAFile: other.CAFile}}), "several, another CA")
}

// A Consul that requires client certificates (verify_incoming) serves a
// store with Config.TLS's CertFile and KeyFile, and refuses one without,
// or with a certificate of another CA: the store ends the handshake
// itself when the agent asks for a certificate it cannot give, so reads
// and writes fail at once as a TLS configuration error, never
// Unavailable or Indeterminate (left to crypto/tls, TLS 1.3 would send
// the request first and then see the connection reset).
func TestHTTPSWithClientCertificates(t *testing.T) {
	clearConsulEnv(t)
	pki, other := consultest.NewPKI(t), consultest.NewPKI(t)
	srv := consultest.StartWith(t, consultest.Options{TLS: pki.TLS(true)})
	works(t, tlsStore(t, consulstore.Config{Address: srv.Addr, TLS: consulstore.TLSConfig{
		CAFile: pki.CAFile, CertFile: pki.ClientCertFile, KeyFile: pki.ClientKeyFile}}), "client-cert")
	// The same store on an agent that does not ask: no certificate is sent.
	plain := consultest.StartWith(t, consultest.Options{TLS: pki.TLS(false)})
	works(t, tlsStore(t, consulstore.Config{Address: plain.Addr, TLS: consulstore.TLSConfig{CAFile: pki.CAFile}}), "no-client-cert")

	for i := 0; i < 5; i++ { // the race this avoids went either way
		requireTLSFailure(t, tlsStore(t, consulstore.Config{Address: srv.Addr, TLS: consulstore.TLSConfig{CAFile: pki.CAFile}}), "no client certificate")
		requireTLSFailure(t, tlsStore(t, consulstore.Config{Address: srv.Addr, TLS: consulstore.TLSConfig{
			CAFile: pki.CAFile, CertFile: other.ClientCertFile, KeyFile: other.ClientKeyFile}}), "a client certificate of another CA")
	}

	_, err := consulstore.New(consulstore.Config{Address: srv.Addr, TLS: consulstore.TLSConfig{CAFile: pki.CAFile, CertFile: pki.ClientCertFile}})
	require.ErrorIs(t, err, location.ErrInvalid, "a certificate without its key")
	_, err = consulstore.New(consulstore.Config{Address: srv.Addr, TLS: consulstore.TLSConfig{CAFile: filepath.Join(t.TempDir(), "missing.pem")}})
	require.ErrorIs(t, err, location.ErrInvalid, "a CA file that cannot be read")
	_, err = consulstore.New(consulstore.Config{Address: "http://" + srv.Addr, TLS: consulstore.TLSConfig{CAFile: pki.CAFile}})
	require.ErrorIs(t, err, location.ErrInvalid, "TLS settings for a plain http:// address")
}

// With Config empty, the store takes its agent and TLS settings from the
// CONSUL_* variables, through the Consul client's own defaults; a field
// set in Config wins over its variable.
func TestTheEnvironmentFillsWhatConfigLeavesEmpty(t *testing.T) {
	clearConsulEnv(t)
	pki, other := consultest.NewPKI(t), consultest.NewPKI(t)
	srv := consultest.StartWith(t, consultest.Options{TLS: pki.TLS(true)})
	t.Setenv("CONSUL_HTTP_ADDR", srv.Addr)
	t.Setenv("CONSUL_HTTP_SSL", "true")
	t.Setenv("CONSUL_CACERT", pki.CAFile)
	t.Setenv("CONSUL_CLIENT_CERT", pki.ClientCertFile)
	t.Setenv("CONSUL_CLIENT_KEY", pki.ClientKeyFile)
	t.Setenv("CONSUL_TLS_SERVER_NAME", consultest.ServerName)
	works(t, tlsStore(t, consulstore.Config{}), "env")

	// Config wins: the address (plain HTTP, despite CONSUL_HTTP_SSL) ...
	works(t, tlsStore(t, consulstore.Config{Address: "http://" + server.Addr}), "env-address")
	// ... the CA, as a file or a directory, over CONSUL_CACERT ...
	t.Setenv("CONSUL_CACERT", other.CAFile)
	requireTLSFailure(t, tlsStore(t, consulstore.Config{}), "CONSUL_CACERT of another CA")
	works(t, tlsStore(t, consulstore.Config{TLS: consulstore.TLSConfig{CAFile: pki.CAFile}}), "env-cafile")
	caDir := t.TempDir()
	caPEM, err := os.ReadFile(pki.CAFile)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(caDir, "ca.pem"), caPEM, 0o600))
	works(t, tlsStore(t, consulstore.Config{TLS: consulstore.TLSConfig{CAPath: caDir}}), "env-capath")
	t.Setenv("CONSUL_CACERT", pki.CAFile)
	// ... and the server name.
	_, err = tlsStore(t, consulstore.Config{TLS: consulstore.TLSConfig{ServerName: "consul.elsewhere.example"}}).Read(context.Background(), location.Key(location.KindActor, "x"))
	require.ErrorIs(t, err, location.ErrInvalid)
	require.ErrorContains(t, err, "TLS")
}

func port(t *testing.T, addr string) string {
	_, p, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	return p
}
