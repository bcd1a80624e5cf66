// Command roam-demo is `make demo`: chat rooms keep working while they and
// their users' Actors are relocated between nodes. Four nodes (gateway,
// node-1, node-2, node-3) serve ten rooms; bots connect as chat clients to
// the gateway node, where each has a Session and the Actor that speaks for
// it in its room (it moved to the room's node when it joined), and post
// numbered messages while rooms and users' Actors are moved continuously
// for about 20 s; then node-2 crashes (SIGKILL for a process) and its rooms
// come back on live nodes from their checkpoints by themselves; then the
// three other nodes are drained and restarted in turn and the gateway node
// is drained, with every client still connected; then the bots leave and
// the nodes stop. It prints a line per move and a summary (moves, messages
// sent and delivered, lost, duplicated, clients disconnected, pause
// p50/p99/max), and exits non-zero if a message was lost or duplicated or
// a client was disconnected, and 2 on a wrong flag.
//
// --store memory runs the four nodes in this process on the embedded
// store. --store consul starts a real Consul (built by `make consul`); with
// --chat-node BIN the nodes are four separate chat-node processes (`make
// demo-consul`), otherwise they run in this process.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/rs/zerolog"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/examples/chat"
	"github.com/roamactors/roam/examples/chat/chatpb"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/consulstore"
	"github.com/roamactors/roam/location/consulstore/consultest"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
)

