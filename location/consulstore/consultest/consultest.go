// Package consultest starts a real Consul server for tests and demos
// (docs/PROTOCOL.md §3.6): `consul agent -dev` on free loopback ports, waited on until
// it has a leader, stopped by its PID, optionally with ACLs (default deny)
// or an HTTPS-only API (StartWith, LaunchWith, Options, NewPKI); or a
// cluster of servers (Cluster). The binary is the one `make consul`
// builds: $ROAM_CONSUL, else ~/.cache/roam/consul-1.14.11/consul. A missing
// binary is a test failure, never a skip.
package consultest

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Version is the Consul release roam tests against.
const Version = "1.14.11"

// ServerArgs are the arguments of a Consul server agent on loopback, one of
// n that bootstrap together: its node name, data directory, HTTP, server,
// Serf LAN and Serf WAN ports, and the Serf LAN ports of the others to
// join. Owner leases of a few seconds need session_ttl_min below Consul's
// default 10 s.
func ServerArgs(name, dataDir string, n int, ports [4]int, joins []int) []string {
	args := []string{"agent", "-server", "-bootstrap-expect=" + strconv.Itoa(n),
		"-data-dir=" + dataDir, "-node=" + name,
		"-bind=127.0.0.1", "-client=127.0.0.1",
		"-http-port=" + strconv.Itoa(ports[0]), "-server-port=" + strconv.Itoa(ports[1]),
		"-serf-lan-port=" + strconv.Itoa(ports[2]), "-serf-wan-port=" + strconv.Itoa(ports[3]),
		"-dns-port=-1", "-grpc-port=-1", "-grpc-tls-port=-1",
		"-log-level=warn",
		`-hcl=session_ttl_min = "1s"`,
		`-hcl=limits { http_max_conns_per_client = 4096 }`,
		`-hcl=performance { raft_multiplier = 1 }`,
		`-hcl=disable_update_check = true`,
	}
	for _, port := range joins {
		args = append(args, "-retry-join=127.0.0.1:"+strconv.Itoa(port))
	}
	return args
}

// Server is a running Consul agent: a dev agent (Start, Launch, StartWith,
// LaunchWith) or one server of a cluster (Cluster).
type Server struct {
	// Addr is the HTTP API address, 127.0.0.1:port: plain HTTP, or HTTPS
	// only when the agent was started with Options.TLS (see URL).
	Addr string
	// Node is the agent's node name.
	Node string

	raftAddr string // server RPC address (Cluster only)
	scheme   string // "http" or "https"
	token    string // the management token of an agent with ACLs
	probe    *http.Client
	cmd      *exec.Cmd
	out      *lockedBuffer
	exited   chan struct{}
	once     sync.Once
}

// URL is the HTTP API's base URL: http://Addr, or https://Addr for an
// agent started with Options.TLS.
func (s *Server) URL() string { return s.scheme + "://" + s.Addr }

// Options are what StartWith and LaunchWith add to Launch's dev agent. The
// zero Options is Launch's agent.
type Options struct {
	// ManagementToken, if set, turns ACLs on with default policy deny and
	// makes it the initial management token, which the agent uses for its
	// own requests too. The server is returned once the token is accepted.
	ManagementToken string
	// TLS, if set, makes the agent serve its HTTP API over HTTPS only
	// (no plain HTTP port).
	TLS *TLS
	// Unready returns the server as soon as its process started, before
	// it serves or has a leader: a client meets what it meets during a
	// leader election (refused connections, "No cluster leader", then
	// "Missing node registration" for a new session).
	Unready bool
}

// TLS are the PEM files of an HTTPS-only agent (see NewPKI).
type TLS struct {
	// CAFile verifies the agent's certificate (for the harness's own
	// requests) and, with VerifyIncoming, the clients' certificates.
	CAFile string
	// CertFile and KeyFile are the agent's certificate and key; the
	// certificate must be valid for 127.0.0.1.
	CertFile, KeyFile string
	// VerifyIncoming makes the agent refuse an HTTPS client without a
	// certificate signed by CAFile. ClientCertFile and ClientKeyFile are
	// then the one the harness uses to see the agent up.
	VerifyIncoming                bool
	ClientCertFile, ClientKeyFile string
}

