package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/roamactors/roam/location"
)

// costRow is scenario (g) for one state size: what one move costs the
// process that runs both nodes (the embedded store in it), as the mean
// over moves after a warm-up, and where it goes.
type costRow struct {
	Size        int
	Moves       int
	CPU         time.Duration // user + system CPU per move
	Bytes       uint64        // bytes allocated per move
	Allocs      uint64        // allocations per move
	TopCPU      string        // go tool pprof -top of the moves' CPU profile
	TopAllocs   string        // go tool pprof -top of the moves' allocated bytes
	ProfileFile string        // the CPU profile, for go tool pprof
}

// moveCost moves one Spot of size bytes back and forth between two nodes
// moves times, one after another, and measures the moves alone: CPU time
// and allocations from the process's counters, and CPU and allocation
// profiles kept in dir.
func moveCost(ctx context.Context, newStore func() (location.Store, error), size, moves int, dir string) (costRow, error) {
	row := costRow{Size: size, Moves: moves}
	w, done, err := openWorld(ctx, newStore, 2)
	if err != nil {
		return row, err
	}
	defer done()
	id := fmt.Sprintf("cost-%d", size)
	if err := w.activate(ctx, id, size); err != nil {
		return row, err
	}
	for i := 0; i < 5; i++ { // warm-up: connections, caches, pools
		if _, err := w.move(ctx, id); err != nil {
			return row, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return row, err
	}
	name := filepath.Join(dir, "move-"+strings.ReplaceAll(human(size), " ", ""))
	cpuFile, err := os.Create(name + ".cpu")
	if err != nil {
		return row, err
	}
	defer cpuFile.Close()
	writeAllocs := func(path string) error {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		return pprof.Lookup("allocs").WriteTo(f, 0)
	}
	runtime.GC() // the allocs profile is as of the last collection
	if err := writeAllocs(name + ".allocs-before"); err != nil {
		return row, err
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	cpu0 := processCPU()
	if err := pprof.StartCPUProfile(cpuFile); err != nil {
		return row, err
	}
	for m := 0; m < moves; m++ {
		if _, err := w.move(ctx, id); err != nil {
			pprof.StopCPUProfile()
			return row, fmt.Errorf("move %d: %w", m, err)
		}
	}
	pprof.StopCPUProfile()
	cpu1 := processCPU()
	runtime.ReadMemStats(&after)
	runtime.GC()
	if err := writeAllocs(name + ".allocs"); err != nil {
		return row, err
	}
	row.CPU = (cpu1 - cpu0) / time.Duration(moves)
	row.Bytes = (after.TotalAlloc - before.TotalAlloc) / uint64(moves)
	row.Allocs = (after.Mallocs - before.Mallocs) / uint64(moves)
	row.ProfileFile = name + ".cpu"
	row.TopCPU = pprofTop("-top", "-nodecount=12", name+".cpu")
	row.TopAllocs = pprofTop("-top", "-nodecount=12", "-sample_index=alloc_space", "-base", name+".allocs-before", name+".allocs")
	return row, nil
}

// processCPU is the user and system CPU time the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pprofTop is go tool pprof's table for a profile, without its header
// lines about the file and build, or why it is missing.
func pprofTop(args ...string) string {
	out, err := exec.Command("go", append([]string{"tool", "pprof"}, args...)...).Output()
	if err != nil {
		return fmt.Sprintf("(go tool pprof: %v)", err)
	}
	var keep []string
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		if strings.HasPrefix(l, "File:") || strings.HasPrefix(l, "Build ID:") || strings.HasPrefix(l, "Time:") {
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}