func main() {
	storeKind := flag.String("store", "memory", "location store: memory | consul")
	consulAddr := flag.String("consul", "", "a running Consul's HTTP address, or several agents' separated by commas (--store consul); empty starts one")
	chatNode := flag.String("chat-node", "", "chat-node binary: run the nodes as separate processes (--store consul)")
	duration := flag.Duration("duration", 20*time.Second, fmt.Sprintf("how long rooms are moved while bots chat (more than 0, at most %s)", maxDuration))
	rooms := flag.Int("rooms", 10, fmt.Sprintf("rooms, %d bots in each (1 to %d)", botsPerRoom, maxRooms))
	flag.BoolVar(&director, "director", false, "run the placement director with co-location on every node: users' Actors follow their rooms as they talk")
	flag.StringVar(&tlsDir, "tls-dir", "", "mutual TLS between every process: a directory with ca.pem, a certificate per node (<name>.pem) and client.pem (make certs)")
	flag.DurationVar(&postEvery, "post-every", 0, "how often each bot posts (default 2ms; 25ms with --director, so that users' Actors are idle between posts and the director's idle-only moves find them so)")
	flag.StringVar(&fault, "fault", "kill", "the fault in the middle of the run: kill (SIGKILL node-2, or stop it without a word in this process) | consul-pause (SIGSTOP the Consul this demo started, for --pause)")
	flag.DurationVar(&storePause, "pause", 25*time.Second, "how long --fault consul-pause pauses Consul (past the nodes' lease TTL: every lifecycle ends)")
	flag.Parse()
	if err := checkFlags(flag.Args(), *storeKind, *consulAddr, *chatNode, *duration, *rooms); err != nil {
		fmt.Fprintln(os.Stderr, "roam-demo:", err)
		os.Exit(2)
	}
	if postEvery == 0 {
		postEvery = 2 * time.Millisecond
		if director {
			postEvery = 25 * time.Millisecond
		}
	}
	if err := run(*storeKind, *consulAddr, *chatNode, *duration, *rooms); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

// The flags' bounds: the demo is one machine's; past them it would not
// end, or not say anything useful.
const (
	maxRooms     = 1_000 // each with botsPerRoom bots connected to one gateway
	maxDuration  = time.Hour
	maxPostEvery = time.Minute
	maxPause     = 10 * time.Minute
)

// checkFlags checks every flag before anything starts, saying what each
// accepts.
func checkFlags(args []string, storeKind, consulAddr, chatNode string, duration time.Duration, rooms int) error {
	switch {
	case len(args) > 0:
		return fmt.Errorf("unexpected argument %q: every option is a flag (-h lists them)", args[0])
	case storeKind != "memory" && storeKind != "consul":
		return fmt.Errorf("--store must be memory or consul, got %q", storeKind)
	case chatNode != "" && storeKind != "consul":
		return errors.New("--chat-node needs --store consul: separate processes share no embedded store")
	case consulAddr != "" && storeKind != "consul":
		return errors.New("--consul needs --store consul")
	case rooms < 1 || rooms > maxRooms:
		return fmt.Errorf("--rooms must be from 1 to %d, got %d", maxRooms, rooms)
	case duration <= 0 || duration > maxDuration:
		return fmt.Errorf("--duration must be more than 0 and at most %s, got %s", maxDuration, duration)
	case postEvery < 0 || postEvery > maxPostEvery:
		return fmt.Errorf("--post-every must be from 0 (the default) to %s, got %s", maxPostEvery, postEvery)
	case fault != "kill" && fault != "consul-pause":
		return fmt.Errorf("--fault must be kill or consul-pause, got %q", fault)
	case fault == "consul-pause" && (storeKind != "consul" || consulAddr != ""):
		return errors.New("--fault consul-pause needs --store consul and the Consul this demo starts (no --consul)")
	case storePause <= 0 || storePause > maxPause:
		return fmt.Errorf("--pause must be more than 0 and at most %s, got %s", maxPause, storePause)
	}
	if chatNode != "" {
		if st, err := os.Stat(chatNode); err != nil || st.IsDir() {
			return fmt.Errorf("--chat-node must be the chat-node binary (go build ./examples/chat/cmd/chat-node), got %q", chatNode)
		}
	}
	if tlsDir != "" {
		if st, err := os.Stat(tlsDir); err != nil || !st.IsDir() {
			return fmt.Errorf("--tls-dir must be a directory with ca.pem, a certificate per node and client.pem (make certs), got %q", tlsDir)
		}
	}
	return nil
}

// botsPerRoom is how many bots chat in each room.
const botsPerRoom = 3

// nodeNames are the demo's nodes; the first is the gateway the bots
// connect to, drained at the end but never restarted (a restart would
// disconnect its clients: that is what restarting a gateway means).
var nodeNames = []string{"gateway", "node-1", "node-2", "node-3"}

// tlsDir is --tls-dir: empty for plain TCP.
var tlsDir string

// director is --director.
var director bool

// postEvery is --post-every.
var postEvery time.Duration

// fault is --fault, storePause --pause; pauseStore pauses the Consul this
// demo started (--fault consul-pause) for that long.
var (
	fault      string
	storePause time.Duration
	pauseStore func(time.Duration) error
)

// directed counts the director's attempts by outcome (--director).
var directed struct {
	sync.Mutex
	outcomes map[roam.PlacementOutcome]int
}

// placementConfig is --director's (chat.DirectorConfig), counting and
// printing the director's attempts of this process's nodes.
func placementConfig(names func(rid string) string) roam.PlacementConfig {
	cfg := chat.DirectorConfig()
	cfg.OnAttempt = func(a roam.PlacementAttempt, o roam.PlacementOutcome) {
		directed.Lock()
		if directed.outcomes == nil {
			directed.outcomes = map[roam.PlacementOutcome]int{}
		}
		directed.outcomes[o]++
		directed.Unlock()
		if o == "committed" {
			fmt.Printf("director  %-12s %s -> %s  (co-located with what it talks to)\n", a.Key, names(a.SourceRid), names(a.TargetRid))
		}
	}
	return cfg
}

func run(storeKind, consulAddr, chatNode string, duration time.Duration, rooms int) error {
	ctx := context.Background()
	quiet := zerolog.New(os.Stderr).Level(zerolog.WarnLevel)
	var c cluster
	switch {
	case storeKind == "memory":
		n, err := startNodes(ctx, memstore.New(), quiet)
		if err != nil {
			return err
		}
		c = n
	case storeKind == "consul":
		if consulAddr == "" {
			srv, err := consultest.Launch()
			if err != nil {
				return err
			}
			defer srv.Stop()
			consulAddr = srv.Addr
			pauseStore = func(d time.Duration) error {
				if err := srv.Signal(syscall.SIGSTOP); err != nil {
					return err
				}
				time.Sleep(d)
				return srv.Signal(syscall.SIGCONT)
			}
			fmt.Printf("started Consul %s at %s\n", consultest.Version, consulAddr)
		}
		prefix := fmt.Sprintf("roam-demo/%d", time.Now().UnixNano())
		fmt.Printf("watch it live in a browser: go run ./cmd/roamctl web --http-addr %s --prefix %s\n", strings.Split(consulAddr, ",")[0], prefix)
		if chatNode != "" {
			p := &processes{bin: chatNode, consul: consulAddr, prefix: prefix}
			if err := p.start(); err != nil {
				return err
			}
			c = p
			break
		}
		store, err := consulstore.New(consulstore.Config{Addresses: consulstore.ParseAddresses(consulAddr), Prefix: prefix})
		if err != nil {
			return err
		}
		defer store.Close()
		n, err := startNodes(ctx, store, quiet)
		if err != nil {
			return err
		}
		c = n
	default:
		return fmt.Errorf("unknown --store %q", storeKind)
	}
	defer c.stop()
	return chatAndMove(c, duration, rooms)
}

// cluster is the demo's four chat nodes.
type cluster interface {
	// gateways are the nodes' chat gateway addresses, in nodeNames order.
	gateways() []string
	// restart drains node i (SIGTERM for a process), stops it and starts
	// it again under the same name: a rolling deploy's step. It returns
	// the new gateway address.
	restart(i int) (string, error)
	// drain drains node i and leaves it running (SIGUSR1 for a process).
	drain(i int) error
	// crash ends node i without a word: SIGKILL for a process; in this
	// process, its node stops without a drain and its actor system goes
	// (its connections end). startAgain starts it again, a new lifecycle under
	// the same name, and returns its gateway address.
	crash(i int) error
	startAgain(i int) (string, error)
	// store reads the nodes' Location Store.
	store() location.Store
	stop()
}

// inProcess runs the four nodes in this process, each roam attached to an
// actor system of its own, with the chat gateway on it.
type inProcess struct {
	locs  location.Store
	log   zerolog.Logger
	nodes []*roam.Roam
}

func startNodes(ctx context.Context, store location.Store, log zerolog.Logger) (*inProcess, error) {
	c := &inProcess{locs: store, log: log}
	for _, name := range nodeNames {
		r, err := c.startNode(ctx, name)
		if err != nil {
			c.stop()
			return nil, err
		}
		c.nodes = append(c.nodes, r)
	}
	return c, nil
}

func (c *inProcess) startNode(ctx context.Context, name string) (*roam.Roam, error) {
	silent := slog.LevelError + 4 // Proto.Actor logs a closed client connection as an error
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: silent}))
	}))
	// The demo's end stops every node at once: nowhere to drain to.
	// restart drains explicitly.
	opts := []roam.Option{roam.WithStore(c.locs), roam.WithNodeName(name), roam.WithKinds(chat.Kinds()...),
		roam.WithLogger(c.log), roam.WithTLS(roam.TLSFromDir(tlsDir, name)), roam.WithDrainOnStop(false)}
	if director {
		opts = append(opts, roam.WithPlacement(placementConfig(c.nodeName)))
	}
	r, err := roam.New(system, opts...)
	if err == nil {
		err = r.Start(ctx)
	}
	if err == nil {
		_, err = chat.StartGateway(r, c.log)
	}
	if err != nil {
		if r != nil {
			_ = r.Stop(ctx)
		}
		system.Shutdown()
		return nil, err
	}
	fmt.Printf("%s  %s\n", name, system.Address())
	return r, nil
}

