// Command roamctl is the operators' command for a roam mesh. Like the
// consul command it talks only to Consul, to the Location Store roam keeps
// there (location/consulstore): it lists the live nodes and what they own,
// finds an object's owner, and asks nodes to move an object or to drain,
// through the notes of the store's board (internal/operator,
// docs/OPERATIONS.md). It never changes an ownership record itself: a
// requested move is the owner's ordinary hand-off.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/roamactors/roam/internal/drain"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/consulstore"
)

// Exit statuses.
const (
	exitOK          = 0
	exitFailed      = 1 // not found, a failed move or unit, a store error
	exitUsage       = 2
	exitInterrupted = 130
)

// exitError carries the exit status of a failure; its message, if any, is
// printed as "roamctl: <message>".
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return ""
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

func failf(code int, format string, args ...any) error {
	return &exitError{code: code, err: fmt.Errorf(format, args...)}
}

// errInterrupted is the cause of a context ended by Ctrl-C.
var errInterrupted = errors.New("interrupted")

// globals are the flags every command takes, before or after its name.
type globals struct {
	httpAddr      string
	token         string
	tokenFile     string
	caFile        string
	caPath        string
	clientCert    string
	clientKey     string
	tlsServerName string
	prefix        string
	mesh          string
	json          bool
	timeout       time.Duration
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.httpAddr, "http-addr", "", "Consul HTTP API `address` (host:port, http:// or https://; several comma-separated) [$CONSUL_HTTP_ADDR, else 127.0.0.1:8500]")
	fs.StringVar(&g.token, "token", "", "Consul ACL `token` [$CONSUL_HTTP_TOKEN]")
	fs.StringVar(&g.tokenFile, "token-file", "", "`file` holding the Consul ACL token [$CONSUL_HTTP_TOKEN_FILE]")
	fs.StringVar(&g.caFile, "ca-file", "", "PEM `file` of the CA certificates of Consul's HTTPS [$CONSUL_CACERT]")
	fs.StringVar(&g.caPath, "ca-path", "", "`directory` of such PEM files [$CONSUL_CAPATH]")
	fs.StringVar(&g.clientCert, "client-cert", "", "client certificate `file` (PEM) for Consul's HTTPS [$CONSUL_CLIENT_CERT]")
	fs.StringVar(&g.clientKey, "client-key", "", "its key `file` (PEM) [$CONSUL_CLIENT_KEY]")
	fs.StringVar(&g.tlsServerName, "tls-server-name", "", "`name` Consul's certificate must be valid for [$CONSUL_TLS_SERVER_NAME]")
	fs.StringVar(&g.prefix, "prefix", envOr("ROAM_PREFIX", "roam"), "Consul KV `prefix` of roam's keys [$ROAM_PREFIX]")
	fs.StringVar(&g.mesh, "mesh", "", "the `mesh` to look at (default: every mesh in the store)")
	fs.BoolVar(&g.json, "json", false, "machine output: one JSON document, or one JSON object per line (drain, watch)")
	fs.Var(&durationIn{p: &g.timeout, max: maxTimeout}, "timeout", "give up after this `duration`, 0s to "+maxTimeout.String()+"; for move and drain also the request's deadline on the node (default: none)")
}

// maxTimeout bounds -timeout: a request's deadline must stay a sane
// Unix time on the node.
const maxTimeout = 365 * 24 * time.Hour

// maxCount bounds watch -count.
const maxCount = 1 << 30

// intIn is an int flag refused at parse time outside [min, max], with the
// range in the message (the flag package prints it with the flag's name).
type intIn struct {
	p        *int
	min, max int
}

func (v *intIn) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.Itoa(*v.p)
}

func (v *intIn) Set(s string) error {
	n, err := strconv.ParseInt(s, 0, 64)
	if err != nil || n < int64(v.min) || n > int64(v.max) {
		return fmt.Errorf("want a whole number from %d to %d", v.min, v.max)
	}
	*v.p = int(n)
	return nil
}

