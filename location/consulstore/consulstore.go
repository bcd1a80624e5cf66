// Package consulstore is the Location Store on Consul KV
// (docs/PROTOCOL.md §3, §3.6):
// check-and-set writes, multi-key transactions (/v1/txn), sessions as owner
// leases (TTL, behaviour delete, no lock delay), consistent reads for every
// ownership decision, and records stored as readable protojson so that
// `consul kv get` shows them.
//
// StoreVersion is Consul's ModifyIndex. Consul does not move ModifyIndex for
// a write of an identical value, so every stored value carries a write
// sequence (the expected version + 1) that makes each accepted write new.
package consulstore

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// Config configures a Store. A field left empty takes its value from the
// standard CONSUL_* environment variables, as the Consul client reads them
// (api.DefaultNonPooledConfig), else from the default its comment names; a
// field that is set wins over the environment. docs/CONSUL.md has the
// ACL policy roam needs and the error class of each failure.
type Config struct {
	// Address of the Consul HTTP API, host:port: the one agent the store
	// talks to. An "https://" scheme makes it HTTPS; an "http://" scheme
	// makes it plain HTTP even with CONSUL_HTTP_SSL set (and then TLS must
	// be empty). Without a scheme it is HTTPS when TLS has any field set
	// or CONSUL_HTTP_SSL is true, else plain HTTP. Default, when Addresses
	// is empty too: CONSUL_HTTP_ADDR (host:port, or with a scheme as
	// above, except that an "http://" there does not override
	// CONSUL_HTTP_SSL, as for the consul command), else "127.0.0.1:8500".
	Address string
	// Addresses are the HTTP API addresses (host:port, each with an
	// optional scheme as for Address) of several agents of one Consul
	// cluster, so that the store outlives any one of them: a call goes to
	// the agent that last answered, and a call that got no answer from it
	// moves on to the next address (see Store). Set Address or Addresses,
	// not both. Default: Address alone.
	Addresses []string
	// Prefix of every key roam writes. Default "roam". It must not start or
	// end with '/'. The ACL policy must grant write on it (docs/CONSUL.md).
	Prefix string
	// Token is the ACL token sent with every request. Default: the content
	// of the file CONSUL_HTTP_TOKEN_FILE names, else CONSUL_HTTP_TOKEN,
	// else none (Consul then applies its anonymous token's policy).
	Token string
	// TLS configures HTTPS to the agents.
	TLS TLSConfig
}

// TLSConfig is the client side of HTTPS to Consul's HTTP API, for every
// agent of Config. The agents' certificates are always verified: there is
// no field to turn that off. (The Consul client's own switch,
// CONSUL_HTTP_SSL_VERIFY=false, still does; never set it outside a test.)
type TLSConfig struct {
	// CAFile is a PEM file of the CA certificates that sign the agents'
	// certificates; CAPath is a directory of such files. Set either. If
	// either is set, both replace the environment's. Default:
	// CONSUL_CACERT and CONSUL_CAPATH, else the system's roots.
	CAFile string
	CAPath string
	// CertFile and KeyFile are a client certificate and its key (PEM), for
	// agents that verify incoming HTTPS connections (verify_incoming). Set
	// both or neither. Default: CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY,
	// else none.
	CertFile string
	KeyFile  string
	// ServerName is the name the agents' certificates must be valid for,
	// when it is not the host of their address (Consul's convention is
	// server.<datacenter>.<domain>). Default: CONSUL_TLS_SERVER_NAME, else
	// each address's host.
	ServerName string
}

// ACLPolicy is the least Consul ACL policy (rules in HCL) that a Store
// with prefix needs ("" is the default prefix): write on the keys under
// the prefix (KV reads and writes, transactions), and write on the
// sessions of every node — an owner lease is a session on the node of the
// agent that created it, renewed and ended through any agent, and every
// roam node checks the others' leases. Nothing else: no agent, node,
// service or operator rule. The package's tests run the Location Store
// contract suite with a token of exactly this policy.
func ACLPolicy(prefix string) string {
	if prefix == "" {
		prefix = "roam"
	}
	return fmt.Sprintf("key_prefix %q {\n  policy = \"write\"\n}\nsession_prefix \"\" {\n  policy = \"write\"\n}\n", prefix+"/")
}

// set reports whether any field is set.
func (t TLSConfig) set() bool { return t != TLSConfig{} }

// Store is the Location Store on Consul.
//
// With several agent addresses, a call goes to the agent that answered
// last. A call that gets no answer from it (a transport error, not a
// Consul answer) is tried on the next address, in order, while its context
// lasts — but a write only when its request provably never left (the
// connection was refused, or could not be made, or its TLS handshake
// failed): a write whose request may have reached a server is
// ErrIndeterminate, as with one agent, and the caller settles it by
// re-reading. Reads and lease renewals (idempotent) move on after any
// transport error, and an attempt that hangs gets half the time left when
// another agent remains. A lease is a Consul session without health
// checks, so it is the cluster's, not its agent's: it is renewed, checked
// and used through any agent.
type Store struct {
	agents []*api.Client // in Config order
	// transports are the agents' HTTP transports, whose kept connections
	// are dropped after a failure without an answer (on).
	transports []*http.Transport
	// cur is the index of the agent calls go to first: the last one that
	// answered.
	cur    atomic.Int32
	prefix string
	// token is Config.Token, sent with each request so that it wins over
	// whatever token the client took from the environment.
	token string
	// reads and writes combine concurrent one-key reads and Applies into
	// shared transactions (batch.go).
	reads, writes batcher
	// blocking holds a token per Watch on a blocking query; a Watch that
	// finds none free polls (batch.go).
	blocking chan struct{}
	// listings keeps, for a short while, the keys a List page left for
	// the next page of the same listing (listCursor).
	listings listings
	// beats keeps, per lease, the descriptor its last heartbeat wrote
	// (beat): the next one writes over it without reading it first.
	beats sync.Map
}

// beat is the descriptor a lease's last heartbeat left: its key, stored
// value and index.
type beat struct {
	key   string
	value *messages.StoredValue
	index uint64
}

// Consul lists keys under a prefix, all of them: it has no "after"
// cursor. A listing that pages through N records would fetch all N keys
// for each page, O(N²) in all (a start-up scan of 200,000 records). So a
// page keeps the sorted keys it did not reach, and the next page of the
// same listing (its After is this page's Next) starts from them instead of
// listing again, for listingFresh. A key created meanwhile after the
// cursor is missed by that listing, as it would be had it been created
// just after a listing that read everything at once; a key deleted
// meanwhile is skipped when its record is read.
const (
	listingFresh = 10 * time.Second
	maxListings  = 16
)

type listCursor struct {
	kind location.Kind
	next string
}

type listing struct {
	keys []string
	at   time.Time
}

type listings struct {
	mu sync.Mutex
	m  map[listCursor]listing
}

// take returns the keys kept for the page after c, if fresh.
func (l *listings) take(c listCursor) ([]string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.m[c]
	delete(l.m, c)
	if !ok || time.Since(e.at) > listingFresh {
		return nil, false
	}
	return e.keys, true
}

