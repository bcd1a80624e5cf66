package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/placement"
	"github.com/roamactors/roam/location/memstore"
)

// Section (j): objects that talk in clusters, placed by hashing, then at
// random, then by the director's co-location.
//
// Each cluster of 2–10 "talk" Instance Spots passes one token around: an
// object that gets it hands it to a partner of its cluster chosen at
// random, by Spot ID, From its own context (so the hop is sampled). A hop
// is local when sender and receiver are on one node. The tokens count
// every hop in order: a hop missing or seen twice is lost or duplicated.

// talkNet is one run's tokens and counters, shared by its objects.
type talkNet struct {
	stopped atomic.Bool
	local   atomic.Int64
	remote  atomic.Int64
	lost    atomic.Int64
	dup     atomic.Int64
	failed  atomic.Int64 // a send that returned an error (the token ends)
	errMu   sync.Mutex
	errs    []string     // the first failed sends' errors
	phase   atomic.Value // string: the placement being set up or measured
	parked  atomic.Int64 // tokens held at the end
	pace    atomic.Int64 // ns an object waits before it hands the token on; 0: at once
	latency atomic.Int64 // ns, sum over the hops counted (send → handled)
	hops    []atomic.Uint64
	size    map[string]int // cluster → members
}

var nets sync.Map // run id → *talkNet (a talk object finds its run's by its Spot ID)

// talker is a talk object; its ID is "<run>/<cluster>/<member>".
type talker struct{ handled uint64 }

func (t *talker) Receive(c actor.Context) {
	m, ok := c.Message().(*wrapperspb.StringValue)
	if !ok {
		return
	}
	if m.GetValue() == "wake" { // activates it
		c.Respond(m)
		return
	}
	f := strings.Fields(m.GetValue()) // "<token> <hop> <sender's address> <own ID> <sent at, Unix ns>"
	if len(f) != 5 {
		return
	}
	t.handled++
	run, rest, _ := strings.Cut(f[3], "/")
	cluster, member, _ := strings.Cut(rest, "/")
	v, ok := nets.Load(run)
	if !ok {
		return
	}
	n := v.(*talkNet)
	tok, _ := strconv.Atoi(f[0])
	hop, _ := strconv.ParseUint(f[1], 10, 64)
	switch last := n.hops[tok].Load(); {
	case hop <= last:
		n.dup.Add(1)
		return
	case hop > last+1:
		n.lost.Add(int64(hop - last - 1))
	}
	n.hops[tok].Store(hop)
	if hop > 1 { // the first comes from the bench, not an object
		at, _ := strconv.ParseInt(f[4], 10, 64)
		n.latency.Add(time.Now().UnixNano() - at)
		if f[2] == c.Self().Address {
			n.local.Add(1)
		} else {
			n.remote.Add(1)
		}
	}
	if n.stopped.Load() {
		n.parked.Add(1)
		return
	}
	size := n.size[cluster]
	next := rand.IntN(size - 1)
	if me, _ := strconv.Atoi(member); next >= me {
		next++
	}
	to := fmt.Sprintf("%s/%s/%d", run, cluster, next)
	// The call is built in the turn, From it (sampled there); paced, it is
	// sent later from a timer, outside any turn (by Spot ID, wherever
	// either object is by then).
	pace := time.Duration(n.pace.Load())
	msg := &wrapperspb.StringValue{}
	call := extensionOf(c).Spots().Send(to, msg).InstanceSpot("talk").From(c)
	from := c.Self().Address
	send := func() {
		// Stamped as it is sent: the latency is the send's, not the timer's.
		msg.Value = fmt.Sprintf("%d %d %s %s %d", tok, hop+1, from, to, time.Now().UnixNano())
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := call.Do(ctx); err != nil {
			n.failed.Add(1)
			n.errMu.Lock()
			if len(n.errs) == 0 {
				dumpGoroutines() // the calls stuck like this one, for looking into it
			}
			if len(n.errs) < 5 {
				n.errs = append(n.errs, fmt.Sprintf("%s, %s -> %s: %v", n.phase.Load(), from, to, err))
			}
			n.errMu.Unlock()
		}
	}
	if pace > 0 {
		time.AfterFunc(pace, send)
		return
	}
	send()
}