// durationIn is a duration flag refused at parse time outside [0, max].
type durationIn struct {
	p   *time.Duration
	max time.Duration
}

func (v *durationIn) String() string {
	if v.p == nil {
		return "0s"
	}
	return v.p.String()
}

func (v *durationIn) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d > v.max {
		return fmt.Errorf("want a duration from 0s to %s (such as 30s or 5m)", v.max)
	}
	*v.p = d
	return nil
}

// cmdFlags are the flags of single commands.
type cmdFlags struct {
	node        string
	kind        string
	concurrency int
	count       int
	listen      string
}

type command struct {
	name    string
	args    string // positional arguments, for the usage line
	summary string
	nargs   int
	flags   func(fs *flag.FlagSet, f *cmdFlags)
	run     func(ctx context.Context, c *ctl, f *cmdFlags, args []string) error
}

var commands = []*command{
	{name: "nodes", summary: "the live nodes: name, RID, state, generation, lease, address, load/capacity",
		run: func(ctx context.Context, c *ctl, _ *cmdFlags, _ []string) error { return c.Nodes(ctx) }},
	{name: "where", args: "ID", nargs: 1, summary: "the records of ID under each kind: state, owner, generations, stable type",
		run: func(ctx context.Context, c *ctl, _ *cmdFlags, a []string) error { return c.Where(ctx, a[0]) }},
	{name: "ls", args: "--node NODE", summary: "the objects NODE (name or RID) owns: kind, id, stable type, state",
		flags: func(fs *flag.FlagSet, f *cmdFlags) {
			fs.StringVar(&f.node, "node", "", "the `node`, by name or RID")
		},
		run: func(ctx context.Context, c *ctl, f *cmdFlags, _ []string) error {
			if f.node == "" {
				return failf(exitUsage, "ls needs --node NODE")
			}
			return c.Ls(ctx, f.node)
		}},
	{name: "ended", summary: "the objects of ended owners, not served: waiting for their recovery or for an operator",
		run: func(ctx context.Context, c *ctl, _ *cmdFlags, _ []string) error { return c.Ended(ctx) }},
	{name: "move", args: "ID NODE", nargs: 2, summary: "ask ID's owner to move it to NODE and wait for the outcome: from → to, pause",
		flags: func(fs *flag.FlagSet, f *cmdFlags) {
			fs.StringVar(&f.kind, "kind", "", "the `kind` of ID (actor, instance_spot, user_spot) when it names more than one object")
		},
		run: func(ctx context.Context, c *ctl, f *cmdFlags, a []string) error {
			return c.Move(ctx, f.kind, a[0], a[1])
		}},
	{name: "drain", args: "NODE", nargs: 1, summary: "ask NODE to move everything it serves to other nodes; follow its progress",
		flags: func(fs *flag.FlagSet, f *cmdFlags) {
			fs.Var(&intIn{p: &f.concurrency, min: 0, max: drain.MaxConcurrency}, "concurrency",
				fmt.Sprintf("`N` units moved at once, 0 to %d (default 0: the node's)", drain.MaxConcurrency))
		},
		run: func(ctx context.Context, c *ctl, f *cmdFlags, a []string) error {
			return c.Drain(ctx, a[0], uint32(f.concurrency)) // at most drain.MaxConcurrency: parse checked it
		}},
	{name: "placement", summary: "the placement director of each mesh: the elected node, attempts in flight, recent outcomes",
		run: func(ctx context.Context, c *ctl, _ *cmdFlags, _ []string) error { return c.Placement(ctx) }},
	{name: "web", args: "[--listen ADDR]", summary: "serve a live web view: nodes and their load, the director, the last moves and their pauses",
		flags: func(fs *flag.FlagSet, f *cmdFlags) {
			fs.StringVar(&f.listen, "listen", "127.0.0.1:8080", "the `address` to serve on")
		},
		run: func(ctx context.Context, c *ctl, f *cmdFlags, _ []string) error { return c.Web(ctx, f.listen) }},
	{name: "watch", summary: "print the moves the live nodes commit, as they happen",
		flags: func(fs *flag.FlagSet, f *cmdFlags) {
			fs.Var(&intIn{p: &f.count, min: 0, max: maxCount}, "count",
				fmt.Sprintf("stop after `N` moves, 0 to %d (default 0: run until interrupted)", maxCount))
		},
		run: func(ctx context.Context, c *ctl, f *cmdFlags, _ []string) error { return c.Watch(ctx, f.count) }},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole command: it parses args, opens the store and runs one
// command, and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	inv, status := parse(args, stdout, stderr)
	if inv == nil {
		return status
	}
	g := inv.globals
	store, board, err := g.open()
	if err != nil {
		fmt.Fprintln(stderr, "roamctl:", err)
		return exitUsage
	}
	defer store.Close()

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case <-sigs:
			cancel(errInterrupted)
		case <-ctx.Done():
		}
	}()

	c := newCtl(store, board, stdout)
	c.errOut = stderr
	c.mesh = g.mesh
	c.prefix = g.prefix
	c.prefixes = g.livePrefixes
	c.json = g.json
	c.timeout = g.timeout
	c.tty = isTerminal(stdout)
	c.who = requestedBy()
	return exitCode(stderr, inv.cmd.run(ctx, c, &inv.flags, inv.args))
}