// keep keeps keys for the page after c.
func (l *listings) keep(c listCursor, keys []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[listCursor]listing{}
	}
	now := time.Now()
	for k, e := range l.m {
		if now.Sub(e.at) > listingFresh {
			delete(l.m, k)
		}
	}
	if len(l.m) >= maxListings {
		for k := range l.m { // any one: a listing not continued in time is listed again
			delete(l.m, k)
			break
		}
	}
	l.m[c] = listing{keys: keys, at: now}
}

var _ location.Store = (*Store)(nil)

// dialTimeout bounds connecting to one agent when there are others to try:
// connecting to a live agent takes milliseconds, and a host that is gone
// must not take a call's whole deadline.
const dialTimeout = 2 * time.Second

// maxIdleConns is how many idle connections to one agent the client
// keeps for reuse.
const maxIdleConns = 64

// defaultAddress is the agent address when neither Config nor
// CONSUL_HTTP_ADDR names one.
const defaultAddress = "127.0.0.1:8500"

// New returns a Store for cfg. It does not contact Consul; it reads the
// token file and the TLS files, and a missing or malformed one is
// ErrInvalid.
func New(cfg Config) (*Store, error) {
	addrs, fromEnv, err := cfg.addresses()
	if err != nil {
		return nil, err
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "roam"
	}
	if strings.HasPrefix(cfg.Prefix, "/") || strings.HasSuffix(cfg.Prefix, "/") {
		return nil, fmt.Errorf("%w: consul prefix %q must not start or end with '/'", location.ErrInvalid, cfg.Prefix)
	}
	if (cfg.TLS.CertFile == "") != (cfg.TLS.KeyFile == "") {
		return nil, fmt.Errorf("%w: consul TLS: set both CertFile and KeyFile, or neither", location.ErrInvalid)
	}
	s := &Store{prefix: cfg.Prefix, token: cfg.Token}
	s.blocking = make(chan struct{}, maxBlocking)
	s.reads = batcher{what: "read", send: s.sendRead}
	s.writes = batcher{what: "apply", send: s.sendWrite, write: true}
	for _, addr := range addrs {
		ac, err := cfg.client(addr, fromEnv, len(addrs) > 1)
		if err != nil {
			return nil, err
		}
		client, err := api.NewClient(ac)
		if err != nil {
			return nil, fmt.Errorf("%w: consul client for %q: %w", location.ErrInvalid, addr, err)
		}
		s.agents = append(s.agents, client)
		s.transports = append(s.transports, ac.Transport)
	}
	return s, nil
}

// client is the Consul client configuration for one agent address:
// the environment's (api.DefaultNonPooledConfig), overridden by every
// field cfg sets.
func (cfg Config) client(addr string, fromEnv, several bool) (*api.Config, error) {
	ac := api.DefaultNonPooledConfig()
	ac.Address = addr
	scheme, _, hasScheme := strings.Cut(addr, "://")
	switch {
	case hasScheme && scheme == "http" && !fromEnv:
		if cfg.TLS.set() {
			return nil, fmt.Errorf("%w: consul address %q is plain http:// but TLS settings are given", location.ErrInvalid, addr)
		}
		ac.Scheme = "http" // the client keeps CONSUL_HTTP_SSL's https otherwise
	case cfg.TLS.set():
		ac.Scheme = "https"
	}
	if cfg.Token != "" {
		ac.Token, ac.TokenFile = cfg.Token, ""
	}
	t := &ac.TLSConfig
	if cfg.TLS.CAFile != "" || cfg.TLS.CAPath != "" {
		t.CAFile, t.CAPath, t.CAPem = cfg.TLS.CAFile, cfg.TLS.CAPath, nil
	}
	if cfg.TLS.CertFile != "" {
		t.CertFile, t.KeyFile, t.CertPEM, t.KeyPEM = cfg.TLS.CertFile, cfg.TLS.KeyFile, nil, nil
	}
	if cfg.TLS.ServerName != "" {
		t.Address = cfg.TLS.ServerName
	}
	// Keep connections open between requests: a new TCP (and TLS)
	// connection per request cost more than the request itself, and a
	// drain makes thousands a second. A pooled connection that turns out
	// dead is one the transport retries only when nothing was sent; a
	// write cut after that is indeterminate, as any cut write is.
	ac.Transport.DisableKeepAlives = false
	ac.Transport.MaxIdleConnsPerHost = maxIdleConns
	ac.Transport.IdleConnTimeout = 90 * time.Second
	// No gzip: Consul compresses every response above a few hundred
	// bytes when asked, and Go's transport asks by default. A store's
	// answers are small records, most often from a local agent, so the
	// compression costs the agent's CPU and the inflating ours (a tenth
	// of a drain's CPU) and saves no time.
	ac.Transport.DisableCompression = true
	if several {
		ac.Transport.DialContext = (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext
	}
	// The HTTP client is built here, from this TLS configuration, on this
	// transport (with its dialer): api.NewClient would build it from its
	// own merge of the environment, in which CONSUL_CACERT wins over a
	// Config.TLS.CAPath. HTTPS dials through DialContext and then does
	// the handshake with the transport's TLSClientConfig.
	hc, err := api.NewHttpClient(ac.Transport, ac.TLSConfig)
	if err != nil {
		return nil, fmt.Errorf("%w: consul TLS configuration for %q: %w", location.ErrInvalid, addr, err)
	}
	if tc := ac.Transport.TLSClientConfig; tc != nil {
		certs := tc.Certificates
		tc.Certificates, tc.GetClientCertificate = nil, clientCertificate(certs)
	}
	ac.HttpClient = hc
	return ac, nil
}

// clientCertificate answers an agent's request for a client certificate
// (Consul asks only when it verifies incoming HTTPS, and then refuses a
// client without one it trusts) with the configured one, if it suits the
// agent; otherwise it ends the handshake, so that the request is provably
// never sent and the failure is a TLS configuration error. Left to
// crypto/tls, the client would send no certificate, and under TLS 1.3 the
// agent's refusal would come after the client had sent its request: the
// call would see a reset connection, unavailable or indeterminate.
func clientCertificate(certs []tls.Certificate) func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if len(certs) == 0 {
			return nil, clientCertError("none is configured (Config.TLS.CertFile and KeyFile, CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY)")
		}
		var reasons []string
		for i := range certs {
			err := cri.SupportsCertificate(&certs[i])
			if err == nil {
				return &certs[i], nil
			}
			reasons = append(reasons, err.Error())
		}
		return nil, clientCertError("the configured one does not suit it: " + strings.Join(reasons, "; "))
	}
}

// clientCertError ends a handshake whose agent asks for a client
// certificate the store cannot give.
type clientCertError string

func (e clientCertError) Error() string {
	return "consul asks for a TLS client certificate (it verifies incoming connections) and " + string(e)
}