type talkerState struct{}

func (talkerState) Capture(a actor.Actor) ([]byte, error) {
	return strconv.AppendUint(nil, a.(*talker).handled, 10), nil
}

func (talkerState) Restore(a actor.Actor, b []byte) error {
	v, err := strconv.ParseUint(string(b), 10, 64)
	a.(*talker).handled = v
	return err
}

var talkKind = extension.Kind{StableType: "talk", Instance: true, Producer: func() actor.Actor { return &talker{} },
	Policy: extension.PreserveStateWith(talkerState{})}

// byAddress finds a talk object's node (its Spots) by its address.
var byAddress sync.Map // address → *extension.Extension

func extensionOf(c actor.Context) *extension.Extension {
	v, _ := byAddress.Load(c.Self().Address)
	return v.(*extension.Extension)
}

// coLocationPhase is one placement's figures.
type coLocationPhase struct {
	Remote  float64       // fraction of hops between nodes, paced
	Latency time.Duration // mean hop, send → handled, paced
	// Throughput is hops per CPU-second of the process (user and system,
	// every node) over the same paced window: the hops a core carries a
	// second when this traffic's mix takes all of its time.
	Throughput float64
}

// talkPace is the wait before each hop in the paced measurements: about
// 17,000 hops a second from 5,000 objects, well within two cores.
const talkPace = 50 * time.Millisecond

type coLocationRow struct {
	Objects, Clusters       int
	Hash, Random, Director  coLocationPhase
	Moves, Busy, Deferred   int64
	Stale                   int64
	Settle                  time.Duration
	P50, P99, Max           float64 // the director's moves' pauses, ms
	Lost, Duplicated, Fails int64
	Errors                  []string // the first failed sends' errors
}

// coLocation runs section (j) runs times; each figure is the median.
func coLocation(ctx context.Context, objects int, window time.Duration, runs int) (coLocationRow, error) {
	var rows []coLocationRow
	for r := range runs {
		row, err := coLocationRun(ctx, fmt.Sprintf("r%d", r), objects, window)
		if err != nil {
			return row, err
		}
		rows = append(rows, row)
	}
	med := func(f func(coLocationRow) float64) float64 {
		var v []float64
		for _, r := range rows {
			v = append(v, f(r))
		}
		return median(v)
	}
	out := rows[0]
	phase := func(f func(coLocationRow) coLocationPhase) coLocationPhase {
		return coLocationPhase{Remote: med(func(r coLocationRow) float64 { return f(r).Remote }),
			Latency:    time.Duration(med(func(r coLocationRow) float64 { return float64(f(r).Latency) })),
			Throughput: med(func(r coLocationRow) float64 { return f(r).Throughput })}
	}
	out.Hash = phase(func(r coLocationRow) coLocationPhase { return r.Hash })
	out.Random = phase(func(r coLocationRow) coLocationPhase { return r.Random })
	out.Director = phase(func(r coLocationRow) coLocationPhase { return r.Director })
	out.Moves = int64(med(func(r coLocationRow) float64 { return float64(r.Moves) }))
	out.Busy = int64(med(func(r coLocationRow) float64 { return float64(r.Busy) }))
	out.Deferred = int64(med(func(r coLocationRow) float64 { return float64(r.Deferred) }))
	out.Stale = int64(med(func(r coLocationRow) float64 { return float64(r.Stale) }))
	out.Settle = time.Duration(med(func(r coLocationRow) float64 { return float64(r.Settle) }))
	out.P50 = med(func(r coLocationRow) float64 { return r.P50 })
	out.P99 = med(func(r coLocationRow) float64 { return r.P99 })
	out.Max = med(func(r coLocationRow) float64 { return r.Max })
	out.Lost, out.Duplicated, out.Fails = 0, 0, 0
	out.Errors = nil
	for _, r := range rows { // sums: any loss in any run shows
		out.Errors = append(out.Errors, r.Errors...)
		out.Lost += r.Lost
		out.Duplicated += r.Duplicated
		out.Fails += r.Fails
	}
	return out, nil
}