// Binary returns the path of the Consul binary.
func Binary() (string, error) {
	path := os.Getenv("ROAM_CONSUL")
	if path == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		path = filepath.Join(home, ".cache", "roam", "consul-"+Version, "consul")
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("consul %s not found at %s (run `make consul`): %w", Version, path, err)
	}
	return path, nil
}

// Start launches a server for one test and stops it when the test ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	s, err := Launch()
	if err != nil {
		tb.Fatalf("start consul: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// Launch starts a server; the caller must Stop it. It retries on a port
// taken between choosing and binding it.
func Launch() (*Server, error) { return LaunchWith(Options{}) }

// StartWith is Start with Options: a server for one test, stopped when the
// test ends.
func StartWith(tb testing.TB, o Options) *Server {
	tb.Helper()
	s, err := LaunchWith(o)
	if err != nil {
		tb.Fatalf("start consul: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// LaunchWith is Launch with Options; the caller must Stop the server.
func LaunchWith(o Options) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	probe, err := o.probeClient()
	if err != nil {
		return nil, err
	}
	var last error
	for attempt := 0; attempt < 3; attempt++ {
		s, err := launch(bin, o, probe)
		if err == nil {
			return s, nil
		}
		last = err
	}
	return nil, last
}

// probeClient is the HTTP client the harness sees the agent up with.
func (o Options) probeClient() (*http.Client, error) {
	if o.TLS == nil {
		return &http.Client{Timeout: time.Second}, nil
	}
	pem, err := os.ReadFile(o.TLS.CAFile)
	if err != nil {
		return nil, fmt.Errorf("consultest: CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("consultest: no certificate in %s", o.TLS.CAFile)
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if o.TLS.ClientCertFile != "" {
		cert, err := tls.LoadX509KeyPair(o.TLS.ClientCertFile, o.TLS.ClientKeyFile)
		if err != nil {
			return nil, fmt.Errorf("consultest: client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}, nil
}

// devArgs are the extra arguments of a dev agent with o, whose HTTP API
// listens on port.
func (o Options) devArgs(port int) []string {
	var args []string
	if o.TLS == nil {
		args = append(args, "-http-port="+strconv.Itoa(port))
	} else {
		args = append(args,
			fmt.Sprintf("-hcl=ports {\n  http = -1\n  https = %d\n}", port),
			fmt.Sprintf("-hcl=tls {\n  defaults {\n    ca_file = %q\n    cert_file = %q\n    key_file = %q\n    verify_incoming = %t\n  }\n}",
				o.TLS.CAFile, o.TLS.CertFile, o.TLS.KeyFile, o.TLS.VerifyIncoming))
	}
	if o.ManagementToken != "" {
		args = append(args, fmt.Sprintf("-hcl=acl {\n  enabled = true\n  default_policy = \"deny\"\n  enable_token_persistence = false\n"+
			"  tokens {\n    initial_management = %q\n    agent = %q\n  }\n}", o.ManagementToken, o.ManagementToken))
	}
	return args
}

func launch(bin string, o Options, probe *http.Client) (*Server, error) {
	ports, err := FreePorts(4)
	if err != nil {
		return nil, err
	}
	httpPort := ports[0]
	node := "roam-test-" + strconv.Itoa(httpPort)
	args := []string{"agent", "-dev",
		"-bind=127.0.0.1", "-client=127.0.0.1",
		"-node=" + node,
		"-server-port=" + strconv.Itoa(ports[1]),
		"-serf-lan-port=" + strconv.Itoa(ports[2]),
		"-serf-wan-port=" + strconv.Itoa(ports[3]),
		"-dns-port=-1", "-grpc-port=-1", "-grpc-tls-port=-1",
		"-log-level=warn",
		// Owner-lease tests use 1 s TTLs; Consul's default minimum is 10 s.
		`-hcl=session_ttl_min = "1s"`,
		// Every test node of a process reaches Consul from 127.0.0.1;
		// Consul's default of 200 connections per client IP is meant for
		// one real node per IP.
		`-hcl=limits { http_max_conns_per_client = 4096 }`,
	}
	args = append(args, o.devArgs(httpPort)...)
	s, err := startAgent(exec.Command(bin, args...), "127.0.0.1:"+strconv.Itoa(httpPort))
	if err != nil {
		return nil, err
	}
	s.Node, s.probe, s.token = node, probe, o.ManagementToken
	if o.TLS != nil {
		s.scheme = "https"
	}
	if o.Unready {
		return s, nil
	}
	if err := s.waitLeader(60 * time.Second); err != nil {
		s.Stop()
		return nil, fmt.Errorf("%w\nconsul output:\n%s", err, s.out.String())
	}
	// The leader makes the ACL system and the initial management token
	// only after its election, and a session (an owner lease) needs the
	// agent's node in the catalog, which comes a moment after the leader:
	// a claim before that fails "Missing node registration".
	var err2 error
	if o.ManagementToken != "" {
		err2 = s.waitToken(60 * time.Second)
	}
	if err2 == nil {
		err2 = s.waitRegistered(node, 60*time.Second)
	}
	if err2 != nil {
		s.Stop()
		return nil, fmt.Errorf("%w\nconsul output:\n%s", err2, s.out.String())
	}
	return s, nil
}

// startAgent starts an agent's process.
func startAgent(cmd *exec.Cmd, httpAddr string) (*Server, error) {
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	// The server dies with the test binary even if cleanup never runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	s := &Server{Addr: httpAddr, scheme: "http", probe: &http.Client{Timeout: time.Second},
		cmd: cmd, out: out, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.exited) }()
	return s, nil
}

// get GETs path from the agent with the harness's client (and the
// management token, if any) and returns the status and body.
func (s *Server) get(path string) (int, []byte, error) {
	req, err := http.NewRequest(http.MethodGet, s.URL()+path, nil)
	if err != nil {
		return 0, nil, err
	}
	if s.token != "" {
		req.Header.Set("X-Consul-Token", s.token)
	}
	resp, err := s.probe.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

func (s *Server) waitLeader(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return errors.New("consul exited before electing a leader")
		default:
		}
		code, body, err := s.get("/v1/status/leader")
		if err == nil && code == 200 && len(strings.Trim(strings.TrimSpace(string(body)), `"`)) > 0 {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("consul at %s elected no leader within %s", s.Addr, limit)
}

// waitToken waits until the agent accepts its management token.
func (s *Server) waitToken(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if code, _, err := s.get("/v1/acl/token/self"); err == nil && code == 200 {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("consul at %s did not accept its management token within %s", s.Addr, limit)
}

// Signal sends sig to the agent's process group: SIGSTOP and SIGCONT pause
// and resume it, a store outage that leaves its data in place.
func (s *Server) Signal(sig syscall.Signal) error { return syscall.Kill(-s.cmd.Process.Pid, sig) }

// Stop kills the server by its PID and waits for it to exit.
func (s *Server) Stop() {
	s.once.Do(func() {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	})
}

// Cluster starts n Consul servers that form one cluster on loopback, each
// with its own data directory under the test's temporary directory, waits
// until every one of them serves consistent reads, and stops them when the
// test ends. Stop (or Kill) one to see the store outlive an agent.
func Cluster(tb testing.TB, n int) []*Server {
	tb.Helper()
	bin, err := Binary()
	if err != nil {
		tb.Fatalf("start consul cluster: %v", err)
	}
	var last error
	for attempt := 0; attempt < 3; attempt++ {
		ss, err := launchCluster(bin, tb.TempDir(), n)
		if err == nil {
			for _, s := range ss {
				tb.Cleanup(s.Stop)
			}
			return ss
		}
		last = err
	}
	tb.Fatalf("start consul cluster: %v", last)
	return nil
}

func launchCluster(bin, dir string, n int) ([]*Server, error) {
	ports, err := FreePorts(4 * n)
	if err != nil {
		return nil, err
	}
	var ss []*Server
	stopAll := func() {
		for _, s := range ss {
			s.Stop()
		}
	}
	for i := 0; i < n; i++ {
		p := ports[4*i : 4*i+4]
		name := "roam-cluster-" + strconv.Itoa(p[0])
		var joins []int
		for j := 0; j < n; j++ {
			if j != i {
				joins = append(joins, ports[4*j+2])
			}
		}
		args := ServerArgs(name, filepath.Join(dir, name), n, [4]int(p), joins)
		s, err := startAgent(exec.Command(bin, args...), "127.0.0.1:"+strconv.Itoa(p[0]))
		if err != nil {
			stopAll()
			return nil, err
		}
		s.Node, s.raftAddr = name, "127.0.0.1:"+strconv.Itoa(p[1])
		ss = append(ss, s)
	}
	for _, s := range ss {
		if err := s.waitLeader(60 * time.Second); err != nil {
			stopAll()
			return nil, fmt.Errorf("%w\nconsul output:\n%s", err, s.out.String())
		}
	}
	// A session is created for its agent's node, which the leader
	// registers in the catalog only some time after its election.
	for _, s := range ss {
		if err := ss[0].waitRegistered(s.Node, 60*time.Second); err != nil {
			stopAll()
			return nil, err
		}
	}
	return ss, nil
}

// waitRegistered waits until the catalog, read consistently through s,
// has node.
func (s *Server) waitRegistered(node string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		code, body, err := s.get("/v1/catalog/node/" + node + "?consistent")
		var got struct{ Node struct{ Node string } } // a dev agent pretty-prints
		if err == nil && code == 200 && json.Unmarshal(body, &got) == nil && got.Node.Node == node {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("consul node %s was not registered within %s", node, limit)
}

// IsLeader reports whether this server is the cluster's leader now, as it
// sees it (Cluster only).
func (s *Server) IsLeader() bool {
	code, body, err := s.get("/v1/status/leader")
	return err == nil && code == 200 && s.raftAddr != "" && strings.Trim(strings.TrimSpace(string(body)), `"`) == s.raftAddr
}

// Output is what the server printed so far.
func (s *Server) Output() string { return s.out.String() }

// FreePorts returns n loopback ports free for both TCP and UDP (Consul's
// Serf needs both), for servers a test or harness starts itself. They are
// drawn below the kernel's ephemeral range: a port from it (listening on
// :0) is handed out again for any outgoing connection on the machine, and
// the tests running beside the server make those by the thousand, so one
// could be taken between this check and the server's bind (make test saw
// Consul fail to start on it).
func FreePorts(n int) ([]int, error) {
	lo, hi := portsBelowEphemeral()
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 100*n {
			return nil, fmt.Errorf("consultest: no %d free ports between %d and %d", n, lo, hi)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(lo+rand.IntN(hi-lo)))
		if err != nil {
			continue
		}
		ls = append(ls, l)
		port := l.Addr().(*net.TCPAddr).Port
		// Serf also needs the UDP port.
		u, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		u.Close()
		ports = append(ports, port)
	}
	return ports, nil
}

// portsBelowEphemeral is the range FreePorts draws from: from 10000 to the
// start of the kernel's ephemeral range (Linux's default, 32768, when it
// cannot be read); above the range when it starts too low for that; and
// the whole non-privileged range, with a warning on stderr, when it
// leaves no room either side.
func portsBelowEphemeral() (lo, hi int) {
	start, end := 32768, 60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			s, serr := strconv.Atoi(f[0])
			e, eerr := strconv.Atoi(f[1])
			if serr == nil && eerr == nil && s <= e {
				start, end = s, e
			}
		}
	}
	switch {
	case start > 11000:
		return 10000, start
	case end < 64535:
		return end + 1, 65536
	}
	fmt.Fprintf(os.Stderr, "consultest: the ephemeral port range %d-%d leaves no ports outside it; a port may be taken between its check and its bind\n", start, end)
	return 1024, 65536
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Main is a package's TestMain around one shared server: it starts the
// server, hands it to started, runs the tests, stops the server and exits
// with the tests' code. A server that will not start fails the package.
func Main(m *testing.M, started func(*Server)) {
	s, err := Launch()
	if err != nil {
		fmt.Fprintln(os.Stderr, "these tests need a real Consul:", err)
		os.Exit(1)
	}
	started(s)
	code := m.Run()
	s.Stop()
	os.Exit(code)
}