// addresses checks the agent addresses and fills the default: fromEnv
// when it is CONSUL_HTTP_ADDR's.
func (c Config) addresses() (addrs []string, fromEnv bool, err error) {
	switch {
	case c.Address != "" && len(c.Addresses) > 0:
		return nil, false, fmt.Errorf("%w: consul: set Address or Addresses, not both", location.ErrInvalid)
	case len(c.Addresses) == 0 && c.Address == "":
		if env := os.Getenv(api.HTTPAddrEnvName); env != "" {
			return []string{env}, true, nil
		}
		return []string{defaultAddress}, false, nil
	case len(c.Addresses) == 0:
		return []string{c.Address}, false, nil
	}
	seen := map[string]bool{}
	for _, a := range c.Addresses {
		if err := validAddress(a); err != nil {
			return nil, false, err
		}
		if seen[a] {
			return nil, false, fmt.Errorf("%w: consul address %q given twice", location.ErrInvalid, a)
		}
		seen[a] = true
	}
	return slices.Clone(c.Addresses), false, nil
}

// ParseAddresses splits a comma-separated list of agent addresses, as a
// command line gives it, for Config.Addresses.
func ParseAddresses(list string) []string {
	var out []string
	for _, a := range strings.Split(list, ",") {
		out = append(out, strings.TrimSpace(a))
	}
	return out
}

// validAddress accepts host:port, optionally after an http:// or https://
// scheme, as the Consul client does.
func validAddress(a string) error {
	hostPort := a
	if scheme, rest, ok := strings.Cut(a, "://"); ok {
		if scheme != "http" && scheme != "https" {
			return fmt.Errorf("%w: consul address %q: scheme %q is not http or https", location.ErrInvalid, a, scheme)
		}
		hostPort = rest
	}
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("%w: consul address %q is not host:port", location.ErrInvalid, a)
	}
	return nil
}

// callKind says which failures of a call may be tried on the next agent.
type callKind int

const (
	// writeCall changes the store: tried again elsewhere only if its
	// request provably never left.
	writeCall callKind = iota
	// readCall is idempotent (a read, a renewal): tried again elsewhere
	// after any failure without a Consul answer; an attempt gets half the
	// time left when another agent remains, so a hung agent does not take
	// it all.
	readCall
	// blockingCall is an idempotent blocking query (Watch): like readCall,
	// but an attempt may take all the time left (it waits on purpose).
	blockingCall
)

// on runs fn against the agents, starting with the one that answered
// last, until one answers or fn fails in a way that the next agent cannot
// help (see callKind), and returns fn's last error, unclassified — except
// that when an agent failed the TLS handshake and the last one could not
// be reached at all, it returns the TLS failure: no agent served the
// call, and the configuration error is what the operator must see. fn
// must use the context it is given for its request.
func (s *Store) on(ctx context.Context, kind callKind, fn func(context.Context, *api.Client) error) error {
	n := len(s.agents)
	first := int(s.cur.Load())
	var err, tlsErr error
	for i := 0; i < n; i++ {
		k := (first + i) % n
		actx, cancel := ctx, context.CancelFunc(func() {})
		if kind == readCall && i < n-1 {
			if dl, ok := ctx.Deadline(); ok {
				actx, cancel = context.WithTimeout(ctx, time.Until(dl)/2)
			}
		}
		err = fn(actx, s.agents[k])
		cancel()
		if err != nil && kind != blockingCall && !errors.As(err, new(api.StatusError)) && !answered(err) && !errors.Is(err, context.Canceled) {
			// No answer in time: a kept connection may lead nowhere (the
			// agent's host cut off). Dial afresh next time, where a
			// failure to connect proves a write was never sent and can go
			// to the next agent. (A watch waits on purpose; a caller that
			// cancels says nothing about the connection.)
			s.transports[k].CloseIdleConnections()
		}
		if err != nil && tlsFailed(err) {
			tlsErr = err
		}
		last := i == n-1
		if err == nil || last || ctx.Err() != nil || !tryNext(err, kind) {
			if k != first {
				s.cur.Store(int32(k)) // it answered; the one before did not
			}
			if tlsErr != nil && err != nil && neverSent(err) {
				return tlsErr
			}
			return err
		}
	}
	return err
}

// tryNext reports whether a call that failed with err may be tried on
// another agent: the agent gave no answer, and for a write the request
// never left or was never served (its TLS handshake failed); a write cut
// after it may have reached a server is indeterminate and must be settled
// by a read, not sent again.
func tryNext(err error, kind callKind) bool {
	if kind == writeCall {
		return neverSent(err) || tlsFailed(err)
	}
	var se api.StatusError
	return !errors.As(err, &se)
}

var jsonOut = protojson.MarshalOptions{UseProtoNames: true}

func encode(v *messages.StoredValue) ([]byte, error) { return jsonOut.Marshal(v) }

func decode(b []byte) (*messages.StoredValue, error) {
	v := &messages.StoredValue{}
	if err := protojson.Unmarshal(b, v); err != nil {
		return nil, err
	}
	return v, nil
}

func (s *Store) recordValue(expected location.StoreVersion, rec *location.Record) ([]byte, error) {
	return encode(&messages.StoredValue{WriteSeq: uint64(expected) + 1, Value: &messages.StoredValue_Record{Record: rec}})
}

func (s *Store) versioned(key location.AuthorityKey, pair *api.KVPair) (location.Versioned, error) {
	if pair == nil || (pair.ModifyIndex == 0) {
		return location.Versioned{Key: key}, nil
	}
	v, err := decode(pair.Value)
	if err != nil || v.GetRecord() == nil {
		return location.Versioned{}, fmt.Errorf("%w: key %s holds no location record: %v", location.ErrInvalid, pair.Key, err)
	}
	return location.Versioned{Key: key, Record: v.GetRecord(), Version: location.StoreVersion(pair.ModifyIndex)}, nil
}

// consistent is the options of a consistent read.
func (s *Store) consistent(ctx context.Context) *api.QueryOptions {
	return (&api.QueryOptions{RequireConsistent: true, Token: s.token}).WithContext(ctx)
}

// writing is the options of a write.
func (s *Store) writing(ctx context.Context) *api.WriteOptions {
	return (&api.WriteOptions{Token: s.token}).WithContext(ctx)
}

// Read implements location.Store.
func (s *Store) Read(ctx context.Context, key location.AuthorityKey) (location.Versioned, error) {
	if err := key.Validate(); err != nil {
		return location.Versioned{}, err
	}
	pair, err := s.readBatched(ctx, s.recordKey(key))
	if err != nil {
		return location.Versioned{}, fmt.Errorf("read %s: %w", key, err)
	}
	v, err := s.versioned(key, pair)
	if err != nil {
		return v, err
	}
	if !v.Present() {
		return v, &location.KeyNotFound{Key: key}
	}
	return v, nil
}