// invocation is a parsed command line.
type invocation struct {
	cmd     *command
	globals globals
	flags   cmdFlags
	args    []string
}

// parse reads a command line; with nothing to run (help, a usage error) it
// returns nil and the exit status.
func parse(args []string, stdout, stderr io.Writer) (*invocation, int) {
	inv := &invocation{}
	g := &inv.globals
	top := flag.NewFlagSet("roamctl", flag.ContinueOnError)
	top.SetOutput(stderr)
	g.register(top)
	top.Usage = func() { usage(stderr, top) }
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, exitOK
		}
		return nil, exitUsage
	}
	rest := top.Args()
	if len(rest) == 0 {
		usage(stderr, top)
		return nil, exitUsage
	}
	if rest[0] == "help" {
		usage(stdout, top)
		return nil, exitOK
	}
	cmd := lookup(rest[0])
	if cmd == nil {
		fmt.Fprintf(stderr, "roamctl: unknown command %q\n\n", rest[0])
		usage(stderr, top)
		return nil, exitUsage
	}
	inv.cmd = cmd

	// The command's flag set has the global flags too; whichever it sets
	// win over the ones given before the command's name.
	fs := flag.NewFlagSet("roamctl "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var sub globals
	sub.register(fs)
	if cmd.flags != nil {
		cmd.flags(fs, &inv.flags)
	}
	fs.Usage = func() { commandUsage(stderr, cmd) }
	pos, err := parseInterspersed(fs, rest[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, exitOK
		}
		return nil, exitUsage
	}
	fs.Visit(func(f *flag.Flag) {
		if top.Lookup(f.Name) != nil {
			_ = top.Set(f.Name, f.Value.String())
		}
	})
	if len(pos) != cmd.nargs {
		fmt.Fprintf(stderr, "roamctl %s: want %d argument(s), got %d\n", cmd.name, cmd.nargs, len(pos))
		commandUsage(stderr, cmd)
		return nil, exitUsage
	}
	inv.args = pos
	return inv, exitOK
}