func (c *inProcess) store() location.Store { return c.locs }

// nodeName is the name of the node whose RID is rid (the RID if none).
func (c *inProcess) nodeName(rid string) string { return nodeName(c.locs, rid) }

func nodeName(store location.Store, rid string) string {
	nodes, err := store.ListNodes(context.Background(), "default") // the nodes' mesh
	if err == nil {
		for _, n := range nodes {
			if n.Node.GetNodeRid() == rid {
				return n.Node.GetName()
			}
		}
	}
	return rid
}

// together counts the users whose Actor is on their room's node.
func together(store location.Store, users map[string]string) (int, error) {
	ctx := context.Background()
	n := 0
	for user, room := range users {
		u, err := store.Read(ctx, location.Key(location.KindActor, chat.UserActor(user)))
		if err != nil {
			return 0, err
		}
		r, err := store.Read(ctx, location.Key(location.KindUserSpot, room))
		if err != nil {
			return 0, err
		}
		if u.Record.GetOwner().GetNodeRid() == r.Record.GetOwner().GetNodeRid() {
			n++
		}
	}
	return n, nil
}

// explain prints where each user's Actor and its room are, and how many
// Actors each node owns.
func explain(store location.Store, users map[string]string) {
	ctx := context.Background()
	per := map[string]int{}
	for user, room := range users {
		u, err1 := store.Read(ctx, location.Key(location.KindActor, chat.UserActor(user)))
		r, err2 := store.Read(ctx, location.Key(location.KindUserSpot, room))
		if err1 != nil || err2 != nil {
			continue
		}
		un, rn := u.Record.GetOwner().GetNodeRid(), r.Record.GetOwner().GetNodeRid()
		per[nodeName(store, un)]++
		if un != rn {
			fmt.Printf("  %s on %s, its %s on %s\n", user, nodeName(store, un), room, nodeName(store, rn))
		}
	}
	fmt.Printf("  users' Actors per node: %v\n", per)
}

func (c *inProcess) gateways() []string {
	var addrs []string
	for _, r := range c.nodes {
		addrs = append(addrs, r.System().Address())
	}
	return addrs
}

func (c *inProcess) drain(i int) error {
	dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	res, err := c.nodes[i].Drain(dctx, roam.DrainOptions{})
	cancel()
	if err != nil {
		return err
	}
	fmt.Printf("drained %s: %d of %d rooms and users moved in %s, pause p50 %.2f ms p99 %.2f ms\n", nodeNames[i], res.Moved, res.Total,
		res.Finished.Sub(res.Started).Round(time.Millisecond), ms(res.PauseP50), ms(res.PauseP99))
	if !res.Complete() {
		return res.Err()
	}
	return nil
}

func (c *inProcess) restart(i int) (string, error) {
	ctx := context.Background()
	r := c.nodes[i]
	if err := c.drain(i); err != nil {
		return "", err
	}
	if err := r.Stop(ctx); err != nil {
		return "", err
	}
	r.System().Shutdown()
	next, err := c.startNode(ctx, nodeNames[i])
	if err != nil {
		return "", err
	}
	c.nodes[i] = next
	return next.System().Address(), nil
}

func (c *inProcess) crash(i int) error {
	r := c.nodes[i]
	r.System().Shutdown() // its remote first: every connection to it ends now
	_ = r.Stop(context.Background())
	return nil
}

func (c *inProcess) startAgain(i int) (string, error) {
	next, err := c.startNode(context.Background(), nodeNames[i])
	if err != nil {
		return "", err
	}
	c.nodes[i] = next
	return next.System().Address(), nil
}

func (c *inProcess) stop() {
	for _, r := range c.nodes {
		_ = r.Stop(context.Background())
		r.System().Shutdown()
	}
}

// processes runs the four nodes as chat-node processes on Consul.
type processes struct {
	bin, consul, prefix string
	locs                location.Store // a client of the nodes' store
	cmds                []*exec.Cmd
	addrs               []string
	outs                []*bufio.Scanner
	drained             []chan string // each process's "drained …" / "drain … failed" lines
}

func (p *processes) store() location.Store { return p.locs }

func (p *processes) start() error {
	s, err := consulstore.New(consulstore.Config{Addresses: consulstore.ParseAddresses(p.consul), Prefix: p.prefix})
	if err != nil {
		return err
	}
	p.locs = s
	for i := range nodeNames {
		if err := p.startOne(i); err != nil {
			p.stop()
			return err
		}
	}
	return nil
}

// startOne starts node i and waits for it to say where it serves.
func (p *processes) startOne(i int) error {
	name := nodeNames[i]
	args := []string{"--store", "consul", "--consul", p.consul, "--prefix", p.prefix, "--listen", "127.0.0.1:0", "--name", name, "--tls-dir", tlsDir}
	if director {
		args = append(args, "--director")
	}
	c := exec.Command(p.bin, args...)
	c.Stderr = os.Stderr
	out, err := c.StdoutPipe()
	if err != nil {
		return err
	}
	if err := c.Start(); err != nil {
		return err
	}
	lines := bufio.NewScanner(out)
	addr := ""
	for addr == "" && lines.Scan() {
		if _, a, ok := strings.Cut(lines.Text(), " serving chat at "); ok {
			addr = a
		}
	}
	if addr == "" {
		_ = c.Process.Kill()
		_ = c.Wait()
		return fmt.Errorf("%s did not start", name)
	}
	for len(p.cmds) <= i {
		p.cmds, p.addrs, p.outs, p.drained = append(p.cmds, nil), append(p.addrs, ""), append(p.outs, nil), append(p.drained, nil)
	}
	drained := make(chan string, 4)
	p.cmds[i], p.addrs[i], p.outs[i], p.drained[i] = c, addr, lines, drained
	go func() { // keep reading its output; show what it says about its drain
		for lines.Scan() {
			if t := lines.Text(); strings.HasPrefix(t, "drain") {
				fmt.Printf("%s: %s\n", name, t)
				if !strings.HasPrefix(t, "draining") {
					select {
					case drained <- t:
					default:
					}
				}
			}
		}
	}()
	fmt.Printf("%s  %s  (process %d)\n", name, addr, c.Process.Pid)
	return nil
}

