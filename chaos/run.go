package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Row is one fault's line of the results table.
type Row struct {
	Scenario Scenario
	Report   Report
	Err      error
	Took     time.Duration
	Bound    time.Duration
}

// Failed reports whether the row fails the run: a safety figure, an object
// unserved beyond the bound (or never again), or a harness error.
func (r Row) Failed() bool {
	return r.Err != nil || !r.Report.Safe() || r.Report.NeverServed > 0 || time.Duration(r.Report.MaxUnserved) > r.Bound
}

// RunScenario runs one fault in a fresh environment: Consul, three node
// processes, traffic and moves; the fault; traffic until every object was
// served again after the heal, then Steady more; a final request to every
// object; the history check.
func RunScenario(set Settings, sc Scenario) Row {
	start := time.Now()
	row := Row{Scenario: sc, Bound: set.Bound()}
	e, err := newEnv(set, sc.Name, sc.Consuls, sc.Proxy)
	if err != nil {
		row.Err = err
		return row
	}
	d := newDriver(e)
	d.start()
	finishAndCheck := func(injectErr error) Row {
		d.finish()
		e.finalCalls(d)
		end := time.Now().UnixNano()
		e.close()
		lines, err := ReadLines(e.dir)
		if err != nil && injectErr == nil {
			injectErr = err
		}
		d.mu.Lock()
		h := History{Lines: lines, Ops: d.ops, Killed: e.killed, Heals: e.heals, End: end,
			Moves: d.moves, MovesFailed: d.movesFailed, MoveUntyped: d.moveUntyped, Faults: e.faults,
			SendLossWindow: int64(2*set.LeaseTTL + set.RestoreTimeout + set.CallTimeout + 5*time.Second)}
		moveErrs := d.moveErrs
		d.mu.Unlock()
		row.Report = Check(h)
		row.Err = injectErr
		row.Took = time.Since(start)
		e.save(h, row.Report, moveErrs)
		return row
	}

	// Warm up: every object served once, and Warm of traffic and moves.
	warmStart := time.Now().UnixNano()
	if err := waitFor(2*time.Minute, 200*time.Millisecond, func() (bool, error) {
		ok, _ := d.servedSince(warmStart)
		return ok, nil
	}, "every object served once"); err != nil {
		return finishAndCheck(err)
	}
	time.Sleep(set.Warm) // traffic before the fault; no outcome is waited on
	ops, ok, moves := d.counts()
	e.logf("warm: %d calls (%d ok), %d moves; injecting: %s", ops, ok, moves, sc.Desc)

	if err := sc.Inject(e, d); err != nil {
		e.logf("fault injection failed: %v", err)
		return finishAndCheck(err)
	}
	e.mu.Lock()
	last := e.heals[len(e.heals)-1]
	e.mu.Unlock()
	// Recovery: wait, on progress, until every object answered again,
	// three times the bound at most (the figure reports how long it took).
	var waiting []string
	err = waitFor(3*set.Bound(), 200*time.Millisecond, func() (bool, error) {
		var ok bool
		ok, waiting = d.servedSince(last)
		return ok, nil
	}, "every object served after the heal")
	if err != nil {
		e.logf("objects still unserved %s after the heal: %v", 3*set.Bound(), waiting)
	} else {
		e.logf("every object served again %.1f s after the heal", float64(time.Now().UnixNano()-last)/1e9)
	}
	time.Sleep(set.Steady) // traffic after the recovery
	return finishAndCheck(nil)
}