// ReadKeys implements location.KeysReader: one read transaction, shared
// with other concurrent reads (readBatched).
func (s *Store) ReadKeys(ctx context.Context, keys ...location.AuthorityKey) ([]location.Versioned, error) {
	if err := location.ValidateReadKeys(keys); err != nil {
		return nil, err
	}
	ops := make(api.TxnOps, len(keys))
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = s.recordKey(k)
		ops[i] = &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVGetOrEmpty, Key: names[i]}}
	}
	a := s.reads.do(ctx, ops, nil, 0)
	if a.err != nil {
		return nil, fmt.Errorf("read %d keys: %w", len(keys), a.err)
	}
	found := make(map[string]*api.KVPair, len(keys))
	for _, r := range a.resp.Results {
		if r.KV != nil {
			found[r.KV.Key] = r.KV
		}
	}
	out := make([]location.Versioned, len(keys))
	for i, k := range keys {
		pair, ok := found[names[i]]
		if !ok {
			return nil, fmt.Errorf("%w: read %s: consul hid the key: the ACL token may not read it", location.ErrPermissionDenied, k)
		}
		v, err := s.versioned(k, pair)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// readMany reads keys consistently, in read-only transactions of at most
// MaxApplyOps keys (sendRead).
func (s *Store) readMany(ctx context.Context, keys []string) (map[string]*api.KVPair, error) {
	out := make(map[string]*api.KVPair, len(keys))
	for start := 0; start < len(keys); start += location.MaxApplyOps {
		end := min(start+location.MaxApplyOps, len(keys))
		ops := make(api.TxnOps, 0, end-start)
		for _, k := range keys[start:end] {
			ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVGetOrEmpty, Key: k}})
		}
		a := s.sendRead(ctx, ops)
		if a.err != nil {
			return nil, a.err
		}
		for _, r := range a.resp.Results {
			if r.KV != nil && r.KV.ModifyIndex != 0 {
				out[r.KV.Key] = r.KV
			}
		}
	}
	return out, nil
}

func txnErrors(resp *api.TxnResponse) string {
	if resp == nil {
		return "no response"
	}
	var parts []string
	for _, e := range resp.Errors {
		parts = append(parts, fmt.Sprintf("op %d: %s", e.OpIndex, e.What))
	}
	return strings.Join(parts, "; ")
}

// List implements location.Store. The cursor is the escaped key segment of
// the last record returned; records come in escaped-key order.
func (s *Store) List(ctx context.Context, kind location.Kind, page location.PageRequest) (location.Page, error) {
	if err := (location.AuthorityKey{Kind: kind, ID: "x"}).Validate(); err != nil {
		return location.Page{}, err
	}
	if err := page.Validate(); err != nil {
		return location.Page{}, err
	}
	prefix := s.kindPrefix(kind)
	keys, kept := []string(nil), false
	if page.After != "" {
		keys, kept = s.listings.take(listCursor{kind, page.After})
	}
	if !kept {
		var meta *api.QueryMeta
		err := s.on(ctx, readCall, func(ctx context.Context, c *api.Client) (err error) {
			keys, meta, err = c.KV().Keys(prefix, "", s.consistent(ctx))
			return err
		})
		if err != nil {
			return location.Page{}, classify("list", err, false)
		}
		if err := filtered("list", meta); err != nil {
			return location.Page{}, err
		}
		sort.Strings(keys)
		after := prefix + page.After
		i := sort.SearchStrings(keys, after)
		if page.After != "" && i < len(keys) && keys[i] == after {
			i++
		}
		keys = keys[i:]
	}
	var out location.Page
	bytes := 0
	for len(keys) > 0 {
		batch := keys[:min(len(keys), page.Size-len(out.Items), location.MaxApplyOps)]
		pairs, err := s.readMany(ctx, batch)
		if err != nil {
			return location.Page{}, err
		}
		for _, k := range batch {
			pair := pairs[k]
			if pair == nil {
				continue // deleted since the key listing
			}
			id, err := unescapeID(strings.TrimPrefix(k, prefix))
			if err != nil {
				return location.Page{}, fmt.Errorf("%w: %w", location.ErrInvalid, err)
			}
			v, err := s.versioned(location.Key(kind, id), pair)
			if err != nil {
				return location.Page{}, err
			}
			n := location.EncodedSize(v.Record)
			if bytes+n > location.MaxPageBytes {
				// A record is at most MaxRecordBytes, so the page holds one.
				out.Next = escapeID(out.Items[len(out.Items)-1].Key.ID)
				s.listings.keep(listCursor{kind, out.Next}, keys[slices.Index(keys, k):])
				return out, nil
			}
			bytes += n
			out.Items = append(out.Items, v)
		}
		keys = keys[len(batch):]
		if len(out.Items) == page.Size {
			if len(keys) > 0 {
				out.Next = escapeID(out.Items[len(out.Items)-1].Key.ID)
				s.listings.keep(listCursor{kind, out.Next}, keys)
			}
			return out, nil
		}
	}
	return out, nil
}

// CompareAndSet implements location.Store.
func (s *Store) CompareAndSet(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion, rec *location.Record) (location.StoreVersion, error) {
	return location.CompareAndSetByApply(ctx, s.Apply, key, expected, rec)
}