func (p *processes) gateways() []string { return append([]string(nil), p.addrs...) }

func (p *processes) drain(i int) error {
	_ = p.cmds[i].Process.Signal(syscall.SIGUSR1) // chat-node drains and serves on
	select {
	case t := <-p.drained[i]:
		if strings.Contains(t, "failed") || strings.Contains(t, "stayed") {
			return fmt.Errorf("%s: %s", nodeNames[i], t)
		}
		return nil
	case <-time.After(60 * time.Second):
		return fmt.Errorf("%s: no end of its drain in 60 s", nodeNames[i])
	}
}

func (p *processes) restart(i int) (string, error) {
	c := p.cmds[i]
	_ = c.Process.Signal(syscall.SIGTERM) // chat-node drains, then stops
	if err := c.Wait(); err != nil {
		return "", fmt.Errorf("%s: %w", nodeNames[i], err)
	}
	if err := p.startOne(i); err != nil {
		return "", err
	}
	return p.addrs[i], nil
}

func (p *processes) crash(i int) error {
	if err := p.cmds[i].Process.Kill(); err != nil { // SIGKILL
		return err
	}
	_ = p.cmds[i].Wait()
	return nil
}

func (p *processes) startAgain(i int) (string, error) {
	if err := p.startOne(i); err != nil {
		return "", err
	}
	return p.addrs[i], nil
}

// stop ends the demo's nodes at once: each would otherwise drain to the
// others, which are stopping too (their leases end with their TTL).
func (p *processes) stop() {
	if p.locs != nil {
		defer p.locs.Close()
	}
	for _, c := range p.cmds {
		if c != nil {
			_ = c.Process.Kill()
		}
	}
	for _, c := range p.cmds {
		if c != nil {
			_ = c.Wait()
		}
	}
}

// inbox is one bot's view of its room: which seqs of each poster arrived,
// so a repeat is a duplicate whatever the order, and one that arrives after
// a later seq is counted out of order (a room's broadcasts before and after
// a move leave on two connections; nothing orders them, docs/PROTOCOL.md §10);
// its own posts that were refused, and whether its Session ended.
type inbox struct {
	mu        sync.Mutex
	seen      map[string][]bool   // poster → seq → arrived
	index     map[string][]uint64 // poster → seq → the room's index for it (its handling order)
	highest   map[string]uint64
	delivered uint64
	dupes     uint64
	late      uint64
	misorder  uint64 // the room handled a poster's seq N+1 before N
	refused   uint64 // own posts refused (they reach nobody)
	// refusedSeqs are the seqs of those posts.
	refusedSeqs []uint64
	refusals    []string
	recovered   uint64 // told its Actor came back after its node ended
	gone        string // why the Session ended ("": connected)
	reconnects  uint64 // connected again after its Session ended
}

// disconnected reports whether the bot's Session ended and it has not
// connected again.
func (in *inbox) disconnected() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.gone != ""
}

// connectedAgain clears gone once the bot connected again.
func (in *inbox) connectedAgain() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.gone = ""
	in.reconnects++
}

func (in *inbox) receive(c actor.Context) {
	in.mu.Lock()
	defer in.mu.Unlock()
	switch m := c.Message().(type) {
	case *chatpb.PostRefused:
		in.refused++
		in.refusedSeqs = append(in.refusedSeqs, m.GetSeq())
		if len(in.refusals) < 3 {
			in.refusals = append(in.refusals, m.GetError())
		}
		return
	case *chatpb.Disconnected:
		in.gone = m.GetReason()
		return
	case *chatpb.Recovered:
		in.recovered++
		return
	}
	p, ok := c.Message().(*chatpb.Posted)
	if !ok {
		return
	}
	name, seq := p.GetName(), p.GetSeq()
	seen, index := in.seen[name], in.index[name]
	for uint64(len(seen)) <= seq+1 {
		seen, index = append(seen, false), append(index, 0)
	}
	in.seen[name], in.index[name] = seen, index
	if seen[seq] {
		in.dupes++
		return
	}
	seen[seq], index[seq] = true, p.GetIndex()
	if (seq > 0 && seen[seq-1] && index[seq-1] > p.GetIndex()) || (seen[seq+1] && index[seq+1] < p.GetIndex()) {
		in.misorder++
	}
	in.delivered++
	if seq < in.highest[name] {
		in.late++
	}
	in.highest[name] = max(in.highest[name], seq)
}

