// Command roam-chaos is roam's chaos test on real processes (`make chaos`,
// `make chaos-short`): three node processes on a restartable Consul,
// traffic by Spot ID and continuous moves, one fault at a time, and a
// history check over every call. It prints a table (fault, messages,
// moves, lost accepted, lost with an ended node, duplicated, two-incarnation
// overlaps, max unserved after heal, untyped errors) and exits non-zero if
// a safety figure is non-zero or an object stays unserved past the bound.
//
//	roam-chaos run [-short] [-faults node-kill,consul-restart] [-keep]
//	roam-chaos check DIR/<fault>   (check a kept fault's records again)
//	roam-chaos node --consul 127.0.0.1:8500 --name node-1 …   (a node process; the run starts them)
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/roamactors/roam/chaos"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "node" {
		if err := chaos.NodeMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "roam-chaos node:", err)
			os.Exit(1)
		}
		return
	}
	args := os.Args[1:]
	if len(args) > 1 && args[0] == "check" {
		// Check a kept scenario directory again: roam-chaos check DIR/node-kill
		set := chaos.Settings{LeaseTTL: 4 * time.Second, RestoreTimeout: 5 * time.Second, CallTimeout: 3 * time.Second}
		r, err := chaos.CheckDir(args[1], set)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		chaos.PrintTable(os.Stdout, set, []chaos.Row{{Scenario: chaos.Scenario{Name: args[1]}, Report: r, Bound: set.Bound()}})
		return
	}
	if len(args) > 0 && args[0] == "run" {
		args = args[1:]
	}
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	short := fs.Bool("short", false, "the short subset (make chaos-short): "+strings.Join(chaos.ShortScenarios(), ", "))
	faults := fs.String("faults", "", "comma-separated fault names (default: all, or the short subset)")
	keep := fs.Bool("keep", false, "keep the work directory (logs, record files, ops) even when every fault passed")
	dir := fs.String("dir", "", "work directory (default: a new temporary directory)")
	ttl := fs.Duration("ttl", 4*time.Second, "owner lease TTL of the nodes (whole seconds)")
	warm := fs.Duration("warm", 0, "traffic before each fault (default 12 s short, 35 s full)")
	steady := fs.Duration("steady", 0, "traffic after each recovery (default 8 s short, 35 s full)")
	list := fs.Bool("list", false, "list the faults and exit")
	director := fs.Bool("director", false, "run the placement director on every node: its idle moves join the mover's")
	_ = fs.Parse(args)
	if *list {
		for _, s := range chaos.Scenarios() {
			fmt.Printf("%-22s %s\n", s.Name, s.Desc)
		}
		return
	}
	bin, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if _, err := chaos.ConsulBinary(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	set := chaos.Settings{LeaseTTL: *ttl, RestoreTimeout: 5 * time.Second, CallTimeout: 3 * time.Second,
		Warm: 35 * time.Second, Steady: 35 * time.Second, Objects: 12, OpEvery: 50 * time.Millisecond,
		MoveEvery: 150 * time.Millisecond, Bin: bin, Out: os.Stdout, Director: *director}
	var names []string
	if *short {
		names = chaos.ShortScenarios()
		set.Warm, set.Steady = 12*time.Second, 8*time.Second
	}
	if *faults != "" {
		names = strings.Split(*faults, ",")
	}
	if *warm > 0 {
		set.Warm = *warm
	}
	if *steady > 0 {
		set.Steady = *steady
	}
	set.Dir = *dir
	if set.Dir == "" {
		set.Dir, err = os.MkdirTemp("", "roam-chaos-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	fmt.Printf("roam-chaos: work directory %s\n", set.Dir)
	start := time.Now()
	rows, ok := chaos.Run(set, names, os.Stdout)
	fmt.Printf("\n%d faults in %s; work directory %s\n", len(rows), time.Since(start).Round(time.Second), set.Dir)
	if !ok {
		fmt.Println("FAILED: a safety figure is non-zero, an object stayed unserved past the bound, or a fault could not be run (details above; logs, record files and ops in the work directory)")
		os.Exit(1)
	}
	if !*keep && *dir == "" {
		_ = os.RemoveAll(set.Dir)
		fmt.Println("all passed; work directory removed (-keep keeps it)")
	}
}