// Apply implements location.Store.
//
// Each op is one Consul transaction op, except that a slot op may add
// some (location.ApplyOpCount counts them, so the transaction stays
// within Consul's 128): an OpTakeSlot is a check-not-exists of the slot
// and its lock with the lease's session, and the first OpTakeSlot or
// OpSetSlot of a (node, lease) that no OpCheckLease checks brings that
// check, a check-session of the node's descriptor. A lock alone would not
// do: it also succeeds for a live session that holds another node, or
// over a slot the same session already holds.
func (s *Store) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	if err := location.ValidateOps(ops); err != nil {
		return nil, err
	}
	n := location.ApplyOpCount(ops)
	txn := make(api.TxnOps, 0, n)
	// of[j] is the op that transaction op j belongs to; leaseAt[j] marks
	// the lease checks, whose failure is ErrLeaseEnded, not a conflict.
	of := make([]int, 0, n)
	leaseAt := make([]bool, 0, n)
	add := func(i int, lease bool, op *api.KVTxnOp) {
		txn = append(txn, &api.TxnOp{KV: op})
		of = append(of, i)
		leaseAt = append(leaseAt, lease)
	}
	type nodeLease struct {
		node  location.NodeKey
		lease location.LeaseID
	}
	checked := map[nodeLease]bool{}
	for _, op := range ops {
		if op.Kind == location.OpCheckLease {
			checked[nodeLease{op.Node, op.Lease}] = true
		}
	}
	keys := make([]string, 0, len(ops))
	size := 0
	for i, op := range ops {
		switch op.Kind {
		case location.OpCheckLease:
			// The descriptor key is locked by the node's session at its claim;
			// Consul fails check-session once the session is invalidated
			// (behaviour delete removes the key too).
			add(i, true, &api.KVTxnOp{Verb: api.KVCheckSession, Key: s.nodeKey(op.Node), Session: string(op.Lease)})
			continue
		case location.OpTakeSlot, location.OpSetSlot, location.OpFreeSlot:
			// Slot keys take part in the batcher's disjointness like
			// record keys: a take and a free of one slot never share a
			// transaction, where the take's check would not see the free.
			k := s.slotKey(op.Node, op.Slot)
			keys = append(keys, k)
			size += len(k)
			if op.Kind == location.OpFreeSlot {
				add(i, false, &api.KVTxnOp{Verb: api.KVDelete, Key: k})
				continue
			}
			if nl := (nodeLease{op.Node, op.Lease}); !checked[nl] {
				checked[nl] = true
				add(i, true, &api.KVTxnOp{Verb: api.KVCheckSession, Key: s.nodeKey(op.Node), Session: string(op.Lease)})
			}
			val, err := encodeSlot(op.Key, op.Pending)
			if err != nil {
				return nil, fmt.Errorf("%w: encode slot %d of %s: %w", location.ErrInvalid, op.Slot, op.Node, err)
			}
			size += len(val)
			if op.Kind == location.OpTakeSlot {
				add(i, false, &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: k})
			}
			add(i, false, &api.KVTxnOp{Verb: api.KVLock, Key: k, Value: val, Session: string(op.Lease)})
			continue
		}
		if op.Kind == location.OpDeleteRoot {
			// As DeleteRoot, in one transaction: the manifest, then its
			// parts (the trailing '/' keeps other roots out).
			mk := s.rootKey(op.RootKey)
			keys = append(keys, mk)
			size += 2 * len(mk)
			add(i, false, &api.KVTxnOp{Verb: api.KVDelete, Key: mk})
			add(i, false, &api.KVTxnOp{Verb: api.KVDeleteTree, Key: mk + "/"})
			continue
		}
		if op.Kind == location.OpCheckNoCheckpoint {
			// The manifest is what makes a checkpoint (checkpoints.go): its
			// parts are written before it and go after it.
			k := s.checkpointKey(op.Key)
			keys = append(keys, k)
			size += len(k)
			add(i, false, &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: k})
			continue
		}
		if op.Kind == location.OpCreateRoot {
			// The root's part and its manifest, as PutRoot writes a root of
			// one part (roots.go); the manifest's create is the op's check.
			ref := location.NewRootRef(op.RootKey, op.Data)
			manifest, err := json.Marshal(newManifest(ref))
			if err != nil {
				return nil, fmt.Errorf("%w: encode manifest of root %q: %w", location.ErrInvalid, op.RootKey, err)
			}
			if len(op.Data) > 0 {
				part := s.rootPartKey(op.RootKey, ref.SHA256, 0)
				keys = append(keys, part)
				size += len(part) + len(op.Data)
				add(i, false, &api.KVTxnOp{Verb: api.KVSet, Key: part, Value: op.Data})
			}
			mk := s.rootKey(op.RootKey)
			keys = append(keys, mk)
			size += len(mk) + len(manifest)
			add(i, false, &api.KVTxnOp{Verb: api.KVCAS, Key: mk, Value: manifest, Index: 0})
			continue
		}
		k := s.recordKey(op.Key)
		keys = append(keys, k)
		size += len(k)
		switch op.Kind {
		case location.OpCreate, location.OpUpdate:
			val, err := s.recordValue(op.Version, op.Record)
			if err != nil {
				return nil, fmt.Errorf("%w: encode %s: %w", location.ErrInvalid, op.Key, err)
			}
			add(i, false, &api.KVTxnOp{Verb: api.KVCAS, Key: k, Value: val, Index: uint64(op.Version)})
			size += len(val)
		case location.OpDelete:
			add(i, false, &api.KVTxnOp{Verb: api.KVDeleteCAS, Key: k, Index: uint64(op.Version)})
		case location.OpCheck:
			if op.Version == 0 {
				add(i, false, &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: k})
			} else {
				add(i, false, &api.KVTxnOp{Verb: api.KVCheckIndex, Key: k, Index: uint64(op.Version)})
			}
		}
	}
	a := s.writes.do(ctx, txn, keys, size)
	resp, failed, err := a.resp, a.failed, a.err
	if err != nil {
		return nil, err
	}
	if failed != nil {
		// Consul names the transaction's ops; the caller knows its own.
		failedOps := []int{}
		for _, j := range failed {
			if j < 0 || j >= len(of) {
				return nil, fmt.Errorf("%w: apply: consul named op %d of a transaction of %d", location.ErrUnavailable, j, len(of))
			}
			i := of[j]
			if leaseAt[j] {
				return nil, fmt.Errorf("%w: lease %s does not hold %s (op %d)", location.ErrLeaseEnded, ops[i].Lease, ops[i].Node, i)
			}
			if !slices.Contains(failedOps, i) {
				failedOps = append(failedOps, i)
			}
		}
		sort.Ints(failedOps)
		return nil, s.conflict(ctx, "apply", ops, failedOps)
	}
	written := make(map[string]uint64, len(resp.Results))
	for _, r := range resp.Results {
		if r.KV != nil {
			written[r.KV.Key] = r.KV.ModifyIndex
		}
	}
	out := make([]location.StoreVersion, len(ops))
	for i, op := range ops {
		switch op.Kind {
		case location.OpCreate, location.OpUpdate:
			out[i] = location.StoreVersion(written[s.recordKey(op.Key)])
		case location.OpCheck:
			out[i] = op.Version
		}
	}
	return out, nil
}

// writeTxn sends a transaction with writes. It returns the response, or the
// failed op indexes when Consul rolled it back (nothing applied), or a
// classified error.
func (s *Store) writeTxn(ctx context.Context, what string, txn api.TxnOps) (*api.TxnResponse, []int, error) {
	if err := ctxUnavailable(ctx, what); err != nil {
		return nil, nil, err
	}
	var resp api.TxnResponse
	err := s.on(ctx, writeCall, func(ctx context.Context, c *api.Client) error {
		_, err := c.Raw().Write("/v1/txn", txn, &resp, s.writing(ctx))
		return err
	})
	if err == nil {
		return &resp, nil, nil
	}
	var se api.StatusError
	if errors.As(err, &se) && se.Code == 409 {
		var rolledBack api.TxnResponse
		if jerr := json.Unmarshal([]byte(se.Body), &rolledBack); jerr != nil {
			// A 409 always means rolled back; the body only names the ops.
			return nil, []int{}, nil
		}
		// Consul checks every op against the token before applying any
		// and reports a refusal as a failed op: not a conflict.
		if denied := deniedOps(&rolledBack); denied != "" {
			return nil, nil, fmt.Errorf("%w: %s: consul refused the ACL token: %s", location.ErrPermissionDenied, what, denied)
		}
		failed := []int{}
		for _, e := range rolledBack.Errors {
			failed = append(failed, e.OpIndex)
		}
		return nil, failed, nil
	}
	return nil, nil, classify(what, err, true)
}

// conflict builds a *ConflictError with the current state of every key ops
// touch, read consistently after the rollback.
func (s *Store) conflict(ctx context.Context, what string, ops []location.Op, failed []int) error {
	c := &location.ConflictError{Op: what, FailedOps: failed}
	var keys []string
	var checked []location.Op
	for _, op := range ops {
		if op.Kind.OnRecord() {
			keys = append(keys, s.recordKey(op.Key))
			checked = append(checked, op)
		}
	}
	pairs, err := s.readMany(ctx, keys)
	if err != nil {
		return fmt.Errorf("%w (and reading the current records failed: %v)", c, err) // a conflict, not the read's class
	}
	for i, op := range checked {
		v, err := s.versioned(op.Key, pairs[keys[i]])
		if err != nil {
			return err
		}
		c.Current = append(c.Current, v)
	}
	return c
}