// chatAndMove connects bots to the gateway node as a chat client would,
// has them post while rooms and their Actors move, then drains every node,
// and checks every post reached every member of its room exactly once and
// no client was disconnected.
func chatAndMove(c cluster, duration time.Duration, rooms int) error {
	gateways := c.gateways()
	silent := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 4}))
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return silent }))
	opts, err := roam.ClientRemoteOptions(roam.TLSFromDir(tlsDir, "client"), "127.0.0.1")
	if err != nil {
		return err
	}
	r := remote.NewRemote(sys, remote.Configure("127.0.0.1", 0, opts...))
	r.Start()
	defer r.Shutdown(false)
	// Every bot connects to the gateway node; commands go to it as well.
	gw := actor.NewPID(gateways[0], chat.GatewayName)

	type bot struct {
		room, name string
		in         *inbox
		pid        *actor.PID // its inbox
		sent       atomic.Uint64
	}
	var bots []*bot
	// connect connects a bot and joins it to its room, as a chat client
	// does at first and again once it was told its Session ended.
	connect := func(bt *bot) error {
		res, err := sys.Root.RequestFuture(gw, &chatpb.Connect{Name: bt.name, Inbox: &messages.PID{Address: bt.pid.Address, Id: bt.pid.Id}}, 10*time.Second).Result()
		if err != nil {
			return fmt.Errorf("connect %s: %w", bt.name, err)
		}
		if a, ok := res.(*chatpb.Ack); ok {
			return fmt.Errorf("connect %s: %s", bt.name, a.GetError())
		}
		res, err = sys.Root.RequestFuture(gw, &chatpb.Join{Room: bt.room, Member: &chatpb.Member{Name: bt.name}}, 20*time.Second).Result()
		if err != nil {
			return fmt.Errorf("join %s: %w", bt.room, err)
		}
		if a, ok := res.(*chatpb.Ack); ok {
			return fmt.Errorf("join %s: %s", bt.room, a.GetError())
		}
		return nil
	}
	// However the demo ends, its bots leave before the nodes stop (run's
	// deferred stop): a node that stops under a connected client ends its
	// Session, and its gateway rightly reports a disconnection nobody
	// asked for. The gateway answers a leave once the client's Session and
	// Actor are gone.
	defer func() {
		var mu sync.Mutex
		var left, failed int
		var why string
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for _, bt := range bots {
			if bt.in.disconnected() {
				continue // nothing of it left on the gateway
			}
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				res, err := sys.Root.RequestFuture(gw, &chatpb.Leave{Name: bt.name}, 10*time.Second).Result()
				if a, ok := res.(*chatpb.Ack); err == nil && ok && a.GetError() != "" {
					err = errors.New(a.GetError())
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					failed++
					why = fmt.Sprintf("%s: %v", bt.name, err)
					return
				}
				left++
			}()
		}
		wg.Wait()
		fmt.Printf("%d clients left the gateway before the nodes stop", left)
		if failed > 0 {
			fmt.Printf("; %d could not (e.g. %s)", failed, why)
		}
		fmt.Println()
	}()
	for r := 0; r < rooms; r++ {
		for b := 0; b < botsPerRoom; b++ {
			bt := &bot{room: fmt.Sprintf("room-%d", r), name: fmt.Sprintf("r%d-bot-%d", r, b), in: &inbox{seen: map[string][]bool{}, index: map[string][]uint64{}, highest: map[string]uint64{}}}
			bt.pid = sys.Root.Spawn(actor.PropsFromFunc(bt.in.receive))
			if err := connect(bt); err != nil {
				return err
			}
			bots = append(bots, bt)
		}
	}
	fmt.Printf("%d rooms, %d bots connected to %s, each with its Actor in its room; moving rooms and users for %s\n\n", rooms, len(bots), nodeNames[0], duration)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sent atomic.Uint64
	for _, bt := range bots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var tried time.Time
			for {
				select {
				case <-stop:
					return
				case <-time.After(postEvery):
				}
				if bt.in.disconnected() {
					// Told its Session ended (its gateway's node lifecycle
					// ended): connect again, as a chat client would.
					if time.Since(tried) < 500*time.Millisecond {
						continue
					}
					tried = time.Now()
					if connect(bt) != nil {
						continue
					}
					bt.in.connectedAgain()
				}
				n := bt.sent.Add(1)
				sys.Root.Send(gw, &chatpb.Post{Room: bt.room, Name: bt.name, Seq: n, Text: fmt.Sprintf("message %d", n)})
				sent.Add(1)
			}
		}()
	}

	rnd := rand.New(rand.NewPCG(7, 11))
	var pauses []time.Duration
	var failed, userMoves int
	end := time.Now().Add(duration)
	for time.Now().Before(end) {
		to := nodeNames[rnd.IntN(len(nodeNames))]
		mv := &chatpb.Relocate{Room: fmt.Sprintf("room-%d", rnd.IntN(rooms)), To: to}
		if rnd.IntN(3) == 0 {
			// A user's Actor alone: its client's Session on the gateway
			// holds what the client sends meanwhile.
			mv = &chatpb.Relocate{User: bots[rnd.IntN(len(bots))].name, To: to}
		}
		res, err := sys.Root.RequestFuture(gw, mv, 15*time.Second).Result()
		what := mv.GetRoom()
		if mv.GetUser() != "" {
			what = "@" + mv.GetUser()
		}
		if err != nil {
			// A gateway that does not answer (its node paused, killed or cut
			// off while you try faults by hand) fails this move, not the demo.
			failed++
			fmt.Printf("move %-12s -> %s  failed: no answer from the gateway: %v\n", what, to, err)
			continue
		}
		out := res.(*chatpb.Relocated)
		switch {
		case out.GetError() != "":
			failed++
			fmt.Printf("move %-12s -> %s  failed: %s\n", what, to, out.GetError())
		case out.GetFrom() == out.GetTo():
			continue // already there
		default:
			p := time.Duration(out.GetPauseMicros()) * time.Microsecond
			pauses = append(pauses, p)
			if mv.GetUser() != "" {
				userMoves++
			}
			fmt.Printf("move %3d  %-12s %s -> %s  pause %6.2f ms  %5d bytes\n", len(pauses), what, out.GetFrom(), out.GetTo(), ms(p), out.GetBytes())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if director {
		// The moves above left users' Actors away from their rooms; the
		// director brings each back to its room's node as it talks.
		users := map[string]string{}
		for _, bt := range bots {
			users[bt.name] = bt.room
		}
		begin := time.Now()
		n, err := together(c.store(), users)
		if err != nil {
			close(stop)
			wg.Wait()
			return err
		}
		fmt.Printf("\nusers' Actors on their room's node: %d of %d; the director co-locates the others while they talk\n", n, len(users))
		for n < len(users) && time.Since(begin) < 30*time.Second {
			time.Sleep(100 * time.Millisecond) // polls the store
			if n, err = together(c.store(), users); err != nil {
				close(stop)
				wg.Wait()
				return err
			}
		}
		directed.Lock()
		outcomes := fmt.Sprint(directed.outcomes)
		if directed.outcomes == nil {
			outcomes = "counted in the nodes' processes (roamctl placement)"
		}
		directed.Unlock()
		fmt.Printf("users' Actors on their room's node: %d of %d after %s; director attempts by outcome: %s\n", n, len(users), time.Since(begin).Round(time.Millisecond), outcomes)
		if n < len(users) {
			explain(c.store(), users)
			close(stop)
			wg.Wait()
			return fmt.Errorf("the director left %d users' Actors away from their rooms for 30 s", len(users)-n)
		}
	}
	// A crash while the bots chat: node-2 ends without a word, its rooms
	// and its users' Actors with it. Live nodes recover them from their
	// last checkpoints, by themselves; the bots' Sessions on the gateway
	// hold their posts meanwhile. What the rooms handled after their last
	// checkpoints, and what was on its way in the dead node, is lost.
	members := map[string]string{}
	for _, bt := range bots {
		members[bt.name] = bt.room
	}
	var crashed crashOutcome
	switch fault {
	case "consul-pause":
		crashed, err = pauseAndRecover(sys, gw, rooms, func() int {
			n := 0
			for _, bt := range bots {
				if bt.in.disconnected() {
					n++
				}
			}
			return n
		})
	default:
		crashed, err = crashAndRecover(c, sys, gw, rooms, members, 2)
	}
	if err != nil {
		close(stop)
		wg.Wait()
		return err
	}
	if crashed.addr != "" {
		gateways[2] = crashed.addr
	}
	// A fault that hit every room (the store outage) leaves nothing to
	// check the rest of the run on but what comes after it: from here on
	// (the epoch) every post must reach every member of its room once and
	// in its room's order, as anywhere else.
	var epoch map[string]uint64 // bot → its last post before the epoch
	if len(crashed.rooms) == rooms {
		epoch = map[string]uint64{}
		for _, bt := range bots {
			epoch[bt.name] = bt.sent.Load()
		}
	}

	// A rolling deploy while the bots chat: each node but the gateway in
	// turn is drained (its rooms and users' Actors move to the others with
	// their state), stopped and started again; then the gateway node is
	// drained too, its clients' Sessions staying on it.
	fmt.Printf("\nrolling restart: draining and restarting each node in turn, then draining the gateway\n")
	restarts := 0
	for i := 1; i < len(nodeNames); i++ {
		addr, err := c.restart(i)
		if err != nil {
			close(stop)
			wg.Wait()
			return fmt.Errorf("rolling restart of %s: %w", nodeNames[i], err)
		}
		gateways[i] = addr
		restarts++
		fmt.Printf("%s restarted at %s\n", nodeNames[i], addr)
	}
	if err := c.drain(0); err != nil {
		close(stop)
		wg.Wait()
		return fmt.Errorf("drain of %s: %w", nodeNames[0], err)
	}
	close(stop)
	wg.Wait()

	// Every post goes to every member of its room; wait for the last ones.
	var expected, delivered, dupes, early, misorder, refused, crashExpected, crashDelivered uint64
	var disconnected []string
	tally := func() {
		expected, delivered, dupes, early, misorder, refused, crashExpected, crashDelivered = 0, 0, 0, 0, 0, 0, 0, 0
		disconnected = disconnected[:0]
		for _, bt := range bots {
			bt.in.mu.Lock()
			if crashed.rooms[bt.room] {
				// Its room was on the crashed node: counted apart.
				crashExpected += (bt.sent.Load() - bt.in.refused) * botsPerRoom
				crashDelivered += bt.in.delivered
				dupes += bt.in.dupes
				refused += bt.in.refused
				if bt.in.gone != "" {
					disconnected = append(disconnected, bt.name+": "+bt.in.gone)
				}
				bt.in.mu.Unlock()
				continue
			}
			expected += (bt.sent.Load() - bt.in.refused) * botsPerRoom
			delivered += bt.in.delivered
			dupes += bt.in.dupes
			early += bt.in.late
			misorder += bt.in.misorder
			refused += bt.in.refused
			if bt.in.gone != "" {
				disconnected = append(disconnected, bt.name+": "+bt.in.gone)
			}
			bt.in.mu.Unlock()
		}
	}
	// afterEpoch counts the posts after the epoch: expected deliveries,
	// those that arrived, and those the room handled out of its poster's
	// order.
	afterEpoch := func() (expected, delivered, misorder uint64) {
		byRoom := map[string][]*bot{}
		for _, bt := range bots {
			byRoom[bt.room] = append(byRoom[bt.room], bt)
		}
		for _, p := range bots {
			e, sent := epoch[p.name], p.sent.Load()
			p.in.mu.Lock()
			refusedAfter := uint64(0)
			for _, q := range p.in.refusedSeqs {
				if q > e {
					refusedAfter++
				}
			}
			p.in.mu.Unlock()
			expected += (sent - e - refusedAfter) * botsPerRoom
			for _, member := range byRoom[p.room] {
				member.in.mu.Lock()
				seen, index := member.in.seen[p.name], member.in.index[p.name]
				for q := e + 1; q < uint64(len(seen)); q++ {
					if !seen[q] {
						continue
					}
					delivered++
					if q-1 > e && seen[q-1] && index[q-1] > index[q] {
						misorder++
					}
				}
				member.in.mu.Unlock()
			}
		}
		return expected, delivered, misorder
	}
	var epochExpected, epochDelivered, epochMisorder uint64
	for wait := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		tally()
		if epoch != nil {
			epochExpected, epochDelivered, epochMisorder = afterEpoch()
			expected, delivered, misorder = epochExpected, epochDelivered, epochMisorder
		}
		if delivered >= expected || time.Now().After(wait) {
			break
		}
	}
	if epoch != nil {
		fmt.Printf("\nafter %s and its recovery (every room hit): %d of %d deliveries arrived, %d handled out of order\n",
			crashed.what, epochDelivered, epochExpected, epochMisorder)
	}
	lost := expected - min(delivered, expected)
	crashLost := crashExpected - min(crashDelivered, crashExpected)
	// Every room kept its history through the moves and the restarts: the
	// room answers its last posts, numbered up to its every post.
	perRoom := map[string]uint64{}
	for _, bt := range bots {
		bt.in.mu.Lock()
		perRoom[bt.room] += bt.sent.Load() - bt.in.refused
		bt.in.mu.Unlock()
	}
	historyLost := 0
	for room, posts := range perRoom {
		res, err := sys.Root.RequestFuture(gw, &chatpb.History{Room: room}, 10*time.Second).Result()
		j, ok := res.(*chatpb.Joined)
		switch {
		case err != nil || !ok:
			historyLost++
			fmt.Printf("history of %s: no answer (%v %v)\n", room, err, res)
		case crashed.rooms[room] && len(j.GetHistory()) > 0:
			// Recovered from its checkpoint: its history up to then is
			// there, and it numbered what came after anew from it.
		case len(j.GetHistory()) == 0 || j.GetHistory()[len(j.GetHistory())-1].GetIndex()+1 != posts:
			historyLost++
			fmt.Printf("history of %s: %d posts kept, the last numbered %d, but %d were posted\n", room, len(j.GetHistory()), j.GetHistory()[max(0, len(j.GetHistory())-1)].GetIndex(), posts)
		}
	}
	fmt.Printf("rolling restart: %d of %d nodes drained and restarted, the gateway drained; rooms with their history intact: %d of %d\n",
		restarts, len(nodeNames)-1, len(perRoom)-historyLost, len(perRoom))
	slices.Sort(pauses)
	fmt.Printf("\nmoves %d (%d of them users' Actors; failed %d), messages sent %d (refused %d), deliveries %d of %d (each post to %d members), lost %d, duplicated %d, out of order %d, handled out of order %d\n",
		len(pauses), userMoves, failed, sent.Load(), refused, delivered, expected, botsPerRoom, lost, dupes, early, misorder)
	told := 0
	for _, bt := range bots {
		bt.in.mu.Lock()
		if bt.in.recovered > 0 {
			told++
		}
		bt.in.mu.Unlock()
	}
	reconnects := uint64(0)
	for _, bt := range bots {
		bt.in.mu.Lock()
		reconnects += bt.in.reconnects
		bt.in.mu.Unlock()
	}
	fmt.Printf("%s: %d clients were told their Actor came back from its checkpoint; %d were told their Session ended and connected again\n", crashed.what, told, reconnects)
	fmt.Printf("%s: the %d rooms it hit (theirs or a member's Actor there) served again %s after %s, recovered from their checkpoints; in them %d of %d deliveries arrived, %d lost to it\n"+
		"  (posts the rooms handled after their last checkpoint, posts on their way in an ended lifecycle, posts refused while a client was disconnected; nothing was lost elsewhere)\n",
		crashed.what, len(crashed.rooms), crashed.servedAfter.Round(time.Millisecond), crashed.since, crashDelivered, crashExpected, crashLost)
	if refused > 0 {
		for _, bt := range bots {
			if len(bt.in.refusals) > 0 {
				fmt.Printf("(refused, each told to its client: e.g. %s)\n", bt.in.refusals[0])
				break
			}
		}
	}
	if early > 0 {
		fmt.Printf("(out of order: a room's broadcasts sent just before and just after a move leave on two connections,\n" +
			" source -> gateway and target -> gateway, and nothing orders two connections; the rooms handled every post in order)\n")
	}
	if len(pauses) > 0 {
		fmt.Printf("pause p50 %.2f ms, p99 %.2f ms, max %.2f ms (seal on the source -> commit seen in the store)\n",
			ms(pauses[len(pauses)/2]), ms(pauses[min(len(pauses)-1, len(pauses)*99/100)]), ms(pauses[len(pauses)-1]))
	}
	timeouts := 0
	for _, d := range disconnected {
		if strings.Contains(d, "not confirmed") {
			timeouts++
		}
	}
	fmt.Printf("clients: %d connected, disconnected %d (by the seal timeout: %d)\n", len(bots), len(disconnected), timeouts)
	for _, d := range disconnected[:min(len(disconnected), 5)] {
		fmt.Printf("  disconnected %s\n", d)
	}
	if lost != 0 || dupes != 0 || misorder != 0 || historyLost != 0 || len(disconnected) != timeouts {
		return fmt.Errorf("lost=%d duplicated=%d handled-out-of-order=%d rooms-without-their-history=%d disconnected=%d", lost, dupes, misorder, historyLost, len(disconnected)-timeouts)
	}
	if len(pauses) == 0 {
		return errors.New("no room moved")
	}
	fmt.Printf("result: lost=0 duplicated=0 disconnected=0 after %d moves, %s (%d deliveries lost to it, said above) and a rolling restart of every node\n", len(pauses), crashed.what, crashLost)
	return nil
}

