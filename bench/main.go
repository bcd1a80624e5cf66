// Command bench measures roam (`make bench`) and writes bench/RESULTS.md:
// (a) relocation pause against state size on the embedded store and on
// Consul; (b) request throughput to one Spot relocated every 100 ms against
// the same Spot left alone; (c) moves per second of 1,000 Spots, one after
// another and 32 at a time; (d) baselines from the same run: Proto.Actor's
// own way of moving state (stop, persist to Consul, activate elsewhere and
// load, callers retry on dead letter) and plain Proto.Actor messaging
// without roam's mailbox; (e) a node of 10,000 Spots drained; (f) a SpotWide
// User Spot moved with its members; (g) what one move of 1 KiB and of
// 16 MiB costs in CPU and allocations, with profiles; (h) cold activations
// of Instance Spots against the store's round trip; (i) a million idle
// Spots on one node against plain Proto.Actor actors; (j) 5,000 objects
// that talk in clusters, placed by hashing, at random and by the
// placement director's co-location; (k) a Spot checkpointed every turn and
// every 100 ms against one never checkpointed, and the checkpoint write
// against a record compare-and-set. Every figure is a
// median over runs, beside its baseline as a ratio, except (g)'s means and
// (i)'s single run.
//
// For looking into a figure: ROAM_BENCH_TRACE=1 prints (h)'s store calls
// with their times; ROAM_BENCH_HEAP=<file> writes (i)'s heap profile and
// ROAM_BENCH_SCANPROF=<file> the CPU profile of its recovery scan;
// ROAM_BENCH_COLOCATION=1 prints (j)'s director outcomes and remote
// fraction as it works; ROAM_BENCH_DEBUG=1 logs every node at debug level
// to stderr, times in microseconds (a move's steps, each side's, in order).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/roamactors/roam/bench/baseline"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/consulstore"
	"github.com/roamactors/roam/location/consulstore/consultest"
	"github.com/roamactors/roam/location/memstore"
)