// Watch implements location.Store with Consul blocking queries, up to
// maxBlocking at once; a Watch beyond them polls with reads shared with
// the others' (pollWatch).
func (s *Store) Watch(ctx context.Context, key location.AuthorityKey, after location.StoreVersion) (location.Versioned, error) {
	if err := key.Validate(); err != nil {
		return location.Versioned{}, err
	}
	k := s.recordKey(key)
	select {
	case s.blocking <- struct{}{}:
		defer func() { <-s.blocking }()
	default:
		return s.pollWatch(ctx, key, k, after)
	}
	var wait uint64
	for {
		var pair *api.KVPair
		var meta *api.QueryMeta
		err := s.on(ctx, blockingCall, func(ctx context.Context, c *api.Client) (err error) {
			q := s.consistent(ctx)
			q.WaitIndex = wait
			q.WaitTime = 5 * time.Minute
			pair, meta, err = c.KV().Get(k, q)
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return location.Versioned{}, fmt.Errorf("%w: watch %s: %w", location.ErrUnavailable, key, ctx.Err())
			}
			return location.Versioned{}, classify("watch "+key.String(), err, false)
		}
		v, err := s.versioned(key, pair)
		if err != nil {
			return v, err
		}
		if v.Version != after {
			return v, nil
		}
		// Consul's index can go backwards (snapshot restore): start over.
		if meta.LastIndex < wait {
			wait = 0
		} else {
			wait = meta.LastIndex
		}
	}
}

// maxBlocking bounds a Store's blocking queries at once. Each is an HTTP
// request Consul holds and answers at the key's next change: cheap one at
// a time, but a drain watches hundreds of records for their commit, and
// those are cheaper read together (pollWatch).
const maxBlocking = 8

// pollWatch is Watch by reads: each joins the reads of the moment
// (readBatched), so the watches beyond maxBlocking cost a shared read
// transaction per round, not a request each. The pause between reads
// grows from 2 ms to 50 ms: a watch that waits long costs little, and a
// move's commit, which most watches wait for, comes within milliseconds.
func (s *Store) pollWatch(ctx context.Context, key location.AuthorityKey, k string, after location.StoreVersion) (location.Versioned, error) {
	pause := 2 * time.Millisecond
	first := true
	for {
		pair, err := s.readBatched(ctx, k)
		if err != nil {
			if ctx.Err() != nil {
				return location.Versioned{}, fmt.Errorf("%w: watch %s: %w", location.ErrUnavailable, key, ctx.Err())
			}
			return location.Versioned{}, fmt.Errorf("watch %s: %w", key, err)
		}
		if pair != nil && location.StoreVersion(pair.ModifyIndex) != after || pair == nil && after != 0 {
			return s.versioned(key, pair)
		}
		if first {
			// As the blocking Watch: a value that is no record is an
			// error at once, not a wait. Later reads of the same version
			// need no decoding.
			if v, err := s.versioned(key, pair); err != nil {
				return v, err
			}
			first = false
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return location.Versioned{}, fmt.Errorf("%w: watch %s: %w", location.ErrUnavailable, key, ctx.Err())
		case <-t.C:
		}
		pause = min(pause*3/2, 50*time.Millisecond)
	}
}

// ClaimNode implements location.Store.
func (s *Store) ClaimNode(ctx context.Context, node *location.NodeDescriptor, ttl time.Duration) (location.Lease, error) {
	if err := location.ValidateNode(node); err != nil {
		return location.Lease{}, err
	}
	if err := location.ValidateTTL(ttl); err != nil {
		return location.Lease{}, err
	}
	// No health checks: by default a session is tied to the agent node's
	// serfHealth check and ends as soon as gossip marks that node failed,
	// which may be well before the TTL — and the lease argument
	// (docs/FAULTS.md) rests on the store never ending a lease sooner
	// than TTL after the last renewal it applied. Only the TTL ends it.
	// It also makes the session the cluster's rather than its agent's:
	// renewed through any agent of Config.Addresses.
	var sid string
	err := s.on(ctx, writeCall, func(ctx context.Context, c *api.Client) (err error) {
		sid, _, err = c.Session().CreateNoChecks(&api.SessionEntry{
			Name:      sessionNamePrefix + node.GetMesh() + "/" + node.GetNodeRid(),
			TTL:       ttl.String(),
			Behavior:  api.SessionBehaviorDelete,
			LockDelay: -1, // sent as 0ms; leaving it unset means Consul's 15 s
		}, s.writing(ctx))
		return err
	})
	if err != nil {
		// A session nobody knows about expires by itself.
		return location.Lease{}, classify("create lease", err, true)
	}
	id := location.LeaseID(sid)
	stored := proto.Clone(node).(*location.NodeDescriptor)
	stored.LeaseId = sid
	nodeVal, err := encode(&messages.StoredValue{WriteSeq: 1, Value: &messages.StoredValue_Node{Node: stored}})
	if err != nil {
		return location.Lease{}, fmt.Errorf("%w: encode node: %w", location.ErrInvalid, err)
	}
	entryVal, err := s.recordValue(0, location.EntryClaim(stored, id))
	if err != nil {
		return location.Lease{}, fmt.Errorf("%w: encode entry claim: %w", location.ErrInvalid, err)
	}
	nk := s.nodeKey(location.NodeKeyOf(node))
	entry := location.Key(location.KindEntry, node.GetEntrySpotId())
	ek := s.recordKey(entry)
	ops := api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: nk}},
		{KV: &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: ek}},
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: nk, Value: nodeVal, Session: sid}},
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: ek, Value: entryVal, Session: sid}},
	}
	// A name is held by its node's session, so it is free again once that
	// lease ends (behaviour delete) or the node releases its claim.
	nameAt := -1
	if name := node.GetName(); name != "" {
		nameAt = len(ops)
		key := s.nameKey(node.GetMesh(), name)
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: key}},
			&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: key, Value: []byte(node.GetNodeRid()), Session: sid}})
	}
	_, failed, err := s.writeTxn(ctx, "claim node", ops)
	if err != nil || failed != nil {
		// Ending the session deletes anything it holds (behaviour delete),
		// so an indeterminate claim leaves nothing behind either way.
		_ = s.destroy(context.WithoutCancel(ctx), sid)
	}
	if err != nil {
		return location.Lease{}, err
	}
	if failed != nil {
		c := &location.ConflictError{Op: "claim node", FailedOps: failed}
		if pairs, rerr := s.readMany(ctx, []string{ek}); rerr == nil {
			if v, verr := s.versioned(entry, pairs[ek]); verr == nil {
				c.Current = append(c.Current, v)
			}
		}
		if slices.Contains(failed, nameAt) {
			return location.Lease{}, fmt.Errorf("%w: %q: %w", location.ErrNodeNameTaken, node.GetName(), c)
		}
		return location.Lease{}, c
	}
	return location.Lease{ID: id, TTL: ttl}, nil
}

// RenewLease implements location.Store.
func (s *Store) RenewLease(ctx context.Context, id location.LeaseID) error {
	if id == "" {
		return fmt.Errorf("%w: empty lease id", location.ErrInvalid)
	}
	// A renewal is idempotent: one sent again through another agent is
	// safe, and its success proves the lease from a later send time.
	// Session().Renew would drop the status of a refusal (403) from its
	// error; Raw keeps it.
	var entries []*api.SessionEntry
	err := s.on(ctx, readCall, func(ctx context.Context, c *api.Client) error {
		_, err := c.Raw().Write("/v1/session/renew/"+url.PathEscape(string(id)), nil, &entries, s.writing(ctx))
		return err
	})
	var se api.StatusError
	if errors.As(err, &se) && se.Code == 404 {
		err, entries = nil, nil // Consul: "Session id ... not found"
	}
	if err != nil {
		return classify("renew lease", err, false)
	}
	if len(entries) == 0 {
		return fmt.Errorf("%w: lease %s", location.ErrNotFound, id)
	}
	return s.heartbeat(ctx, id, entries[0].Name)
}