// probeTimeout bounds one probe of a room that may not serve yet: short,
// so that the time it serves again is measured within a probe's length.
const probeTimeout = 500 * time.Millisecond

// crashOutcome is what crashAndRecover or pauseAndRecover saw.
type crashOutcome struct {
	what        string          // the fault, for the summary
	since       string          // what servedAfter counts from
	addr        string          // the restarted node's gateway ("": none restarted)
	rooms       map[string]bool // the rooms the fault hit
	servedAfter time.Duration   // until every hit room answered (and its users' Actors were taken over, or their clients connected again)
}

// roomsServe probes each room through the gateway until it answers,
// printing how long after since (the moment named what) it served again;
// an error for one that does not within 2 minutes.
func roomsServe(sys *actor.ActorSystem, gw *actor.PID, rooms map[string]bool, since time.Time, what string) error {
	for r := range rooms {
		for {
			res, err := sys.Root.RequestFuture(gw, &chatpb.History{Room: r}, probeTimeout).Result()
			if _, ok := res.(*chatpb.Joined); ok && err == nil {
				fmt.Printf("  %s serves again %s after %s\n", r, time.Since(since).Round(time.Millisecond), what)
				break
			}
			if time.Since(since) > 2*time.Minute {
				return fmt.Errorf("%s did not serve again within 2 minutes of %s", r, what)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// pauseAndRecover pauses the demo's Consul past every node's lease TTL:
// every node lifecycle ends (its objects fail what they held, loudly; the
// gateway's clients are told their Session ended) and each node rejoins as
// a new lifecycle once Consul answers again. Live nodes then recover every
// room and user's Actor from its last checkpoint by themselves, and the
// bots connect again. It returns once every room answers and every bot is
// connected again; every room counts as hit.
func pauseAndRecover(sys *actor.ActorSystem, gw *actor.PID, rooms int, disconnected func() int) (crashOutcome, error) {
	out := crashOutcome{what: fmt.Sprintf("Consul paused %s", storePause), since: "it answered again", rooms: map[string]bool{}}
	for r := 0; r < rooms; r++ {
		out.rooms[fmt.Sprintf("room-%d", r)] = true
	}
	fmt.Printf("\nstore outage: Consul paused (SIGSTOP) for %s, past every node's lease: each node's lifecycle ends and it rejoins as a new one;\n"+
		"live nodes then recover every room and user's Actor from its checkpoint by themselves, and told clients connect again\n", storePause)
	if err := pauseStore(storePause); err != nil {
		return out, err
	}
	healed := time.Now()
	fmt.Printf("Consul resumed\n")
	if err := roomsServe(sys, gw, out.rooms, healed, "Consul answered again"); err != nil {
		return out, err
	}
	for n := disconnected(); n > 0; n = disconnected() {
		if time.Since(healed) > 2*time.Minute {
			return out, fmt.Errorf("%d clients were not connected again within 2 minutes of the store's return", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	out.servedAfter = time.Since(healed)
	fmt.Printf("every room serves and every client is connected again %s after Consul answered again\n", out.servedAfter.Round(time.Millisecond))
	return out, nil
}

// crashAndRecover crashes node i, waits until every room answers again
// (the crashed node's ones recovered by live nodes, without a call but
// these probes) and its users' Actors were taken over, then starts node i
// again as a new lifecycle once its descriptor is gone.
func crashAndRecover(c cluster, sys *actor.ActorSystem, gw *actor.PID, rooms int, members map[string]string, i int) (crashOutcome, error) {
	out := crashOutcome{what: "crash of " + nodeNames[i], since: "the crash", rooms: map[string]bool{}}
	ctx := context.Background()
	nodes, err := c.store().ListNodes(ctx, "default")
	if err != nil {
		return out, err
	}
	rid := ""
	for _, n := range nodes {
		if n.Node.GetName() == nodeNames[i] {
			rid = n.Node.GetNodeRid()
		}
	}
	owned := 0
	for r := 0; r < rooms; r++ {
		room := fmt.Sprintf("room-%d", r)
		if v, err := c.store().Read(ctx, location.Key(location.KindUserSpot, room)); err == nil && v.Record.GetOwner().GetNodeRid() == rid {
			out.rooms[room] = true
			owned++
		}
	}
	users := 0
	for user, room := range members {
		// A user's Actor there takes its queued posts down with it: its
		// room counts as hit by the crash too.
		if v, err := c.store().Read(ctx, location.Key(location.KindActor, chat.UserActor(user))); err == nil && v.Record.GetOwner().GetNodeRid() == rid {
			out.rooms[room] = true
			users++
		}
	}
	fmt.Printf("\ncrash: %s ends without a word (it owns %d rooms and %d users' Actors); live nodes recover them from their checkpoints by themselves\n",
		nodeNames[i], owned, users)
	began := time.Now()
	if err := c.crash(i); err != nil {
		return out, err
	}
	if err := roomsServe(sys, gw, out.rooms, began, "the crash"); err != nil {
		return out, err
	}
	// Its users' Actors come back once the live nodes took the dead
	// lifecycle for ended (its lease revoked): the rooms they talk in
	// were hit until then, and only then is the node's name free again.
	for user, room := range members {
		key := location.Key(location.KindActor, chat.UserActor(user))
		for {
			v, err := c.store().Read(ctx, key)
			if err != nil || v.Record.GetOwner().GetNodeRid() != rid {
				break // taken over (or gone)
			}
			if time.Since(began) > 2*time.Minute {
				return out, fmt.Errorf("%s's Actor (room %s) was not recovered within 2 minutes of the crash", user, room)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	out.servedAfter = time.Since(began)
	for {
		nodes, err := c.store().ListNodes(ctx, "default")
		held := err != nil
		for _, n := range nodes {
			held = held || n.Node.GetNodeRid() == rid
		}
		if !held {
			break
		}
		if time.Since(began) > 2*time.Minute {
			return out, fmt.Errorf("%s's descriptor was still there 2 minutes after the crash", nodeNames[i])
		}
		time.Sleep(100 * time.Millisecond)
	}
	addr, err := c.startAgain(i)
	if err != nil {
		return out, err
	}
	out.addr = addr
	fmt.Printf("%s started again at %s (a new lifecycle)\n", nodeNames[i], addr)
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
