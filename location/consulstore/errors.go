package consulstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"

	"github.com/hashicorp/consul/api"

	"github.com/roamactors/roam/location"
)

// classify maps a Consul client error onto the contract's classes. A write
// whose request may have reached the server and whose answer is missing or
// a 5xx is indeterminate: the caller must re-read (docs/PROTOCOL.md §3.3). A request that
// provably never left (connection refused, context ended before sending) is
// unavailable. A refusal of the ACL token is ErrPermissionDenied, and a
// failed TLS handshake ErrInvalid (a configuration error, see
// location.ErrInvalid): neither is retried, and neither request was
// served, so neither is indeterminate even for a write.
func classify(op string, err error, write bool) error {
	if err == nil {
		return nil
	}
	if aclDenied(err) {
		return fmt.Errorf("%w: %s: consul refused the ACL token (Config.Token, CONSUL_HTTP_TOKEN): %w", location.ErrPermissionDenied, op, err)
	}
	if tlsFailed(err) {
		return fmt.Errorf("%w: %s: TLS with consul failed, a configuration error "+
			"(the CA, the client certificate, the server name, or http:// against https: see Config.TLS and CONSUL_CACERT, CONSUL_CLIENT_CERT, CONSUL_TLS_SERVER_NAME, CONSUL_HTTP_SSL): %w",
			location.ErrInvalid, op, err)
	}
	var se api.StatusError
	if errors.As(err, &se) {
		switch {
		case se.Code == 404:
			return fmt.Errorf("%w: %s: %w", location.ErrNotFound, op, err)
		case se.Code == 413:
			return fmt.Errorf("%w: %s: %w", location.ErrTooLarge, op, err)
		case se.Code == 429:
			return fmt.Errorf("%w: %s: %w", location.ErrUnavailable, op, err)
		case se.Code >= 400 && se.Code < 500:
			return fmt.Errorf("%w: %s: %w", location.ErrInvalid, op, err)
		}
		// 5xx: the server may have applied a write before failing.
	}
	if neverSent(err) {
		return fmt.Errorf("%w: %s: %w", location.ErrUnavailable, op, err)
	}
	if write {
		return fmt.Errorf("%w: %s: %w", location.ErrIndeterminate, op, err)
	}
	return fmt.Errorf("%w: %s: %w", location.ErrUnavailable, op, err)
}

// neverSent reports a request that provably never left: the connection
// was refused or could not be made.
func neverSent(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || isDialError(err)
}

func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// ctxUnavailable reports a context that ended before a request was sent.
func ctxUnavailable(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %s: %w", location.ErrUnavailable, op, err)
	}
	return nil
}

// Consul's words for a refused token: acl.ErrPermissionDenied (a token
// without the rule: "Permission denied: token with AccessorID '…' lacks
// permission 'key:write' on …") and acl.ErrNotFound (an unknown token).
func deniedText(s string) bool {
	return strings.Contains(s, "Permission denied") || strings.Contains(s, "ACL not found")
}

// aclDenied reports Consul refusing the request's token: HTTP 401 or 403
// (Consul answers 403), a rolled-back transaction (409) whose ops were
// refused, or the same words in the error api.Txn makes of a status it
// does not keep ("Failed request: ACL not found").
func aclDenied(err error) bool {
	var se api.StatusError
	if errors.As(err, &se) {
		return se.Code == 401 || se.Code == 403 || se.Code == 409 && deniedText(se.Body)
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "Failed request: ") && deniedText(msg)
}

// deniedOps names the ops of a rolled-back transaction that Consul refused
// for the token, or is "" when it refused none.
func deniedOps(resp *api.TxnResponse) string {
	if resp == nil {
		return ""
	}
	var parts []string
	for _, e := range resp.Errors {
		if deniedText(e.What) {
			parts = append(parts, fmt.Sprintf("op %d: %s", e.OpIndex, e.What))
		}
	}
	return strings.Join(parts, "; ")
}

// filtered reports a read whose answer Consul filtered for the token: it
// does not say that it hid keys or sessions, except in a header (and not
// for the anonymous token), and an answer with holes must not pass for
// the store's state.
func filtered(op string, meta *api.QueryMeta) error {
	if meta != nil && meta.ResultsFilteredByACLs {
		return fmt.Errorf("%w: %s: consul hid results the ACL token may not read", location.ErrPermissionDenied, op)
	}
	return nil
}

// tlsFailed reports a TLS handshake that failed, whose request was
// therefore never served: the client did not trust the server's
// certificate (unknown CA, another name, expired), the server asked for a
// client certificate the store cannot give (clientCertificate), the
// server refused the client's (a TLS alert), or one side spoke plain HTTP
// to the other's HTTPS.
//
// One case stays racy: a client certificate that suits the server's list
// of acceptable CAs and is refused all the same (expired, revoked, not
// verifiable). Under TLS 1.3 the server refuses it only after the client
// has finished its side of the handshake and sent its request, so the
// call may see the alert (this class) or a reset connection, which is
// indistinguishable from a server dying mid-request: unavailable, or
// indeterminate for a write.
func tlsFailed(err error) bool {
	var verify *tls.CertificateVerificationError
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var record tls.RecordHeaderError
	var op *net.OpError
	var se api.StatusError
	var cert clientCertError
	switch {
	case errors.As(err, &cert):
		return true // the store ended the handshake itself
	case errors.As(err, &verify), errors.As(err, &unknownCA), errors.As(err, &hostname), errors.As(err, &invalid):
		return true
	case errors.As(err, &record):
		return true // the server's answer is not TLS
	case errors.As(err, &op) && op.Op == "remote error":
		return true // a TLS alert from the server: it refused the handshake
	case errors.As(err, &se):
		// Go's HTTPS server (Consul's) answering plain HTTP.
		return se.Code == 400 && strings.Contains(se.Body, "HTTP request to an HTTPS server")
	}
	// net/http's words for a plain HTTP answer to a TLS handshake.
	return strings.Contains(err.Error(), "server gave HTTP response to HTTPS client")
}