// heartbeat rewrites the descriptor lease id holds, as it is, so that its
// version changes: what other nodes watch (location.Store.RenewLease). It
// writes by compare-and-set over what its last heartbeat wrote (the first
// one reads the descriptor, whose key the session's name gives). A write
// that finds the descriptor written over since reads it and writes again;
// one that fails again found a write that came after that read, so after
// this renewal was sent, which is all a heartbeat must show.
func (s *Store) heartbeat(ctx context.Context, id location.LeaseID, sessionName string) error {
	for attempt := 0; attempt < 2; attempt++ {
		b, err := s.lastBeat(ctx, id, sessionName, attempt > 0)
		if err != nil {
			return err
		}
		next := &messages.StoredValue{WriteSeq: b.value.GetWriteSeq() + 1, Value: b.value.GetValue()}
		val, err := encode(next)
		if err != nil {
			return fmt.Errorf("%w: encode node: %w", location.ErrInvalid, err)
		}
		resp, failed, err := s.writeTxn(ctx, "renew lease", api.TxnOps{
			{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: b.key, Session: string(id)}},
			{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: b.key, Value: val, Index: b.index}},
		})
		switch {
		case err != nil:
			s.beats.Delete(id)
			return err
		case slices.Contains(failed, 0):
			s.beats.Delete(id)
			return fmt.Errorf("%w: lease %s", location.ErrNotFound, id)
		case failed != nil:
			// Written over since (UpdateNode): read it, and write again.
			s.beats.Delete(id)
			continue
		}
		if len(resp.Results) == 2 && resp.Results[1].KV != nil {
			s.beats.Store(id, beat{key: b.key, value: next, index: resp.Results[1].KV.ModifyIndex})
		}
		return nil
	}
	return nil // written over twice by another write since this renewal was sent: a version change all the same
}

// lastBeat is what lease id's last heartbeat wrote, or (none kept, or
// fresh) the descriptor as read now.
func (s *Store) lastBeat(ctx context.Context, id location.LeaseID, sessionName string, fresh bool) (beat, error) {
	if b, ok := s.beats.Load(id); ok && !fresh {
		return b.(beat), nil
	}
	mesh, rid, ok := strings.Cut(strings.TrimPrefix(sessionName, sessionNamePrefix), "/")
	if !ok || !strings.HasPrefix(sessionName, sessionNamePrefix) {
		return beat{}, fmt.Errorf("%w: lease %s names no node (%q)", location.ErrInvalid, id, sessionName)
	}
	nk := s.nodeKey(location.NodeKey{Mesh: mesh, NodeRid: rid})
	pair, err := s.get(ctx, nk)
	if err != nil {
		return beat{}, classify("renew lease: read node", err, false)
	}
	if pair == nil || pair.Session != string(id) {
		return beat{}, fmt.Errorf("%w: lease %s holds no descriptor", location.ErrNotFound, id)
	}
	cur, err := decode(pair.Value)
	if err != nil || cur.GetNode() == nil {
		return beat{}, fmt.Errorf("%w: key %s holds no node descriptor: %v", location.ErrInvalid, nk, err)
	}
	return beat{key: nk, value: cur, index: pair.ModifyIndex}, nil
}

// sessionNamePrefix starts the name of every lease's Consul session,
// followed by "<mesh>/<node RID>".
const sessionNamePrefix = "roam node "

// RevokeLease implements location.Store: a transaction deletes the
// descriptor if it is still at the index (Consul's HTTP transactions have
// no session operations), which is the revocation — the holder's next
// renewal finds no descriptor, and its writes' check-session on it fails —
// then the session is destroyed, so that what else it holds (its Entry
// claim, its name, its capacity slots) goes as on expiry. A destroy that
// fails leaves those to the session's own expiry.
func (s *Store) RevokeLease(ctx context.Context, node location.NodeKey, at location.StoreVersion) error {
	if err := node.Validate(); err != nil {
		return err
	}
	nk := s.nodeKey(node)
	pair, err := s.get(ctx, nk)
	if err != nil {
		return classify("revoke lease", err, false)
	}
	switch {
	case pair == nil:
		return fmt.Errorf("%w: %s", location.ErrNotFound, node)
	case location.StoreVersion(pair.ModifyIndex) != at || pair.Session == "":
		return &location.ConflictError{Op: "revoke lease", FailedOps: []int{0}}
	}
	_, failed, err := s.writeTxn(ctx, "revoke lease", api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVDeleteCAS, Key: nk, Index: uint64(at)}},
		{KV: &api.KVTxnOp{Verb: api.KVSet, Key: s.revokedKey(node), Value: []byte(pair.Session)}},
	})
	switch {
	case err != nil:
		return err
	case failed != nil:
		return &location.ConflictError{Op: "revoke lease", FailedOps: failed}
	}
	_ = s.destroy(context.WithoutCancel(ctx), pair.Session)
	return nil
}

// ReleaseNode implements location.Store.
func (s *Store) ReleaseNode(ctx context.Context, node *location.NodeDescriptor) error {
	if err := location.ValidateNode(node); err != nil {
		return err
	}
	nk := s.nodeKey(location.NodeKeyOf(node))
	pair, err := s.get(ctx, nk)
	if err != nil {
		return classify("release node", err, false)
	}
	if pair == nil {
		return fmt.Errorf("%w: %s", location.ErrNotFound, location.NodeKeyOf(node))
	}
	cur, err := decode(pair.Value)
	if err != nil || cur.GetNode() == nil {
		return fmt.Errorf("%w: key %s holds no node descriptor: %v", location.ErrInvalid, nk, err)
	}
	stored := cur.GetNode()
	if stored.GetLeaseId() != node.GetLeaseId() || stored.GetNodeGeneration() != node.GetNodeGeneration() || pair.Session != node.GetLeaseId() {
		return &location.ConflictError{Op: "release node (stale lifecycle)", FailedOps: []int{0}}
	}
	ek := s.recordKey(location.Key(location.KindEntry, stored.GetEntrySpotId()))
	sid := node.GetLeaseId()
	_, failed, err := s.writeTxn(ctx, "release node", api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: nk, Session: sid}},
		{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: ek, Session: sid}},
		{KV: &api.KVTxnOp{Verb: api.KVDeleteCAS, Key: nk, Index: pair.ModifyIndex}},
		{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: ek}},
	})
	if err != nil {
		return err
	}
	if failed != nil {
		return &location.ConflictError{Op: "release node (stale lifecycle)", FailedOps: failed}
	}
	if err := s.destroy(ctx, sid); err != nil {
		return classify("end lease", err, true)
	}
	return nil
}