func main() {
	out := flag.String("out", "bench/RESULTS.md", "where the results go")
	runs := flag.Int("runs", 3, "runs per figure (the figure is their median)")
	quick := flag.Bool("quick", false, "fewer moves and Spots, for a smoke run")
	only := flag.String("only", "abcdefghijk", "the sections to run (letters a to k)")
	storeNames := flag.String("stores", "embedded,Consul", "the stores the sections that run on each store run on, comma-separated ((d) and (g) run on the embedded store)")
	talkers := flag.Int("talkers", 5000, "the objects of section (j)")
	scaleN := flag.Int("scale", 1000000, "the idle Spots of section (i)")
	units := flag.Int("drain-units", 0, "units in the drain section (default 10,000; 500 with -quick)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run (the nodes; Consul is another process) to this file")
	memProfile := flag.String("memprofile", "", "write the run's allocations (an allocs profile) to this file at the end")
	drainProfile := flag.String("drain-cpuprofile", "", "write a CPU profile of the first drain on each store, nothing else, to this file with the store's name appended (and its allocations to that name + .allocs, against .allocs-before)")
	flag.Parse()
	if *memProfile != "" {
		defer func() {
			f, err := os.Create(*memProfile)
			if err == nil {
				err = pprof.Lookup("allocs").WriteTo(f, 0)
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "bench:", err)
			}
		}()
	}
	if *cpuProfile != "" && *drainProfile != "" {
		fmt.Fprintln(os.Stderr, "bench: -cpuprofile and -drain-cpuprofile exclude each other (one CPU profile at a time)")
		os.Exit(2)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	for _, name := range strings.Split(*storeNames, ",") {
		if name != "embedded" && name != "Consul" {
			fmt.Fprintf(os.Stderr, "bench: -stores: no store %q (embedded, Consul)\n", name)
			os.Exit(2)
		}
	}
	if err := run(*out, *runs, *quick, *only, *units, *drainProfile, *scaleN, *talkers, *storeNames); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

var sizes = []int{1 << 10, 64 << 10, 1 << 20, 16 << 20}

func run(out string, runs int, quick bool, only string, drainUnits int, drainProfile string, scaleN, talkers int, storeNames string) error {
	want := func(section string) bool { return strings.Contains(only, section) }
	ctx := context.Background()
	srv, err := consultest.Launch()
	if err != nil {
		return err
	}
	defer srv.Stop()
	prefixes := 0
	stores := []benchStore{
		{"embedded", func() (location.Store, error) { return memstore.New(), nil }},
		{"Consul", func() (location.Store, error) {
			prefixes++
			cfg := consulstore.Config{Address: srv.Addr, Prefix: fmt.Sprintf("roam-bench/%d/%d", time.Now().UnixNano(), prefixes)}
			s, err := consulstore.New(cfg)
			return &consulClients{s, cfg}, err
		}},
	}
	// (g) and (d) run on the embedded store whatever -stores says.
	embedded := stores[0]
	stores = slices.DeleteFunc(stores, func(s benchStore) bool {
		return !slices.Contains(strings.Split(storeNames, ","), s.name)
	})
	moves, spots, window := 20, 1000, 3*time.Second
	if quick {
		moves, spots, window = 5, 100, time.Second
	}
	var b strings.Builder
	header(&b, runs)
	// Each section writes the results so far when it ends, and one that
	// fails says so in the results and lets the others run: a failure late
	// in a run of ten minutes must not lose what came before it.
	var failed []error
	var sectionTimes []string
	section := func(letter string, measure func() error) {
		if !want(letter) {
			return
		}
		before, began := snapshot(), time.Now()
		err := measure()
		took := time.Since(began).Round(time.Second)
		sectionTimes = append(sectionTimes, fmt.Sprintf("(%s) %v", letter, took))
		fmt.Fprintf(os.Stderr, "(%s) took %v\n", letter, took)
		if err != nil {
			failed = append(failed, fmt.Errorf("section (%s): %w", letter, err))
			fmt.Fprintf(&b, "\n**Section (%s) did not finish:** %v\n\n", letter, err)
			fmt.Fprintf(os.Stderr, "(%s) did not finish: %v\n", letter, err)
		}
		// Checked after every section: one that leaves nodes, clients or
		// connections running makes every later figure depend on it.
		if after, err := leftBehind(before); err != nil {
			failed = append(failed, fmt.Errorf("section (%s): %w", letter, err))
			fmt.Fprintf(&b, "\n**Section (%s) leaked:** %v\n\n", letter, err)
			fmt.Fprintf(os.Stderr, "(%s) leaked: %v\n", letter, err)
		} else {
			fmt.Fprintf(os.Stderr, "(%s) left nothing running: %s before, %s after\n", letter, before, after)
		}
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			failed = append(failed, err)
		}
	}

	pauseAt := map[string]map[int]pauseRow{}
	section("a", func() error {
		fmt.Fprintln(os.Stderr, "(a) pause against state size")
		b.WriteString("## (a) Pause against state size\n\n")
		b.WriteString("One Spot moved back and forth between two nodes (20 ms apart) while a sender posts one-way messages to it by Spot ID in a loop (a 200 µs timer between sends). ")
		b.WriteString("Pause: seal on the source → dispatch open on the target. p50 and p99 are medians over runs of each run's percentile. ")
		b.WriteString("Baselines, probed between the moves on the same two nodes with plain Proto.Actor actors: three one-way messages (a move's Restore request, relay-ready and cutover are three such hops), one compare-and-set on the store done as cheaply as it allows (on Consul a raw transaction of a copy of the Spot's record, sent with Consul's own client to the same agent; embedded, the store's own call) — the two make the **floor**, what a move's pause cannot go below: its three hops and the target's one owner CAS — and the state's bytes streamed in 256 KiB messages with at most 1 MiB unacknowledged (first send to last acknowledgement). ")
		b.WriteString("Other requests: a plain actor on node 0 asks one on node 1 every millisecond throughout; the p99 of those that overlapped a move against those with nothing else in flight, and of those that overlapped the plain stream of the same bytes.\n\n")
		b.WriteString("| store | state | moves | pause p50 | pause p99 | max | sends | lost | 3 hops p50 | store CAS p50 | floor | p50 / floor | p99 / floor | stream p50 | pause − stream | other p99 moving / idle | other p99 streaming / idle |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, s := range stores {
			pauseAt[s.name] = map[int]pauseRow{}
			for _, size := range sizes {
				m := moves
				if size >= 16<<20 {
					m = max(3, moves/4)
				}
				row, err := pauseVsSize(ctx, s.new, size, runs, m)
				if err != nil {
					return fmt.Errorf("pause %s %d: %w", s.name, size, err)
				}
				pauseAt[s.name][size] = row
				fmt.Fprintf(&b, "| %s | %s | %d | %.2f ms | %.2f ms | %.2f ms | %d | %d | %.2f ms | %.2f ms | %.2f ms | %.2f | %.2f | %.2f ms | %+.2f ms | %.2f / %.2f ms (%.1f×) | %.2f ms (%.1f×) |\n", s.name, human(size), row.Moves, row.P50, row.P99, row.Max, row.Sent, row.Lost, row.Hops,
					row.CAS, row.Floor, row.P50/row.Floor, row.P99/row.Floor,
					row.Stream, row.P50-row.Stream, row.NeighbourMoving, row.NeighbourIdle, row.NeighbourMoving/row.NeighbourIdle, row.NeighbourStreaming, row.NeighbourStreaming/row.NeighbourIdle)
				fmt.Fprintf(os.Stderr, "  %s %s p50 %.2f ms p99 %.2f ms (floor %.2f ms = 3 hops %.2f + CAS %.2f: p50 %.2f×, p99 %.2f×; stream %.2f ms; other p99 %.2f / %.2f ms)\n",
					s.name, human(size), row.P50, row.P99, row.Floor, row.Hops, row.CAS, row.P50/row.Floor, row.P99/row.Floor, row.Stream, row.NeighbourMoving, row.NeighbourIdle)
			}
		}

		return nil
	})

	section("b", func() error {
		fmt.Fprintln(os.Stderr, "(b) throughput while moving")
		b.WriteString("\n## (b) Throughput to one Spot relocated every 100 ms\n\n")
		fmt.Fprintf(&b, "Four closed-loop requesters (two per node) call one Spot by Spot ID; in the same world, phases of %s with the Spot left alone (the baseline) alternate with phases of %s with it relocated every 100 ms, three of each. Ratio: the median over runs of each run's ratio.\n\n", window/2, window/2)
		b.WriteString("| store | left alone | relocated every 100 ms | moves | ratio |\n|---|---|---|---|---|\n")
		for _, s := range stores {
			row, err := throughput(ctx, s.new, runs, window)
			if err != nil {
				return fmt.Errorf("throughput %s: %w", s.name, err)
			}
			fmt.Fprintf(&b, "| %s | %.0f req/s | %.0f req/s | %d | %.2f |\n", s.name, row.Static, row.Moving, row.Moves, row.Ratio)
		}

		return nil
	})

	section("c", func() error {
		fmt.Fprintln(os.Stderr, "(c) many Spots")
		b.WriteString("\n## (c) Moving many Spots\n\n")
		fmt.Fprintf(&b, "%d idle Spots (an 8-byte state each) moved from one node to the other one after another, then back 32 at a time. Baseline in the same run: as many compare-and-sets of the store, 32 at a time, each on a copy of one of the Spots' records, done as cheaply as the store allows (the probe of (a)'s floor: on Consul a raw txn sent with Consul's own client to the same agent). A move makes one such write, the target's commit, beside its reads.\n\n", spots)
		b.WriteString("| store | Spots | one after another | 32 at a time | store CAS, 32 at a time | moves / CAS |\n|---|---|---|---|---|---|\n")
		for _, s := range stores {
			row, err := bulkMoves(ctx, s.new, spots, 32)
			if err != nil {
				return fmt.Errorf("bulk %s: %w", s.name, err)
			}
			fmt.Fprintf(&b, "| %s | %d | %.0f moves/s | %.0f moves/s | %.0f/s | %.2f |\n", s.name, row.Spots, row.Sequential, row.Concurrent, row.CAS, row.Concurrent/row.CAS)
			fmt.Fprintf(os.Stderr, "  %s: %.0f moves/s one after another, %.0f/s 32 at a time; CAS %.0f/s 32 at a time\n", s.name, row.Sequential, row.Concurrent, row.CAS)
		}

		return nil
	})

	section("f", func() error {
		fmt.Fprintln(os.Stderr, "(f) SpotWide move against members")
		b.WriteString("## (f) A SpotWide User Spot moved with its members\n\n")
		b.WriteString("A SpotWide User Spot and its members (each with 1 KiB of state) moved back and forth between two nodes, one unit per move: one seal, one payload, one store transaction by the target. ")
		b.WriteString("Pause: seal on the source → the Spot's dispatch open on the target. 0 members is the Spot alone, the baseline.\n\n")
		b.WriteString("| store | members | moves | pause p50 | pause p99 | max |\n|---|---|---|---|---|---|\n")
		counts := []int{0, 10, 100}
		if quick {
			counts = []int{0, 10}
		}
		for _, s := range stores {
			for _, n := range counts {
				row, err := spotWidePause(ctx, s.new, n, 1<<10, runs, moves)
				if err != nil {
					return fmt.Errorf("spotwide %s %d: %w", s.name, n, err)
				}
				fmt.Fprintf(&b, "| %s | %d | %d | %.2f ms | %.2f ms | %.2f ms |\n", s.name, n, row.Moves, row.P50, row.P99, row.Max)
				fmt.Fprintf(os.Stderr, "  %s %d members: p50 %.2f ms p99 %.2f ms\n", s.name, n, row.P50, row.P99)
			}
		}
		b.WriteString("\n")
		return nil
	})

	section("g", func() error {
		fmt.Fprintln(os.Stderr, "(g) cost of one move")
		b.WriteString("## (g) What one move costs\n\n")
		b.WriteString("One Spot moved back and forth between two nodes on the embedded store, one move after another, after a warm-up of 5 moves; ")
		b.WriteString("the process runs both nodes and the store, so its CPU time and allocations are all of roam's work for the move (Proto.Actor's and gRPC's included). ")
		b.WriteString("Means over the moves; the profiles are of the moves alone (bench/out/, `go tool pprof`).\n\n")
		b.WriteString("| state | moves | CPU per move | allocated per move | allocations per move | allocated / state |\n|---|---|---|---|---|---|\n")
		var tops strings.Builder
		for _, size := range []int{1 << 10, 16 << 20} {
			m := 2000
			if size >= 16<<20 {
				m = 20
			}
			if quick {
				m = max(3, m/20)
			}
			row, err := moveCost(ctx, embedded.new, size, m, "bench/out")
			if err != nil {
				return fmt.Errorf("cost %s: %w", human(size), err)
			}
			fmt.Fprintf(&b, "| %s | %d | %.3f ms | %s | %d | %.1f |\n", human(size), row.Moves, float64(row.CPU.Microseconds())/1000, human(int(row.Bytes)), row.Allocs, float64(row.Bytes)/float64(size))
			fmt.Fprintf(os.Stderr, "  %s: CPU %v, %d B, %d allocations per move\n", human(size), row.CPU, row.Bytes, row.Allocs)
			fmt.Fprintf(&tops, "\n### %s: CPU\n\n```\n%s\n```\n\n### %s: allocated bytes\n\n```\n%s\n```\n", human(size), row.TopCPU, human(size), row.TopAllocs)
		}
		b.WriteString(tops.String())
		b.WriteString("\n")
		return nil
	})

	section("h", func() error {
		fmt.Fprintln(os.Stderr, "(h) cold activation")
		n, total := 300, 5000
		if quick {
			n, total = 50, 1000
		}
		b.WriteString("## (h) Cold activation\n\n")
		fmt.Fprintf(&b, "The first request to a Missing Instance Spot (an 8-byte state), from node 0 of two to its reply; placement picks either node. %d one after another, then %d by 32 concurrent callers. ", n, total)
		b.WriteString("Baselines in the same run: the store's own round trips, a consistent read of a missing key and one transaction (the compare-and-set of (a)'s floor: on Consul a raw txn sent with Consul's own client); and Proto.Actor's own grain activation, the first request to a grain identity on two cluster members of this process placed by its disthash lookup (no store), as many one after another and by as many callers, measured once per run and compared with each store's run of the same number. The activation waits for three store round trips one after another (docs/PROTOCOL.md §7.5): the read, the reservation and the Ready commit. Store calls: every call of both nodes per activation, the clean-up after the reply included. Rate / Proto.Actor: the median over runs of each run's ratio.\n\n")
		b.WriteString("| store | activation p50 | p99 | read p50 | txn p50 | p50 / txn | store calls per activation | 32 callers | Proto.Actor grain p50 | Proto.Actor 32 callers | rate / Proto.Actor |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
		// Proto.Actor's grains use no store: measured once per run, and
		// each store's run r compared with the grain run r.
		grainRuns := map[int]grainRow{}
		grains := func(r int) (grainRow, error) {
			if g, ok := grainRuns[r]; ok {
				return g, nil
			}
			g, err := grainActivations(ctx, r, n, total, 32)
			if err == nil {
				grainRuns[r] = g
			}
			return g, err
		}
		for _, s := range stores {
			row, err := coldActivations(ctx, s.new, runs, n, total, 32, grains)
			if err != nil {
				return fmt.Errorf("activation %s: %w", s.name, err)
			}
			fmt.Fprintf(&b, "| %s | %.2f ms | %.2f ms | %.1f µs | %.1f µs | %.1f | %.1f | %.0f activations/s | %.2f ms | %.0f activations/s | %.2f |\n", s.name, row.P50, row.P99, row.RoundTrip*1000, row.Txn*1000, row.P50/row.Txn, row.Calls, row.Rate, row.GrainP50, row.GrainRate, row.RateRatio)
			fmt.Fprintf(os.Stderr, "  %s: p50 %.2f ms p99 %.2f ms, read %.3f ms, txn %.3f ms, %.1f calls, %.0f/s; Proto.Actor grains p50 %.2f ms, %.0f/s (%.2f)\n", s.name, row.P50, row.P99, row.RoundTrip, row.Txn, row.Calls, row.Rate, row.GrainP50, row.GrainRate, row.RateRatio)
		}
		b.WriteString("\n")
		return nil
	})

	section("e", func() error {
		fmt.Fprintln(os.Stderr, "(e) drain")
		if drainUnits <= 0 {
			drainUnits = 10000
			if quick {
				drainUnits = 500
			}
		}
		var drains strings.Builder
		drains.WriteString("\n## (e) Draining a node\n\n")
		fmt.Fprintf(&drains, "%d idle Spots (one message handled each, and checkpointed: the drain starts once their checkpoint writes have stopped) on one node of three; the node is drained (64 units at a time) and every Spot is asked afterwards whether it still counts its message; %d runs, each in a fresh cluster (rate and pauses: medians over runs; moved, failed and lost: sums). ", drainUnits, runs)
		drains.WriteString("Baseline: the same node simply stopped, its Spots then asked the same way.\n\n")
		drains.WriteString("| store | units per run | moved | failed | units/s | pause p50 | pause p99 | store calls per unit (first run, by method) | state lost | state lost when simply stopped |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for _, s := range stores {
			profile := ""
			if drainProfile != "" {
				profile = drainProfile + "." + strings.ToLower(s.name)
			}
			row, err := drainNode(ctx, s.new, drainUnits, runs, profile)
			if err != nil {
				return fmt.Errorf("drain %s: %w", s.name, err)
			}
			fmt.Fprintf(&drains, "| %s | %d | %d | %d | %.0f | %.2f ms | %.2f ms | %.1f (%s) | %d | %d |\n", s.name, row.Units, row.Moved, row.Failed, row.Rate, row.P50, row.P99, row.Calls, row.CallsByMethod, row.Lost, row.StoppedLost)
			fmt.Fprintf(os.Stderr, "  %s %d units: %.0f units/s, p50 %.2f ms, %.1f store calls per unit (%s), lost %d (stopped: %d)\n", s.name, row.Units, row.Rate, row.P50, row.Calls, row.CallsByMethod, row.Lost, row.StoppedLost)
		}
		b.WriteString(drains.String())

		return nil
	})

	section("d", func() error {
		fmt.Fprintln(os.Stderr, "(d) baselines")
		b.WriteString("\n## (d) Baselines\n\n### Proto.Actor's own way against roam, on Consul\n\n")
		b.WriteString("Proto.Actor without roam: stop the actor on node A, persist its state to Consul KV, activate it on node B and load the state; ")
		b.WriteString("a sender keeps posting one-way messages and making requests, and re-resolves the owner from Consul and retries a request on a dead letter or timeout. ")
		b.WriteString("Its pause is the last message handled on A → the first handled on B. The state is written after the actor stopped, so late requests get a dead letter at once ")
		b.WriteString("(Proto.Actor's fastest variant; saving in the actor's own Stopping handler makes every move wait for the 200 ms request timeout). ")
		b.WriteString("The sender blocks on a request every 10 sends, so at most 9 one-way sends are in flight when the actor stops: the loss per move is bounded by that, and is never zero. ")
		b.WriteString("roam's row is (a) on Consul.\n\n")
		b.WriteString("| state | Proto.Actor pause p50 | p99 | sends lost per move | roam pause p50 | p99 | roam sends lost per move | pause ratio (Proto.Actor / roam) |\n|---|---|---|---|---|---|---|---|\n")
		trials := max(5, moves/2)
		for _, size := range sizes[:3] {
			var pauses []time.Duration
			var lost int
			for r := 0; r < runs; r++ {
				res, err := baseline.KillAndReactivate(ctx, srv.Addr, size, trials)
				if err != nil {
					return fmt.Errorf("baseline %d: %w", size, err)
				}
				for _, x := range res {
					pauses = append(pauses, x.Pause)
					lost += x.Lost
				}
			}
			roam := pauseAt["Consul"][size]
			p50 := ms(percentile(pauses, 0.5))
			fmt.Fprintf(&b, "| %s | %.2f ms | %.2f ms | %.1f | %.2f ms | %.2f ms | %.1f | %.1f |\n", human(size), p50, ms(percentile(pauses, 0.99)),
				float64(lost)/float64(len(pauses)), roam.P50, roam.P99, float64(roam.Lost)/float64(max(roam.Moves, 1)), p50/roam.P50)
		}

		b.WriteString("\n### Messaging without roam's mailbox\n\n")
		b.WriteString("Node 0 to an actor on node 1: a plain Proto.Actor actor (default mailbox) and the same actor as a roam Spot (relocatable mailbox and host), in the same run; ")
		b.WriteString("request round trip p50 by PID (5,000 one after another) and one-way throughput (200,000 sends, then one request; the median of three rounds of each, alternating).\n\n")
		b.WriteString("| run | plain RTT | roam RTT | plain one-way | roam one-way | RTT ratio | throughput ratio |\n|---|---|---|---|---|---|---|\n")
		var rows []overheadRow
		var rttRatios, rateRatios, idP99s, idRates []float64
		for r := 0; r < runs; r++ {
			row, err := overhead(ctx, embedded.new, 5000, 200000)
			if err != nil {
				return fmt.Errorf("overhead: %w", err)
			}
			rows = append(rows, row)
			rttRatios = append(rttRatios, row.RoamRTT/row.PlainRTT)
			rateRatios = append(rateRatios, row.RoamRate/row.PlainRate)
			idP99s = append(idP99s, row.IDP99/row.PIDP99)
			idRates = append(idRates, row.IDRate/row.PIDRate)
			fmt.Fprintf(&b, "| %d | %.0f µs | %.0f µs | %.0f msg/s | %.0f msg/s | %.2f | %.2f |\n", r+1, row.PlainRTT, row.RoamRTT,
				row.PlainRate, row.RoamRate, row.RoamRTT/row.PlainRTT, row.RoamRate/row.PlainRate)
			fmt.Fprintf(os.Stderr, "  run %d: by Spot ID p99 %.0f µs, %.0f req/s, CPU %.1f µs; by PID p99 %.0f µs, %.0f req/s, CPU %.1f µs\n", r+1, row.IDP99, row.IDRate, row.IDCPU, row.PIDP99, row.PIDRate, row.PIDCPU)
		}
		fmt.Fprintf(&b, "\nMedian ratios: round trip %.2f× Proto.Actor's, throughput %.2f× Proto.Actor's.\n", median(rttRatios), median(rateRatios))
		b.WriteString("\n### A request by Spot ID against one by PID\n\n")
		fmt.Fprintf(&b, "The same roam Spot on node 1, asked from node 0 by its Spot ID (`Spots().Request(id, msg).Do`, the route cached) and by its PID (Proto.Actor's `RequestFuture`, the baseline), in the same world: round trips one at a time, the two interleaved (5,000 each, each first every other time), and throughput with %d callers each calling again as soon as its call returns (10,000 requests a round; %d rounds of each, alternating; the median round), with the process's CPU time per request (both nodes) in those rounds. Ratios: by Spot ID / by PID, the median over runs.\n\n", requestCallers, requestRounds)
		fmt.Fprintf(&b, "| run | by Spot ID p50 | p99 | by PID p50 | p99 | p99 ratio | by Spot ID, %d callers | CPU per request | by PID, %d callers | CPU per request | throughput ratio |\n|---|---|---|---|---|---|---|---|---|---|---|\n", requestCallers, requestCallers)
		for i, row := range rows {
			fmt.Fprintf(&b, "| %d | %.0f µs | %.0f µs | %.0f µs | %.0f µs | %.2f | %.0f req/s | %.1f µs | %.0f req/s | %.1f µs | %.2f |\n", i+1, row.IDP50, row.IDP99, row.PIDP50, row.PIDP99,
				row.IDP99/row.PIDP99, row.IDRate, row.IDCPU, row.PIDRate, row.PIDCPU, row.IDRate/row.PIDRate)
		}
		fmt.Fprintf(&b, "\nMedian ratios, by Spot ID / by PID: p99 %.2f, throughput %.2f.\n", median(idP99s), median(idRates))
		return nil
	})
	section("j", func() error {
		n, window := talkers, 5*time.Second
		jRuns := min(runs, 2)
		if quick {
			n, window = min(n, 500), 2*time.Second
		}
		fmt.Fprintln(os.Stderr, "(j) co-location")
		b.WriteString("## (j) Objects that talk, placed by hashing, at random, and by the director\n\n")
		fmt.Fprintf(&b, "%d Instance Spots on three nodes of the embedded store, in clusters of 2–10 (drawn at random); each cluster passes one token around, every object handing it to a partner of its cluster drawn at random, by Spot ID, From its own context. ", n)
		b.WriteString("A hop is remote when the two objects are on different nodes (Proto.Actor's remote over loopback; a local hop is an in-process send). Every hop is paced by 50 ms (every cluster then hops at about the same rate and counts alike); measured over the window: the remote fraction, the mean hop latency (send → handled) and **throughput as hops per CPU-second** (the process's user and system CPU time, every node; the hops a core carries a second when this mix takes all of it: a remote hop costs serialization and the loopback connection on both sides). Not measured with the pacing off: with one token a cluster, the clusters whose members happen to share a node then hop fastest and take the cores (unpaced, the hash placement's hops were 0.4 % remote, not 67 %), so hops per second would measure that chance, not the placement. ")
		fmt.Fprintf(&b, "Three placements of the same objects in one run, each measured over %s: **hash**, where each object's first call activates it (rendezvous hashing of its ID over the nodes: Proto.Actor's own placement of grains); **random**, every object then moved to a node drawn at random (the director's starting point); **director**, after the placement director with co-location (sampling one message in 4, defaults otherwise, limits 1,000 attempts/s, 16 in flight, 2 s cooldown) has made its first move and then 5 s pass without one, then measured with the director paused (its rounds, every 250 ms here, read every node's table and would take CPU from this phase alone). ", window)
		fmt.Fprintf(&b, "Every move is idle-only: an object with a token queued or a turn running at its seal answers busy and stays. Each token counts its hops in order: lost and duplicated are hops missing or seen twice, and tokens not accounted for at the end; failed sends are sends whose sender got a typed error (the token ends there, loudly). Sums over %d runs (a run takes over a minute).\n\n", jRuns)
		b.WriteString("| objects | clusters | remote: hash | random | director | director / random | hop latency: hash | random | director | hops per CPU-s: hash | random | director | director / random | moves | busy answers | deferred | stale | settled in | pause p50 | p99 | max | lost | duplicated | failed sends |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		row, err := coLocation(ctx, n, window, jRuns)
		if err != nil {
			return fmt.Errorf("co-location: %w", err)
		}
		fmt.Fprintf(&b, "| %d | %d | %.1f %% | %.1f %% | %.1f %% | %.2f | %.3f ms | %.3f ms | %.3f ms | %.0f | %.0f | %.0f | %.2f | %d | %d | %d | %d | %.1f s | %.2f ms | %.2f ms | %.2f ms | %d | %d | %d |\n\n", row.Objects, row.Clusters,
			100*row.Hash.Remote, 100*row.Random.Remote, 100*row.Director.Remote, row.Director.Remote/row.Random.Remote, ms(row.Hash.Latency), ms(row.Random.Latency), ms(row.Director.Latency), row.Hash.Throughput, row.Random.Throughput, row.Director.Throughput, row.Director.Throughput/row.Random.Throughput,
			row.Moves, row.Busy, row.Deferred, row.Stale, row.Settle.Seconds(), row.P50, row.P99, row.Max, row.Lost, row.Duplicated, row.Fails)
		fmt.Fprintf(os.Stderr, "  remote %.1f%% hash, %.1f%% random, %.1f%% director; hops per CPU-s %.0f / %.0f / %.0f; moves %d busy %d; lost %d dup %d failed %d\n",
			100*row.Hash.Remote, 100*row.Random.Remote, 100*row.Director.Remote, row.Hash.Throughput, row.Random.Throughput, row.Director.Throughput, row.Moves, row.Busy, row.Lost, row.Duplicated, row.Fails)
		for _, e := range row.Errors {
			fmt.Fprintln(os.Stderr, "  failed send:", e)
		}
		if len(row.Errors) > 0 {
			b.WriteString("Failed sends (the sending object got the error; its token ends there and is counted apart from lost):\n\n")
			for _, e := range row.Errors {
				fmt.Fprintf(&b, "- %s\n", e)
			}
			b.WriteString("\n")
		}
		if row.Lost+row.Duplicated > 0 {
			return fmt.Errorf("co-location: %d hops lost, %d duplicated", row.Lost, row.Duplicated)
		}
		return nil
	})

	section("k", func() error {
		d := 4500 * time.Millisecond
		if quick {
			d = 1500 * time.Millisecond
		}
		fmt.Fprintln(os.Stderr, "(k) checkpoints")
		b.WriteString("## (k) Checkpoints\n\n")
		fmt.Fprintf(&b, "Four closed-loop requesters (two per node) call one Spot of 1 KiB state by Spot ID, in one world per run: a kind with its checkpoints off (the baseline), one that checkpoints after every handled message, one at most 100 ms after a change; each measured for %s, twice per run, in turn. Ratio: the median over runs of each run's ratio to the baseline. Written per request: how many checkpoints every-turn stored per request (the node's writer keeps one write per object in flight and coalesces the captures behind it to the newest). Write latency: the median of 200 checkpoint writes of 1 KiB (each a compare-and-set) against 200 record compare-and-sets of the same store, interleaved.\n\n", d/3)
		b.WriteString("| store | never | every turn | ratio | written per request | every 100 ms | ratio | checkpoint write p50 | record CAS p50 | ratio |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for _, st := range stores {
			row, err := checkpointThroughput(ctx, st.new, runs, d)
			if err != nil {
				return fmt.Errorf("checkpoints on %s: %w", st.name, err)
			}
			fmt.Fprintf(&b, "| %s | %.0f req/s | %.0f req/s | %.2f | %.2f | %.0f req/s | %.2f | %.1f µs | %.1f µs | %.2f |\n", st.name, row.Never, row.Turn, row.TurnRatio, row.Written,
				row.Interval, row.IntRatio, float64(row.PutP50)/1e3, float64(row.CASP50)/1e3, float64(row.PutP50)/float64(row.CASP50))
			fmt.Fprintf(os.Stderr, "  %s: never %.0f, turn %.0f (%.2f), 100ms %.0f (%.2f) req/s; put %v vs CAS %v\n", st.name, row.Never, row.Turn, row.TurnRatio, row.Interval, row.IntRatio, row.PutP50, row.CASP50)
		}
		b.WriteString("\n")
		return nil
	})

	// Last: a million Spots leave the machine slow to hand out memory for a
	// while (the large moves of (a) measured up to 4× slower right after).
	section("i", func() error {
		n := scaleN
		if quick {
			n = min(n, 20000)
		}
		fmt.Fprintln(os.Stderr, "(i) scale")
		b.WriteString("## (i) Idle Spots on one node\n\n")
		fmt.Fprintf(&b, "%d idle Spots (one request handled each) activated on one node of the embedded store by 32 callers, against as many plain Proto.Actor actors of the same type spawned by name in the same run, each having handled one request. ", n)
		b.WriteString("Heap: live bytes after collection; the store's records and the Spots' checkpoints (in this process, as the embedded store keeps them; the blob kind checkpoints, as a PreserveStateWith kind does by default) are measured apart and left out of the node's figure, which holds no route either (a cold activation caches none; the routes are cached, by a second call to each Spot, after the heap is measured). ")
		b.WriteString("Recovery scan: the start-up scan of a node restarted over all the records, beside the store's own listing of the same records in pages of the same size (the scan's floor). Request p99: 10,000 requests one after another to Spots among the first 1,000, then among all, every route cached (the node's route cache raised to hold them all: by default it holds 100,000, and a call past those reads the store); each the median of three rounds, every round started right after a garbage collection (so that a collection of the whole heap does not run beside the timed calls); beside it, the same requests by PID to the plain actors, among the first 1,000 and among all of them (a request to one of a million objects finds it cold in the CPU's caches, with or without roam). One run (a run takes minutes).\n\n")
		b.WriteString("| Spots | plain actor | roam Spot (node) | ratio | store record and checkpoint | recovery scan | store's listing | scan / listing | request p99, 1,000 routes | all routes | ratio | plain actor p99, 1,000 / all | ratio |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		row, err := scale(ctx, n)
		if err != nil {
			return fmt.Errorf("scale: %w", err)
		}
		fmt.Fprintf(&b, "| %d | %.0f B | %.0f B | %.2f | %.0f B | %.2f s | %.2f s | %.2f | %.3f ms | %.3f ms | %.2f | %.3f / %.3f ms | %.2f |\n\n", n, row.Plain, row.Spot, row.Spot/row.Plain, row.Store,
			row.Start.Seconds(), row.Listing.Seconds(), row.Start.Seconds()/row.Listing.Seconds(), row.P99Few, row.P99Many, row.P99Many/row.P99Few,
			row.PlainP99Few, row.PlainP99Many, row.PlainP99Many/row.PlainP99Few)
		fmt.Fprintf(os.Stderr, "  %d: plain %.0f B, Spot %.0f B, record %.0f B, scan %v (listing %v), p99 %.3f / %.3f ms (plain %.3f / %.3f ms)\n", n, row.Plain, row.Spot, row.Store, row.Start, row.Listing, row.P99Few, row.P99Many, row.PlainP99Few, row.PlainP99Many)
		return nil
	})

	fmt.Fprintf(&b, "\nWall time of each section: %s.\n", strings.Join(sectionTimes, ", "))
	if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
		failed = append(failed, err)
	}
	fmt.Fprintln(os.Stderr, "wrote", out)
	return errors.Join(failed...)
}

func header(b *strings.Builder, runs int) {
	commit, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	cpu := "unknown CPU"
	if info, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(info), "\n") {
			if name, ok := strings.CutPrefix(line, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(name), ":"))
				break
			}
		}
	}
	fmt.Fprintf(b, "# roam benchmark results\n\n")
	fmt.Fprintf(b, "- date: %s\n- commit: %s\n- machine: %s, %d cores, %s/%s, %s\n- Consul: %s dev agent on loopback; nodes in one process on loopback\n- runs per figure: %d (figures are medians over runs)\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), strings.TrimSpace(string(commit)), cpu, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), consultest.Version, runs)
	b.WriteString("Regenerate with `make bench`.\n\n")
}

func human(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// consulClients gives each node of a world its own Consul client of one
// store (one prefix), as separate processes have.
// benchStore is a store the per-store sections run on: its name in the
// results and -stores, and how a section gets a fresh one.
type benchStore struct {
	name string
	new  func() (location.Store, error)
}

type consulClients struct {
	*consulstore.Store
	cfg consulstore.Config
}

func (c *consulClients) another() (location.Store, error) { return consulstore.New(c.cfg) }
