package chaos

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/uuid"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/placement"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location/consulstore"
	"github.com/roamactors/roam/roamerr"
)

// CounterKind is the stable type of the chaos test's objects.
const CounterKind = "counter"

// Arm modes of a node process (POST /arm?mode=…).
const (
	armNone int32 = iota
	// armCrash: SIGKILL this process the moment a move into it has its
	// cutover, after it answered relay-ready and before its commit CAS.
	armCrash
	// armMark: print "MARK cutover" on stdout at that moment, once.
	armMark
)

// recorder appends JSON lines to the process's record file, each with one
// write(2) on an O_APPEND descriptor: nothing is buffered in the process.
type recorder struct {
	f    *os.File
	proc string
	node string
}

func (r *recorder) write(l Line) {
	l.Proc, l.Node = r.proc, r.node
	b, err := json.Marshal(l)
	if err != nil {
		return
	}
	if _, err := r.f.Write(append(b, '\n')); err != nil {
		fmt.Fprintln(os.Stderr, "chaos node: record write failed:", err)
	}
}

// counter is the chaos test's object: a count and a hash of every op that
// made it, so each state names its whole history.
type counter struct {
	rec         *recorder
	sys         func() string // the current lifecycle's actor system
	count, hash uint64
}

func (c *counter) Receive(ctx actor.Context) {
	m, ok := ctx.Message().(*wrapperspb.StringValue)
	if !ok {
		return
	}
	t := time.Now().UnixNano()
	l := Line{K: LineHandled, T: t, Sys: ctx.ActorSystem().ID, Inc: ctx.Self().GetId(), Obj: objectID(ctx.Self().GetId()),
		Op: m.GetValue(), Prev: c.count, PH: c.hash}
	c.count++
	c.hash = NextHash(c.hash, m.GetValue())
	l.N, l.NH = c.count, c.hash
	c.rec.write(l) // before the reply: an answered request is on disk
	if ctx.Sender() != nil {
		ctx.Respond(wrapperspb.String(strconv.FormatUint(c.count, 10)))
	}
}

// objectID extracts the Spot ID from the PID id roam/<kind>/<id>@<gen>.<ownergen>.
func objectID(pid string) string {
	s := strings.TrimPrefix(pid, "roam/")
	if i := strings.Index(s, "/"); i >= 0 {
		s = s[i+1:]
	}
	if i := strings.LastIndex(s, "@"); i >= 0 {
		s = s[:i]
	}
	return s
}

type counterState struct{}

func (counterState) Capture(a actor.Actor) ([]byte, error) {
	c := a.(*counter)
	b := make([]byte, 16)
	binary.BigEndian.PutUint64(b, c.count)
	binary.BigEndian.PutUint64(b[8:], c.hash)
	return b, nil
}

func (counterState) Restore(a actor.Actor, b []byte) error {
	if len(b) != 16 {
		return fmt.Errorf("counter state of %d bytes", len(b))
	}
	c := a.(*counter)
	c.count, c.hash = binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])
	// The state now lives here too: a move's target holds it from its
	// restore (the checker follows a state to its latest holder).
	c.rec.write(Line{K: LineRestored, T: time.Now().UnixNano(), Sys: c.sys(), N: c.count, NH: c.hash})
	return nil
}

// logWriter receives every zerolog line of the node. It watches the
// relocation driver's debug "step" lines for a move's target entering
// CutoverReceived or CutoverFallback: the driver logs that step before it
// runs the step's effects, so the commit CAS has not started, and the
// target answered relay-ready in an earlier step. Lines at info level and
// above go to out.
type logWriter struct {
	mu   sync.Mutex
	out  io.Writer
	arm  *atomic.Int32
	rec  *recorder
	mark func()
}

var (
	targetSide   = []byte(`"side":"target"`)
	cutoverIn    = []byte(`"phase":"CutoverReceived"`)
	cutoverFall  = []byte(`"phase":"CutoverFallback"`)
	debugLevel   = []byte(`"level":"debug"`)
	sendEvent    = []byte(`"event":"send_`)
	relocationID = []byte(`"relocation_id":`)
)