// UpdateNode implements location.Store. Consul keeps a locked key's
// session on a write that names none, so the descriptor stays held by the
// lease (and is still deleted when it ends).
func (s *Store) UpdateNode(ctx context.Context, node *location.NodeDescriptor, expected location.StoreVersion) (location.StoreVersion, error) {
	if err := location.ValidateNodeUpdateRequest(node); err != nil {
		return 0, err
	}
	nk := s.nodeKey(location.NodeKeyOf(node))
	pair, err := s.get(ctx, nk)
	if err != nil {
		return 0, classify("update node", err, false)
	}
	if pair == nil {
		return 0, fmt.Errorf("%w: %s", location.ErrNotFound, location.NodeKeyOf(node))
	}
	cur, err := decode(pair.Value)
	if err != nil || cur.GetNode() == nil {
		return 0, fmt.Errorf("%w: key %s holds no node descriptor: %v", location.ErrInvalid, nk, err)
	}
	stored := cur.GetNode()
	// The lease names the lifecycle; a changed generation under the same
	// lease is a malformed update (ValidateNodeUpdate), not another one.
	if stored.GetLeaseId() != node.GetLeaseId() || pair.Session != node.GetLeaseId() {
		return 0, s.leaseEndedOr(ctx, node, &location.ConflictError{Op: "update node (another lifecycle)", FailedOps: []int{0}})
	}
	if err := location.ValidateNodeUpdate(stored, node); err != nil {
		return 0, err
	}
	if location.StoreVersion(pair.ModifyIndex) != expected {
		return 0, &location.ConflictError{Op: "update node", FailedOps: []int{0}}
	}
	val, err := encode(&messages.StoredValue{WriteSeq: cur.GetWriteSeq() + 1, Value: &messages.StoredValue_Node{Node: node}})
	if err != nil {
		return 0, fmt.Errorf("%w: encode node: %w", location.ErrInvalid, err)
	}
	resp, failed, err := s.writeTxn(ctx, "update node", api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: nk, Session: node.GetLeaseId()}},
		{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: nk, Value: val, Index: uint64(expected)}},
	})
	if err != nil {
		return 0, err
	}
	if failed != nil {
		c := &location.ConflictError{Op: "update node", FailedOps: failed}
		if slices.Contains(failed, 0) {
			return 0, s.leaseEndedOr(ctx, node, c)
		}
		return 0, c
	}
	// One result per op, in order: the session check's carries the index
	// the descriptor had before the write, the CAS's the new one.
	if len(resp.Results) == 2 && resp.Results[1].KV != nil && resp.Results[1].KV.Key == nk {
		return location.StoreVersion(resp.Results[1].KV.ModifyIndex), nil
	}
	return 0, fmt.Errorf("%w: update node: no result for %s", location.ErrIndeterminate, nk)
}

// leaseEndedOr is ErrLeaseEnded when node's lease has ended, else
// conflict: a lifecycle whose lease is gone must stop, not retry.
func (s *Store) leaseEndedOr(ctx context.Context, node *location.NodeDescriptor, conflict error) error {
	if alive, err := s.LeaseAlive(ctx, location.LeaseID(node.GetLeaseId())); err == nil && !alive {
		return fmt.Errorf("%w: node %s", location.ErrLeaseEnded, location.NodeKeyOf(node))
	}
	return conflict
}

// get reads one key consistently (unclassified error).
func (s *Store) get(ctx context.Context, key string) (*api.KVPair, error) {
	var pair *api.KVPair
	err := s.on(ctx, readCall, func(ctx context.Context, c *api.Client) (err error) {
		pair, _, err = c.KV().Get(key, s.consistent(ctx))
		return err
	})
	return pair, err
}

// destroy ends a session (unclassified error).
func (s *Store) destroy(ctx context.Context, sid string) error {
	return s.on(ctx, writeCall, func(ctx context.Context, c *api.Client) error {
		_, err := c.Session().Destroy(sid, s.writing(ctx))
		return err
	})
}

func (s *Store) decodeNode(pair *api.KVPair) (location.VersionedNode, error) {
	v, err := decode(pair.Value)
	if err != nil || v.GetNode() == nil {
		return location.VersionedNode{}, fmt.Errorf("%w: key %s holds no node descriptor: %v", location.ErrInvalid, pair.Key, err)
	}
	return location.VersionedNode{Node: v.GetNode(), Version: location.StoreVersion(pair.ModifyIndex)}, nil
}

// ReadNode implements location.Store.
func (s *Store) ReadNode(ctx context.Context, key location.NodeKey) (location.VersionedNode, error) {
	if err := key.Validate(); err != nil {
		return location.VersionedNode{}, err
	}
	pairs, err := s.readMany(ctx, []string{s.nodeKey(key), s.revokedKey(key)})
	if err != nil {
		return location.VersionedNode{}, fmt.Errorf("read node: %w", err) // classified already
	}
	switch {
	case pairs[s.nodeKey(key)] != nil:
		return s.decodeNode(pairs[s.nodeKey(key)])
	case pairs[s.revokedKey(key)] != nil:
		return location.VersionedNode{}, fmt.Errorf("%w: %s", location.ErrLeaseRevoked, key)
	}
	return location.VersionedNode{}, fmt.Errorf("%w: %s", location.ErrNotFound, key)
}

// ListNodes implements location.Store.
func (s *Store) ListNodes(ctx context.Context, mesh string) ([]location.VersionedNode, error) {
	if mesh != "" {
		if err := location.ValidateID("mesh", mesh); err != nil {
			return nil, err
		}
	}
	var pairs api.KVPairs
	var meta *api.QueryMeta
	err := s.on(ctx, readCall, func(ctx context.Context, c *api.Client) (err error) {
		pairs, meta, err = c.KV().List(s.nodePrefix(mesh), s.consistent(ctx))
		return err
	})
	if err != nil {
		return nil, classify("list nodes", err, false)
	}
	if err := filtered("list nodes", meta); err != nil {
		return nil, err
	}
	out := make([]location.VersionedNode, 0, len(pairs))
	for _, p := range pairs {
		n, err := s.decodeNode(p)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	location.SortNodes(out)
	return out, nil
}

// LeaseAlive implements location.Store.
func (s *Store) LeaseAlive(ctx context.Context, id location.LeaseID) (bool, error) {
	if id == "" {
		return false, fmt.Errorf("%w: empty lease id", location.ErrInvalid)
	}
	var entry *api.SessionEntry
	var meta *api.QueryMeta
	err := s.on(ctx, readCall, func(ctx context.Context, c *api.Client) (err error) {
		entry, meta, err = c.Session().Info(string(id), s.consistent(ctx))
		return err
	})
	if err != nil {
		return false, classify("lease alive", err, false)
	}
	// A session the token may not read looks ended: never take that for
	// an answer.
	if err := filtered("lease alive", meta); err != nil {
		return false, err
	}
	return entry != nil, nil
}

// Close implements location.Store: it closes the connections the Store
// keeps to its agents (a closed Store would otherwise hold them, and two
// goroutines for each, until they had been idle for 90 s). Leases are
// left to their TTL. A call made after Close connects afresh.
// CheckpointsInApply implements location.CheckpointsInApply: a
// checkpoint's manifest is a key of the same KV (checkpoints.go).
func (s *Store) CheckpointsInApply() bool { return true }

func (s *Store) Close() error {
	for _, t := range s.transports {
		t.CloseIdleConnections()
	}
	return nil
}