func coLocationRun(ctx context.Context, run string, objects int, window time.Duration) (coLocationRow, error) {
	store := memstore.New()
	defer store.Close()
	w, err := startWorld(ctx, store, 3, func(c *extension.Config) {
		c.Kinds = []extension.Kind{talkKind}
		c.Placement = placement.Config{Enabled: true, Paused: true, Period: 250 * time.Millisecond,
			CoLocation: placement.CoLocation{Enabled: true, SampleEvery: 4},
			Limits:     placement.Limits{Rate: 1000, Burst: 100, Concurrency: 16, Cooldown: 2 * time.Second}}
	})
	if err != nil {
		return coLocationRow{}, err
	}
	defer w.stop(ctx)
	for _, n := range w.nodes {
		byAddress.Store(n.Node().Address(), n)
	}
	rng := rand.New(rand.NewPCG(7, uint64(len(run))))
	net := &talkNet{size: map[string]int{}}
	var ids []string
	for c := 0; len(ids) < objects; c++ {
		size := min(2+rng.IntN(9), max(2, objects-len(ids)))
		net.size[strconv.Itoa(c)] = size
		for m := range size {
			ids = append(ids, fmt.Sprintf("%s/%d/%d", run, c, m))
		}
	}
	clusters := len(net.size)
	net.hops = make([]atomic.Uint64, clusters)
	net.pace.Store(int64(talkPace))
	net.phase.Store("activating")
	nets.Store(run, net)
	defer nets.Delete(run)

	// Hash placement: each object where its first call activates it
	// (rendezvous hashing of its ID over the nodes).
	if err := forEach(len(ids), 32, func(i int) error {
		_, err := w.nodes[i%3].Spots().Request(ids[i], wrapperspb.String("wake")).InstanceSpot("talk").Timeout(30 * time.Second).Do(ctx)
		return err
	}); err != nil {
		return coLocationRow{}, fmt.Errorf("activate: %w", err)
	}
	for c := range clusters {
		id := fmt.Sprintf("%s/%d/0", run, c)
		if _, err := w.nodes[0].Spots().Send(id, wrapperspb.String(fmt.Sprintf("%d 1 - %s 0", c, id))).InstanceSpot("talk").Do(ctx); err != nil {
			return coLocationRow{}, err
		}
	}
	// measure: the remote fraction, the mean hop latency and the CPU time
	// per hop, with every hop paced (every cluster then hops at about the
	// same rate, and the figures weigh each cluster alike). Not measured
	// unpaced: with one token a cluster and none waiting, the clusters
	// whose members happen to share a node hop fastest and take the cores
	// (a hash placement's hops were then 0.4 % remote instead of 67 %), so
	// hops per second would measure chance, not the placement.
	measure := func() coLocationPhase {
		var p coLocationPhase
		time.Sleep(time.Second) // the hops of the phase before drain out
		l0, r0, lat0 := net.local.Load(), net.remote.Load(), net.latency.Load()
		cpu0 := cpuTime()
		time.Sleep(window) // the measurement window itself
		cpu := cpuTime() - cpu0
		l, r := net.local.Load()-l0, net.remote.Load()-r0
		p.Remote = float64(r) / float64(max(1, l+r))
		p.Latency = time.Duration((net.latency.Load() - lat0) / max(1, l+r))
		p.Throughput = float64(l+r) / max(cpu.Seconds(), 1e-9)
		return p
	}
	row := coLocationRow{Objects: objects, Clusters: clusters}
	net.phase.Store("hash placement")
	row.Hash = measure()

	// Random placement: each object moved to a node drawn at random.
	net.phase.Store("shuffling")
	if err := forEach(len(ids), 32, func(i int) error {
		ref, err := w.nodes[0].Spots().Find(ctx, ids[i])
		if err != nil {
			return err
		}
		to := w.nodes[rand.IntN(3)].NodeRid()
		if to == ref.NodeRid {
			return nil
		}
		_, err = w.nodes[0].Relocate(ctx, extension.InstanceSpotRef(ids[i]), to)
		return err
	}); err != nil {
		return row, fmt.Errorf("shuffle: %w", err)
	}
	net.phase.Store("random placement")
	row.Random = measure()
	net.phase.Store("director moving")

	// The director: resumed, until a few rounds pass without a move.
	w.takePauses()
	begin := time.Now()
	for _, n := range w.nodes {
		n.Placement().Resume()
	}
	committed := func() int64 {
		var s int64
		for _, n := range w.nodes {
			s += n.Placement().Outcomes()[placement.Committed]
		}
		return s
	}
	// The first moves wait for the director's first census of every
	// record (a page of 256 a round); from the first move on, it has
	// settled once 5 s pass without one.
	last, quiet := committed(), time.Now()
	for (last == 0 || time.Since(quiet) < 5*time.Second) && time.Since(begin) < 3*time.Minute {
		time.Sleep(250 * time.Millisecond) // one director period: polls its counts
		if c := committed(); c != last {
			last, quiet = c, time.Now()
		}
		if os.Getenv("ROAM_BENCH_COLOCATION") != "" { // the director's progress, on stderr
			l0, r0 := net.local.Load(), net.remote.Load()
			time.Sleep(250 * time.Millisecond)
			l, r := net.local.Load()-l0, net.remote.Load()-r0
			for _, n := range w.nodes {
				fmt.Fprintf(os.Stderr, "%v ", n.Placement().Outcomes())
			}
			fmt.Fprintf(os.Stderr, "remote %.2f\n", float64(r)/float64(max(1, l+r)))
		}
	}
	row.Settle = quiet.Sub(begin)
	// Measured with the directors paused, as the other placements are:
	// a settled director's rounds (every 250 ms here, each reading every
	// node's table of about 8,000 edges) would take CPU from the hops of
	// this phase alone.
	for _, n := range w.nodes {
		n.Placement().Pause()
	}
	net.phase.Store("director placement")
	row.Director = measure()
	for _, n := range w.nodes {
		o := n.Placement().Outcomes()
		row.Moves += o[placement.Committed]
		row.Busy += o[placement.Busy]
		row.Deferred += o[placement.Deferred]
		row.Stale += o[placement.Stale]
	}
	pauses := w.takePauses()
	if len(pauses) > 0 {
		row.P50, row.P99 = ms(percentile(pauses, 0.5)), ms(percentile(pauses, 0.99))
		for _, p := range pauses {
			row.Max = max(row.Max, ms(p))
		}
	}

	// Stop: every token is parked at its next hop, none lost.
	net.stopped.Store(true)
	deadline := time.Now().Add(time.Minute)
	for net.parked.Load()+net.failed.Load() < int64(clusters) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polls for the tokens in flight
	}
	row.Lost = net.lost.Load() + int64(clusters) - net.parked.Load() - net.failed.Load()
	row.Duplicated, row.Fails = net.dup.Load(), net.failed.Load()
	row.Errors = net.errs
	return row, nil
}

// dumpGoroutines writes every goroutine's stack to
// bench/out/colocation-goroutines.txt (or stderr): taken at the first
// failed send, it shows where the other calls to a stalled Spot wait.
func dumpGoroutines() {
	_ = os.MkdirAll("bench/out", 0o755)
	f, err := os.Create("bench/out/colocation-goroutines.txt")
	if err != nil {
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
		return
	}
	defer f.Close()
	_ = pprof.Lookup("goroutine").WriteTo(f, 2)
	fmt.Fprintln(os.Stderr, "  the goroutines at the first failed send: bench/out/colocation-goroutines.txt")
}

// cpuTime is the CPU time the process has used, user and system.
func cpuTime() time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}