func (w *logWriter) Write(p []byte) (int, error) {
	if bytes.Contains(p, targetSide) && (bytes.Contains(p, cutoverIn) || bytes.Contains(p, cutoverFall)) {
		switch w.arm.Load() {
		case armCrash:
			why := "target cutover, before its commit"
			if i := bytes.Index(p, relocationID); i >= 0 {
				why += " (" + strings.TrimSpace(string(p[i:min(len(p), i+40)])) + ")"
			}
			w.rec.write(Line{K: LineCrash, T: time.Now().UnixNano(), Why: why})
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never returns: the driver's goroutine stops here
		case armMark:
			if w.arm.CompareAndSwap(armMark, armNone) {
				w.mark()
			}
		}
	}
	if bytes.Contains(p, debugLevel) {
		return len(p), nil
	}
	if bytes.Contains(p, sendEvent) {
		// roam logged (and counted) a one-way send it could not deliver.
		// A line may stand for more sends than one: an ended incarnation
		// logs the first, then one line a second with how many more.
		var ev struct {
			Event     string `json:"event"`
			ObjectID  string `json:"object_id"`
			SpotID    string `json:"spot_id"`
			MoreSends int    `json:"more_sends"`
		}
		if json.Unmarshal(p, &ev) == nil && strings.HasPrefix(ev.Event, "send_") {
			now := time.Now().UnixNano()
			for range max(1, ev.MoreSends) {
				w.rec.write(Line{K: LineUndelivered, T: now, Obj: ev.ObjectID + ev.SpotID, Why: ev.Event})
			}
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.Write(p)
}

// NodeConfig configures a node process.
type NodeConfig struct {
	Consul, Prefix, Name string
	Listen, Advertise    string
	HTTP, Records        string
	LeaseTTL             time.Duration
	RestoreTimeout       time.Duration
	CallTimeout          time.Duration
	Director             bool
}

// NodeMain runs a node process: `roam-chaos node --consul … --name node-1 …`.
func NodeMain(args []string) error {
	var c NodeConfig
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	fs.StringVar(&c.Consul, "consul", "127.0.0.1:8500", "Consul HTTP address")
	fs.StringVar(&c.Prefix, "prefix", "roam-chaos", "Consul key prefix")
	fs.StringVar(&c.Name, "name", "node", "node name (Entry Spot prefix)")
	fs.StringVar(&c.Listen, "listen", "127.0.0.1:0", "remote host:port")
	fs.StringVar(&c.Advertise, "advertise", "", "host:port peers dial instead (a proxy)")
	fs.StringVar(&c.HTTP, "http", "127.0.0.1:0", "the driver's HTTP address")
	fs.StringVar(&c.Records, "records", "records.jsonl", "the handler record file")
	fs.DurationVar(&c.LeaseTTL, "ttl", 4*time.Second, "owner lease TTL")
	fs.DurationVar(&c.RestoreTimeout, "restore", 5*time.Second, "relocation restore timeout")
	fs.DurationVar(&c.CallTimeout, "call-timeout", 3*time.Second, "timeout of each Spot call")
	fs.BoolVar(&c.Director, "director", false, "run the placement director (balance by count and co-location)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return runNode(c)
}

type nodeProc struct {
	cfg  NodeConfig
	ext  atomic.Pointer[extension.Extension]
	rec  *recorder
	arm  atomic.Int32
	proc string
	// stopping: Stop was called; a lease ending now is no fault.
	stopping atomic.Bool
}

func runNode(c NodeConfig) error {
	f, err := os.OpenFile(c.Records, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	n := &nodeProc{cfg: c, proc: c.Name + "/" + strconv.Itoa(os.Getpid()) + "/" + uuid.NewString()[:8]}
	n.rec = &recorder{f: f, proc: n.proc, node: c.Name}
	lw := &logWriter{out: os.Stderr, arm: &n.arm, rec: n.rec, mark: func() { fmt.Println("MARK cutover") }}
	nodeLog := zerolog.New(lw).Level(zerolog.InfoLevel).With().Timestamp().Str("node", c.Name).Logger()
	relLog := zerolog.New(lw).Level(zerolog.DebugLevel).With().Timestamp().Str("node", c.Name).Logger()
	silent := slog.LevelError + 4 // Proto.Actor logs a closed connection as an error

	store, err := consulstore.New(consulstore.Config{Address: c.Consul, Prefix: c.Prefix})
	if err != nil {
		return err
	}
	defer store.Close()
	host, portText, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return err
	}
	// The default recovery of a stateful kind: checkpoints (at most 1 s
	// after a change), and an ended owner's counter comes back from its
	// last checkpoint.
	kind := extension.Kind{StableType: CounterKind, Instance: true,
		Producer: func() actor.Actor {
			return &counter{rec: n.rec, sys: func() string { return n.ext.Load().System().ID }}
		}, Policy: extension.PreserveStateWith(counterState{})}
	cfg := extension.Config{
		Node: meshnode.Config{Store: store, Host: host, Port: port, AdvertisedHost: c.Advertise, EntryPrefix: c.Name,
			LeaseTTL: c.LeaseTTL, Logger: &nodeLog, ProtoActorLogLevel: &silent},
		Kinds:      []extension.Kind{kind},
		Relocation: relocation.Config{RestoreTimeout: c.RestoreTimeout, Logger: &relLog},
		Placement: placement.Config{Enabled: c.Director, Period: 250 * time.Millisecond, CoLocation: placement.CoLocation{Enabled: true},
			Limits: placement.Limits{Rate: 20, Burst: 10, Concurrency: 2, Cooldown: 2 * time.Second}},
		OnRejoin: func(e *extension.Extension) {
			n.ext.Store(e)
			n.lifecycle(e)
		},
	}
	// Consul may be down when a node restarts: keep trying, bounded.
	var ext *extension.Extension
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		ext, err = extension.Start(ctx, cfg)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("start: %w", err)
		}
		nodeLog.Warn().Str("event", "chaos_start_retry").Err(err).Msg("start failed; retrying")
		time.Sleep(time.Second)
	}
	n.ext.Store(ext)
	n.lifecycle(ext)

	ln, err := net.Listen("tcp", c.HTTP)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/call", n.handleCall)
	mux.HandleFunc("/move", n.handleMove)
	mux.HandleFunc("/arm", n.handleArm)
	mux.HandleFunc("/info", func(w http.ResponseWriter, r *http.Request) {
		e := n.ext.Load()
		writeJSON(w, map[string]string{"proc": n.proc, "rid": e.NodeRid(), "sys": e.System().ID, "address": e.Node().Address()})
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	fmt.Printf("READY proc=%s http=%s rid=%s\n", n.proc, ln.Addr(), ext.NodeRid())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	n.stopping.Store(true)
	_ = srv.Shutdown(ctx)
	return n.ext.Load().Stop(ctx)
}

// lifecycle records a node lifecycle and, when its lease ends without
// Stop, its end.
func (n *nodeProc) lifecycle(e *extension.Extension) {
	node, sys := e.Node(), e.System().ID
	n.rec.write(Line{K: LineLife, T: time.Now().UnixNano(), Sys: sys, Rid: e.NodeRid()})
	go func() {
		select {
		case <-node.LeaseLost():
		case <-node.Stopped():
			return
		}
		if n.stopping.Load() {
			return
		}
		n.rec.write(Line{K: LineEnded, T: time.Now().UnixNano(), Sys: sys, Rid: node.Descriptor().GetNodeRid()})
	}()
}

// CallResult is a node's answer to /call and /move.
type CallResult struct {
	OK    bool   `json:"ok"`
	Class string `json:"class,omitempty"`
	Err   string `json:"err,omitempty"`
	Reply string `json:"reply,omitempty"`
	// Moves: the owner's name when this node is not the owner, the
	// outcome otherwise.
	Owner   string `json:"owner,omitempty"`
	Same    bool   `json:"same,omitempty"`
	PauseUs int64  `json:"pause_us,omitempty"`
}

var classes = []struct {
	name string
	err  error
}{
	{"NotFound", roamerr.ErrNotFound}, {"InvalidOperation", roamerr.ErrInvalidOperation},
	{"TypeMismatch", roamerr.ErrTypeMismatch}, {"Unavailable", roamerr.ErrUnavailable},
	{"DeadlineExceeded", roamerr.ErrDeadlineExceeded}, {"CapacityExceeded", roamerr.ErrCapacityExceeded},
	{"Stale", roamerr.ErrStale}, {"Conflict", roamerr.ErrConflict}, {"AlreadyExists", roamerr.ErrAlreadyExists},
	{"NotConfigured", roamerr.ErrNotConfigured}, {"PermissionDenied", roamerr.ErrPermissionDenied},
}

// Classify names the roamerr class of err, or "untyped".
func Classify(err error) string {
	for _, c := range classes {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	return "untyped"
}

func fail(err error) CallResult { return CallResult{Class: Classify(err), Err: err.Error()} }

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func (n *nodeProc) handleCall(w http.ResponseWriter, r *http.Request) {
	obj, op, send := r.FormValue("obj"), r.FormValue("op"), r.FormValue("send") == "1"
	// Not the HTTP request's context: a driver that gave up must not turn
	// into a cancelled call (the driver's timeout is longer).
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.CallTimeout)
	defer cancel()
	spots := n.ext.Load().Spots()
	msg := wrapperspb.String(op)
	var res CallResult
	if send {
		if _, err := spots.Send(obj, msg).InstanceSpot(CounterKind).Do(ctx); err != nil {
			res = fail(err)
		} else {
			res.OK = true
		}
	} else {
		reply, err := spots.Request(obj, msg).InstanceSpot(CounterKind).Do(ctx)
		switch {
		case err != nil:
			res = fail(err)
		default:
			if s, ok := reply.(*wrapperspb.StringValue); ok {
				res = CallResult{OK: true, Reply: s.GetValue()}
			} else {
				res = CallResult{Class: "untyped", Err: fmt.Sprintf("reply of type %T", reply)}
			}
		}
	}
	writeJSON(w, res)
}

func (n *nodeProc) handleMove(w http.ResponseWriter, r *http.Request) {
	obj, to := r.FormValue("obj"), r.FormValue("to")
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.RestoreTimeout+10*time.Second)
	defer cancel()
	e := n.ext.Load()
	ref, err := e.Spots().Find(ctx, obj)
	if err != nil {
		writeJSON(w, fail(err))
		return
	}
	nodes, err := e.Node().Store().ListNodes(ctx, "")
	if err != nil {
		writeJSON(w, fail(err))
		return
	}
	var targetRid, ownerName string
	for _, d := range nodes {
		name := nodeName(d.Node.GetEntrySpotId())
		if name == to {
			targetRid = d.Node.GetNodeRid()
		}
		if d.Node.GetNodeRid() == ref.NodeRid {
			ownerName = name
		}
	}
	switch {
	case targetRid == "":
		writeJSON(w, CallResult{Class: "no_target", Err: "no live node named " + to})
		return
	case ownerName == "":
		writeJSON(w, CallResult{Class: "no_owner", Err: "the owner of " + obj + " is not a live node"})
		return
	case ref.NodeRid != e.NodeRid():
		writeJSON(w, CallResult{Class: "not_owner", Owner: ownerName})
		return
	case targetRid == ref.NodeRid:
		writeJSON(w, CallResult{OK: true, Same: true})
		return
	}
	out, err := e.Relocate(ctx, extension.InstanceSpotRef(obj), targetRid)
	if err != nil {
		writeJSON(w, fail(err))
		return
	}
	writeJSON(w, CallResult{OK: true, PauseUs: out.Pause.Microseconds()})
}

func (n *nodeProc) handleArm(w http.ResponseWriter, r *http.Request) {
	switch r.FormValue("mode") {
	case "crash":
		n.arm.Store(armCrash)
	case "mark":
		n.arm.Store(armMark)
	default:
		n.arm.Store(armNone)
	}
	writeJSON(w, CallResult{OK: true})
}

// nodeName is a node's name: its Entry Spot ID's prefix.
func nodeName(entrySpotID string) string {
	if i := strings.LastIndex(entrySpotID, "-entry-"); i >= 0 {
		return entrySpotID[:i]
	}
	return entrySpotID
}