// finalCalls makes one last request to every object, so its last record
// is its final state, retrying each for a while.
func (e *env) finalCalls(d *driver) {
	for _, o := range d.objs {
		deadline := time.Now().Add(20 * time.Second)
		for i := 0; time.Now().Before(deadline); i++ {
			up := e.upNodes()
			if len(up) == 0 {
				break
			}
			op := d.call(up[i%len(up)], o, fmt.Sprintf("%s.final%d", o, i), false)
			if op.OK {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// save writes the history and the report into the scenario's directory.
func (e *env) save(h History, r Report, moveErrs map[string]int) {
	write := func(name string, v any) {
		b, err := json.MarshalIndent(v, "", " ")
		if err == nil {
			_ = os.WriteFile(filepath.Join(e.dir, name), b, 0o644)
		}
	}
	f, err := os.Create(filepath.Join(e.dir, "ops.jsonl"))
	if err == nil {
		enc := json.NewEncoder(f)
		for _, op := range h.Ops {
			_ = enc.Encode(op)
		}
		f.Close()
	}
	write("report.json", struct {
		Report   Report
		MoveErrs map[string]int
		Killed   map[string]int64
		Heals    []int64
		Events   []string
	}{r, moveErrs, h.Killed, h.Heals, e.events})
}

// Run runs the named scenarios (all when names is empty) and prints the
// table to out. It reports whether every row passed.
func Run(set Settings, names []string, out io.Writer) ([]Row, bool) {
	var rows []Row
	all := Scenarios()
	for _, sc := range all {
		if len(names) > 0 && !contains(names, sc.Name) {
			continue
		}
		fmt.Fprintf(out, "\n=== %s: %s\n", sc.Name, sc.Desc)
		row := RunScenario(set, sc)
		rows = append(rows, row)
		fmt.Fprintf(out, "=== %s done in %s: %s\n", sc.Name, row.Took.Round(time.Second), summary(row))
	}
	PrintTable(out, set, rows)
	ok := true
	for _, r := range rows {
		if r.Failed() {
			ok = false
		}
	}
	return rows, ok
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func summary(r Row) string {
	if r.Err != nil {
		return "ERROR " + r.Err.Error()
	}
	if r.Failed() {
		return "FAIL"
	}
	return "ok"
}

func secs(ns int64) string { return fmt.Sprintf("%.1f s", float64(ns)/1e9) }

// PrintTable prints the results table and the details of every non-zero
// safety figure.
func PrintTable(out io.Writer, set Settings, rows []Row) {
	fmt.Fprintf(out, "\nroam chaos: 3 node processes, %d counters (Instance Spots, PreserveStateWith, recovered from checkpoints), lease TTL %s, restore timeout %s, call timeout %s; unserved bound %s\n\n",
		set.Objects, set.LeaseTTL, set.RestoreTimeout, set.CallTimeout, set.Bound())
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintln(tw, "fault\tmessages ok/sent\tmoves\tfaults\tlost accepted\tlost w/ ended node\tlost, logged\tduplicated\ttwo incarnations\tmax unserved after heal\tuntyped errors\tverdict\t")
	for _, r := range rows {
		rep := r.Report
		unserved := secs(rep.MaxUnserved)
		if rep.NeverServed > 0 {
			unserved += fmt.Sprintf(" (%d never)", rep.NeverServed)
		}
		fmt.Fprintf(tw, "%s\t%d/%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%s\t\n", r.Scenario.Name, rep.Accepted, rep.Messages, rep.Moves, rep.Faults,
			rep.LostAccepted, rep.LostEnded, rep.LostLogged, rep.Duplicated, rep.Overlaps, unserved, rep.Untyped, verdict(r))
	}
	tw.Flush()
	fmt.Fprint(out, legend)
	for _, r := range rows {
		if len(r.Report.Details) == 0 && r.Err == nil && len(r.Report.Errors) == 0 && r.Report.LostEnded == 0 {
			continue
		}
		fmt.Fprintf(out, "\n%s:\n", r.Scenario.Name)
		if r.Err != nil {
			fmt.Fprintf(out, "  harness error: %v\n", r.Err)
		}
		if len(r.Report.Errors) > 0 {
			var cs []string
			for c, n := range r.Report.Errors {
				cs = append(cs, fmt.Sprintf("%s %d", c, n))
			}
			sort.Strings(cs)
			fmt.Fprintf(out, "  call errors by class (unreachable: the entry node did not answer the driver): %s\n", strings.Join(cs, ", "))
		}
		if r.Report.LostEnded > 0 {
			fmt.Fprintf(out, "  lost with an ended node: %d: %d handled there after the object's last checkpoint, %d one-way sends never handled (sent to, or queued on, a node that ended)\n",
				r.Report.LostEnded, r.Report.LostEndedHandled, r.Report.LostEndedSends)
		}
		for _, d := range r.Report.Details {
			fmt.Fprintf(out, "  %s\n", d)
		}
	}
}

func verdict(r Row) string {
	switch {
	case r.Err != nil:
		return "ERROR"
	case !r.Report.Safe():
		return "UNSAFE"
	case r.Report.NeverServed > 0 || time.Duration(r.Report.MaxUnserved) > r.Bound:
		return "STUCK"
	}
	return "ok"
}

// CheckDir checks a scenario's saved work directory again (the record
// files, ops.jsonl and report.json a run left there).
func CheckDir(dir string, set Settings) (Report, error) {
	lines, err := ReadLines(dir)
	if err != nil {
		return Report{}, err
	}
	var saved struct {
		Report Report
		Killed map[string]int64
		Heals  []int64
	}
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		return Report{}, err
	}
	if err := json.Unmarshal(b, &saved); err != nil {
		return Report{}, err
	}
	f, err := os.Open(filepath.Join(dir, "ops.jsonl"))
	if err != nil {
		return Report{}, err
	}
	defer f.Close()
	var ops []Op
	dec := json.NewDecoder(f)
	for {
		var op Op
		if err := dec.Decode(&op); err != nil {
			break
		}
		ops = append(ops, op)
	}
	end := int64(0)
	for _, op := range ops {
		end = max(end, op.End)
	}
	h := History{Lines: lines, Ops: ops, Killed: saved.Killed, Heals: saved.Heals, End: end,
		Moves: saved.Report.Moves, MovesFailed: saved.Report.MovesFailed, Faults: saved.Report.Faults,
		SendLossWindow: int64(2*set.LeaseTTL + set.RestoreTimeout + set.CallTimeout + 5*time.Second)}
	return Check(h), nil
}

const legend = `
messages ok/sent: calls by Spot ID the driver made (requests and one-way sends, through a random live node) and those
  answered with success. moves: committed Relocates. faults: faults injected.
lost accepted: ops answered with success (or sends whose Do returned nil) whose effect never appears in, or drops out
  of, the object's state lineage, silently and for any reason but an ended node: must be 0.
lost w/ ended node: such ops lost with a node lifecycle that ended abnormally (SIGKILLed, or its lease ended): its
  objects' state, and sends queued on it, sent to it as the object's owner, or sent while the object was out of service
  after it ended. docs/FAULTS.md lists this loss as accepted; it is counted, not failed.
lost, logged: one-way sends never handled that roam itself logged and counted as undelivered (a send_* warning on that
  object, such as a send that reached a removed move target): a loud loss docs/FAULTS.md allows; counted, not failed.
duplicated: extra applications of an op id (the driver never retries an id): must be 0.
two incarnations: handler runs of an incarnation of an object after a newer incarnation of it had handled a message
  (wall clock of one machine): must be 0.
max unserved after heal: the longest time from a fault's heal until an object answered a request with success again.
untyped errors: call or move errors that match no roamerr class with errors.Is.
verdict: UNSAFE (a safety figure is non-zero), STUCK (unserved past the bound, or never again), ERROR (the fault could not
  be run), ok.
`