// exitCode prints err and returns its exit status.
func exitCode(stderr io.Writer, err error) int {
	if err == nil {
		return exitOK
	}
	code := exitFailed
	var e *exitError
	if errors.As(err, &e) {
		code = e.code
		if e.err == nil {
			return code
		}
	} else if errors.Is(err, errInterrupted) {
		code = exitInterrupted
	}
	fmt.Fprintln(stderr, "roamctl:", err)
	return code
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// parseInterspersed parses fs over args, allowing flags after positional
// arguments ("move ID NODE --json"); "--" ends the flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// open makes the consulstore the flags describe; a flag left empty takes
// the consul command's environment variable (consulstore.Config does).
func (g *globals) open() (location.Store, location.Board, error) {
	cfg := consulstore.Config{
		Prefix: g.prefix,
		Token:  g.token,
		TLS: consulstore.TLSConfig{
			CAFile: g.caFile, CAPath: g.caPath,
			CertFile: g.clientCert, KeyFile: g.clientKey,
			ServerName: g.tlsServerName,
		},
	}
	if strings.Contains(g.httpAddr, ",") {
		cfg.Addresses = consulstore.ParseAddresses(g.httpAddr)
	} else {
		cfg.Address = g.httpAddr
	}
	if cfg.Token == "" && g.tokenFile != "" {
		b, err := os.ReadFile(g.tokenFile)
		if err != nil {
			return nil, nil, fmt.Errorf("token file: %w", err)
		}
		cfg.Token = strings.TrimSpace(string(b))
	}
	s, err := consulstore.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	return s, s, nil
}

// maxPrefixes bounds the top-level folders of the KV store livePrefixes
// looks into: it is a hint, not a census.
const maxPrefixes = 32

// livePrefixes lists the top-level folders of Consul's KV store that are
// a roam prefix with live nodes: one listing of the top level, then each
// folder's nodes as a store with that prefix reads them.
func (g *globals) livePrefixes(ctx context.Context) ([]string, error) {
	cfg := api.DefaultConfig()
	if addrs := consulstore.ParseAddresses(g.httpAddr); addrs[0] != "" {
		cfg.Address = addrs[0]
	}
	if g.token != "" {
		cfg.Token = g.token
	}
	if g.tokenFile != "" {
		cfg.TokenFile = g.tokenFile
	}
	for _, set := range []struct {
		dst *string
		v   string
	}{
		{&cfg.TLSConfig.CAFile, g.caFile}, {&cfg.TLSConfig.CAPath, g.caPath}, {&cfg.TLSConfig.CertFile, g.clientCert},
		{&cfg.TLSConfig.KeyFile, g.clientKey}, {&cfg.TLSConfig.Address, g.tlsServerName},
	} {
		if set.v != "" {
			*set.dst = set.v
		}
	}
	client, err := api.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	keys, _, err := client.KV().Keys("", "/", (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, err
	}
	var found []string
	for i, k := range keys {
		p, folder := strings.CutSuffix(k, "/")
		if !folder || p == "" || i >= maxPrefixes {
			continue
		}
		other := *g
		other.prefix = p
		s, _, err := other.open()
		if err != nil {
			continue
		}
		nodes, err := s.ListNodes(ctx, "")
		_ = s.Close()
		if err == nil && len(nodes) > 0 {
			found = append(found, p)
		}
	}
	return found, nil
}

// requestedBy is user@host, for a request's log line on the node.
func requestedBy() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if name == "" {
		name = "unknown"
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return name + "@" + host
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `roamctl inspects and operates a roam mesh through its Location Store (Consul KV).

Usage: roamctl [flags] COMMAND [arguments] [flags]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-22s %s\n", strings.TrimSpace(c.name+" "+c.args), c.summary)
	}
	fmt.Fprint(w, `
Flags (before or after the command; [$VAR] is the default's environment variable):
`)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fmt.Fprint(w, `
Command flags: ls -node NODE, move -kind KIND, drain -concurrency N, watch -count N.
"roamctl COMMAND -h" shows one command's flags.
Exit status: 0 done, 1 not found or failed (a failed move, a unit a drain left), 2 usage, 130 interrupted.
`)
}

// commandUsage prints a command's own flags; the global ones are roamctl -h's.
func commandUsage(w io.Writer, c *command) {
	fmt.Fprintf(w, "Usage: roamctl %s [flags]\n\n%s\n", strings.TrimSpace(c.name+" "+c.args), c.summary)
	if c.flags != nil {
		own := flag.NewFlagSet(c.name, flag.ContinueOnError)
		c.flags(own, &cmdFlags{})
		fmt.Fprint(w, "\nFlags:\n")
		own.SetOutput(w)
		own.PrintDefaults()
	}
	fmt.Fprint(w, "\nThe global flags (roamctl -h) may come before or after the command.\n")
}
