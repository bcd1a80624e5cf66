package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Line kinds in a node process's record file.
const (
	// LineHandled is one handler run on a counter.
	LineHandled = "h"
	// LineLife is a node lifecycle starting (at start and at each rejoin).
	LineLife = "life"
	// LineEnded is a node lifecycle's owner lease ending without Stop.
	LineEnded = "ended"
	// LineCrash is the process about to SIGKILL itself (an armed fault).
	LineCrash = "crash"
	// LineRestored is a move's target restoring a counter's state (NH).
	LineRestored = "restored"
	// LineUndelivered is roam logging a one-way send to Obj that it could
	// not deliver (its send_* warning events, also counted in
	// roam.relocation.sends_undelivered).
	LineUndelivered = "undelivered"
)

// Line is one record of a node process.
type Line struct {
	K    string `json:"k"`
	T    int64  `json:"t"`              // wall clock, ns (the handler's start for LineHandled)
	Proc string `json:"proc"`           // the process instance
	Node string `json:"node,omitempty"` // the node's name (node-1..3)
	Sys  string `json:"sys,omitempty"`  // the actor system: one per node lifecycle
	Rid  string `json:"rid,omitempty"`  // the lifecycle's node RID (LineLife)
	Inc  string `json:"inc,omitempty"`  // the incarnation's PID id roam/<kind>/<id>@<objgen>.<ownergen>
	Obj  string `json:"obj,omitempty"`  // the Spot ID
	Op   string `json:"op,omitempty"`   // the operation id
	Prev uint64 `json:"prev,omitempty"` // count before
	PH   uint64 `json:"ph,omitempty"`   // state hash before (0: empty state)
	N    uint64 `json:"n,omitempty"`    // count after
	NH   uint64 `json:"nh,omitempty"`   // state hash after
	Why  string `json:"why,omitempty"`
}

// incarnation names one incarnation of an object, across processes.
func (l Line) incarnation() string { return l.Proc + "/" + l.Sys + "/" + l.Inc }

// NextHash is the counter's state hash after applying op to a state whose
// hash is prev: every state names the whole sequence of ops that made it.
func NextHash(prev uint64, op string) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for i := range b {
		b[i] = byte(prev >> (8 * i))
	}
	h.Write(b[:])
	h.Write([]byte(op))
	v := h.Sum64()
	if v == 0 {
		v = 1 // 0 is the empty state
	}
	return v
}

// Op is one call the driver made.
type Op struct {
	ID    string `json:"id"`
	Obj   string `json:"obj"`
	Send  bool   `json:"send,omitempty"` // a one-way send (else a request)
	Entry string `json:"entry"`          // the node it was made through
	Start int64  `json:"start"`
	End   int64  `json:"end"`
	OK    bool   `json:"ok,omitempty"` // a request answered with success, or a send Do returned nil
	// Class is "" when OK, else the roamerr class name (Unavailable, …),
	// "untyped" for an error no roamerr class matches, or "unreachable"
	// when the entry node did not answer the driver at all.
	Class string `json:"class,omitempty"`
	Err   string `json:"err,omitempty"`
}

// History is one fault's run: what the nodes recorded, what the driver
// did, and when the harness hurt and healed things.
type History struct {
	Lines []Line
	Ops   []Op
	// Killed: processes the harness SIGKILLed (or that killed themselves
	// on an armed fault), with the kill time.
	Killed map[string]int64
	// Heals: when each injected fault was healed (SIGCONT sent, process
	// restarted, Consul back, cut healed).
	Heals []int64
	// End is the end of the observation.
	End int64
	// Moves that committed, and moves that failed.
	Moves, MovesFailed int
	// MoveUntyped are move errors no roamerr class matches.
	MoveUntyped []string
	Faults      int
	// SendLossWindow: a one-way send never handled counts as lost with an
	// ended node when some node lifecycle ended abnormally within this
	// long after the send was accepted (it may have been queued there).
	SendLossWindow int64
}

// StaleRouteGrace: a one-way send never handled that was made within this
// long after an ended owner's incarnation was replaced counts as lost with
// the ended node. A node's route cache may still name the ended owner then
// (docs/FAULTS.md: a send to a node that has left is dropped by the
// transport until the sender notices; route sweeps run every second).
const StaleRouteGrace = int64(2e9)

// outageGap: an object with no handler run within this long after a send
// was out of service then (the driver calls each object every 50 ms).
const outageGap = int64(250e6)

// Report is the checker's verdict on a History.
type Report struct {
	Messages, Accepted, Handled int
	Moves, MovesFailed          int
	Faults                      int
	// LostAccepted: accepted ops (a request answered with success, a send
	// that returned ok) whose effect never appears in, or disappears from,
	// the object's state lineage, other than by an ended node's state.
	LostAccepted int
	// LostEnded: accepted ops lost with the state (or the queue) of a node
	// lifecycle that ended abnormally: a SIGKILLed process, or a lease that
	// ended. docs/FAULTS.md lists this loss as accepted.
	LostEnded int
	// LostEndedSends: of LostEnded, one-way sends never handled.
	LostEndedSends int
	// LostEndedHandled: of LostEnded, ops that the ended lifecycle handled
	// after the last state of it that survived: after the object's last
	// checkpoint (the recovery restored an older state).
	LostEndedHandled int
	// LostLogged: one-way sends never handled that roam reported as
	// undelivered (a send_* warning on the object, e.g. a send that
	// reached a removed move target): lost loudly, as docs/FAULTS.md
	// allows. Matched one log line per send, in time order.
	LostLogged int
	// Duplicated: extra applications of an op (an op id handled n times
	// counts n-1).
	Duplicated int
	// Overlaps: handler runs of an incarnation of an object after a newer
	// incarnation of that object had already handled a message.
	Overlaps int
	// MaxUnserved: the longest time from a heal until an object answered
	// a request with success again; UnservedObj names that object.
	MaxUnserved int64
	UnservedObj string
	// NeverServed: objects not served again at all after a heal.
	NeverServed int
	// Untyped: errors matching no roamerr class (calls and moves).
	Untyped int
	// Typed errors by class.
	Errors map[string]int
	// Details explains each non-zero safety figure, a line per case (at
	// most a few per kind).
	Details []string
}

// Safe reports whether no safety figure is non-zero.
func (r Report) Safe() bool { return r.LostAccepted == 0 && r.Duplicated == 0 && r.Overlaps == 0 }

type lifecycle struct {
	proc, node, sys string
	start           int64
	endedAt         int64 // abnormal end (lease ended, process killed, a later lifecycle); 0 = not ended abnormally
}

// Check computes the Report of h.
func Check(h History) Report {
	r := Report{Moves: h.Moves, MovesFailed: h.MovesFailed, Faults: h.Faults, Errors: map[string]int{}}
	const maxDetails = 6
	details := map[string]int{}
	detail := func(kind, format string, args ...any) {
		details[kind]++
		if details[kind] <= maxDetails {
			r.Details = append(r.Details, kind+": "+fmt.Sprintf(format, args...))
		}
	}

	// Lifecycles, and which ended abnormally and when.
	lives := map[string]*lifecycle{} // sys → lifecycle
	procLives := map[string][]*lifecycle{}
	var handled []Line
	restored := map[uint64][]Line{} // state hash → its restores, in time order
	undelivered := map[string][]int64{}
	for _, l := range h.Lines {
		switch l.K {
		case LineUndelivered:
			undelivered[l.Obj] = append(undelivered[l.Obj], l.T)
		case LineRestored:
			if l.NH != 0 {
				restored[l.NH] = append(restored[l.NH], l)
			}
		case LineLife:
			lc := &lifecycle{proc: l.Proc, node: l.Node, sys: l.Sys, start: l.T}
			lives[l.Sys] = lc
			procLives[l.Proc] = append(procLives[l.Proc], lc)
		case LineHandled:
			if l.Inc != "" {
				l.Obj = objectID(l.Inc) // the PID names the object
			}
			handled = append(handled, l)
		}
	}
	if h.Killed == nil {
		h.Killed = map[string]int64{}
	}
	for _, l := range h.Lines {
		// A process that killed itself on an armed fault ended then.
		if t, ok := h.Killed[l.Proc]; l.K == LineCrash && (!ok || l.T < t) {
			h.Killed[l.Proc] = l.T
		}
	}
	for _, l := range h.Lines {
		if l.K == LineEnded {
			if lc := lives[l.Sys]; lc != nil && (lc.endedAt == 0 || l.T < lc.endedAt) {
				lc.endedAt = l.T
			}
		}
	}
	for proc, ls := range procLives {
		sort.Slice(ls, func(i, j int) bool { return ls[i].start < ls[j].start })
		for i, lc := range ls {
			if i+1 < len(ls) && lc.endedAt == 0 {
				lc.endedAt = ls[i+1].start // it rejoined: the older lifecycle ended
			}
		}
		if t, ok := h.Killed[proc]; ok {
			for _, lc := range ls {
				if lc.endedAt == 0 || lc.endedAt > t {
					lc.endedAt = t
				}
			}
		}
	}
	endedSys := func(sys, proc string) bool {
		if lc := lives[sys]; lc != nil {
			return lc.endedAt != 0
		}
		_, killed := h.Killed[proc]
		return killed
	}
	r.Handled = len(handled)
	for _, ls := range restored {
		sort.Slice(ls, func(i, j int) bool { return ls[i].T < ls[j].T })
	}
	// holder is where the state l left lived last by time t: l's
	// incarnation, or a move's target that restored it later.
	holder := func(l Line, t int64) Line {
		h := l
		for _, x := range restored[l.NH] {
			if x.T > h.T && x.T <= t {
				h = x
			}
		}
		return h
	}

	// Sort every object's records by time: the handler start on one
	// machine's wall clock.
	sort.SliceStable(handled, func(i, j int) bool { return handled[i].T < handled[j].T })
	byObj := map[string][]Line{}
	byOp := map[string][]Line{}
	for _, l := range handled {
		byObj[l.Obj] = append(byObj[l.Obj], l)
		byOp[l.Op] = append(byOp[l.Op], l)
	}

	// Duplicates.
	var dupOps []string
	for op, ls := range byOp {
		if len(ls) > 1 {
			dupOps = append(dupOps, op)
		}
	}
	sort.Strings(dupOps)
	for _, op := range dupOps {
		ls := byOp[op]
		r.Duplicated += len(ls) - 1
		var where []string
		for _, l := range ls {
			where = append(where, fmt.Sprintf("%s %s %s prev=%d at %s", l.Node, l.Proc, l.Inc, l.Prev, clock(l.T)))
		}
		detail("duplicated", "op %s handled %d times: %s", op, len(ls), strings.Join(where, "; "))
	}

	// Two incarnations: once a newer incarnation handled a message, an
	// older one must never handle another.
	objs := make([]string, 0, len(byObj))
	for o := range byObj {
		objs = append(objs, o)
	}
	sort.Strings(objs)
	for _, o := range objs {
		seen := map[string]Line{}
		cur := ""
		var curLine Line
		for _, l := range byObj[o] {
			inc := l.incarnation()
			if inc == cur {
				curLine = l
				continue
			}
			if first, ok := seen[inc]; ok {
				r.Overlaps++
				detail("two incarnations", "%s: %s (%s, first at %s) handled op %s at %s after the newer %s (%s) handled op %s at %s",
					o, l.Inc, l.Node, clock(first.T), l.Op, clock(l.T), curLine.Inc, curLine.Node, curLine.Op, clock(curLine.T))
				continue
			}
			seen[inc] = l
			cur, curLine = inc, l
		}
	}

	// Lineage: the object's final state is the one its last record left;
	// walk back through the records that made it.
	inLineage := map[string]bool{} // op → in its object's final lineage
	children := map[string]map[uint64][]int{}
	for _, o := range objs {
		ls := byObj[o]
		producer := map[uint64]int{} // state hash → index of the record that made it (earliest)
		kids := map[uint64][]int{}
		for i, l := range ls {
			if _, ok := producer[l.NH]; !ok {
				producer[l.NH] = i
			}
			kids[l.PH] = append(kids[l.PH], i)
		}
		children[o] = kids
		h := ls[len(ls)-1].NH
		for steps := 0; h != 0 && steps <= len(ls); steps++ {
			i, ok := producer[h]
			if !ok {
				detail("broken lineage", "%s: no record made state %x", o, h)
				break
			}
			inLineage[ls[i].Op] = true
			h = ls[i].PH
		}
	}
	// leavesEnded reports whether every tip of the branch that grew from
	// record l was handled by a lifecycle that ended abnormally.
	leavesEnded := func(o string, start Line) (bool, Line) {
		ls, kids := byObj[o], children[o]
		stack := []Line{start}
		visited := map[uint64]bool{}
		var live Line
		all := true
		for len(stack) > 0 {
			l := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if visited[l.NH] {
				continue
			}
			visited[l.NH] = true
			next := kids[l.NH]
			if len(next) == 0 {
				if at := holder(l, math.MaxInt64); !endedSys(at.Sys, at.Proc) {
					all, live = false, l
				}
				continue
			}
			for _, i := range next {
				stack = append(stack, ls[i])
			}
		}
		return all, live
	}

	// Ended lifecycles, for sends never handled.
	var endings []int64
	for _, lc := range lives {
		if lc.endedAt != 0 {
			endings = append(endings, lc.endedAt)
		}
	}
	for proc, t := range h.Killed {
		if len(procLives[proc]) == 0 {
			endings = append(endings, t)
		}
	}
	// sendLostWithEnded: a send never handled was lost with an ended node
	// when the object's owner at the time (the lifecycle of its last
	// record before the send) ended abnormally before the send or within
	// the window after it (a send to a dead owner is dropped by the
	// transport, one queued on an owner whose lease ended is failed), or
	// when any lifecycle ended abnormally within the window around it (it
	// may have been held there: the entry node's transport, a move's
	// target's queue).
	sendLostWithEnded := func(op Op) bool {
		ls := byObj[op.Obj]
		i := sort.Search(len(ls), func(i int) bool { return ls[i].T >= op.Start })
		if i > 0 {
			owner := holder(ls[i-1], op.Start)
			if lc := lives[owner.Sys]; lc != nil && lc.endedAt != 0 && lc.endedAt <= op.Start+h.SendLossWindow {
				return true
			}
			if t, ok := h.Killed[owner.Proc]; ok && t <= op.Start+h.SendLossWindow {
				return true
			}
		}
		// Held by the entry node's lifecycle, which ended after the send
		// (queued sends fail when a lifecycle ends: send_lease_ended).
		var entry *lifecycle
		for _, lc := range lives {
			if lc.node == op.Entry && lc.start <= op.Start && (entry == nil || lc.start > entry.start) {
				entry = lc
			}
		}
		if entry != nil && entry.endedAt >= op.Start {
			return true
		}
		// A route to an ended owner may still be cached for a moment after
		// the object was reactivated elsewhere: the last ended owner's
		// incarnation was replaced less than StaleRouteGrace before the send.
	stale:
		for j := i - 1; j >= 0; j-- {
			if !endedSys(ls[j].Sys, ls[j].Proc) {
				continue
			}
			inc := ls[j].incarnation()
			for k := j + 1; k < len(ls); k++ {
				if ls[k].incarnation() != inc {
					if ls[k].T > op.Start-StaleRouteGrace {
						return true
					}
					break stale
				}
			}
			return true
		}
		// Held by a node that ended just after the send (its transport, its
		// mailbox), or sent while the object was out of service after a
		// node ended (a move's crashed target the source still forwards
		// to until it fences the move out).
		served := func() bool { // it went on handling right after the send
			j := sort.Search(len(ls), func(j int) bool { return ls[j].T >= op.Start })
			return j < len(ls) && ls[j].T <= op.Start+outageGap
		}
		for _, e := range endings {
			if e >= op.Start && e <= op.Start+int64(1e9) {
				return true
			}
			if e < op.Start && e >= op.Start-h.SendLossWindow && !served() {
				return true
			}
		}
		return false
	}

	// logged claims the first unclaimed send_* log line on op's object
	// from op.Start on (within the loss window).
	for _, ts := range undelivered {
		sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
	}
	claimed := map[string]int{}
	sort.SliceStable(h.Ops, func(i, j int) bool { return h.Ops[i].Start < h.Ops[j].Start })
	logged := func(op Op) bool {
		ts := undelivered[op.Obj]
		for i := claimed[op.Obj]; i < len(ts); i++ {
			if ts[i] < op.Start {
				claimed[op.Obj] = i + 1
				continue
			}
			if ts[i] <= op.Start+h.SendLossWindow {
				claimed[op.Obj] = i + 1
				return true
			}
			return false
		}
		return false
	}

	for _, op := range h.Ops {
		r.Messages++
		switch {
		case op.OK:
			r.Accepted++
		case op.Class == "untyped":
			r.Untyped++
			detail("untyped error", "op %s via %s: %s", op.ID, op.Entry, op.Err)
		case op.Class != "":
			r.Errors[op.Class]++
		}
		if !op.OK {
			continue
		}
		recs := byOp[op.ID]
		if len(recs) == 0 {
			if op.Send && logged(op) {
				r.LostLogged++
				continue
			}
			if op.Send && sendLostWithEnded(op) {
				r.LostEnded++
				r.LostEndedSends++
				continue
			}
			r.LostAccepted++
			kind := "request answered with success"
			if op.Send {
				kind = "send accepted"
			}
			ctx := ""
			ls := byObj[op.Obj]
			if j := sort.Search(len(ls), func(j int) bool { return ls[j].T >= op.Start }); j > 0 {
				ctx = fmt.Sprintf("; %s was served by %s %s (last run before it at %s)", op.Obj, ls[j-1].Node, ls[j-1].Inc, clock(ls[j-1].T))
			}
			var ended []string
			for _, lc := range lives {
				if lc.endedAt != 0 && lc.endedAt < op.Start && lc.endedAt >= op.Start-h.SendLossWindow {
					ended = append(ended, fmt.Sprintf("%s's lifecycle %s at %s", lc.node, lc.sys, clock(lc.endedAt)))
				}
			}
			if len(ended) > 0 {
				sort.Strings(ended)
				ctx += "; ended shortly before: " + strings.Join(ended, ", ")
			}
			detail("lost accepted", "op %s (%s via %s at %s) was never handled%s", op.ID, kind, op.Entry, clock(op.Start), ctx)
			continue
		}
		if inLineage[op.ID] {
			continue
		}
		if ended, live := leavesEnded(op.Obj, recs[0]); ended {
			r.LostEnded++
			r.LostEndedHandled++
		} else {
			r.LostAccepted++
			detail("lost accepted", "op %s handled by %s %s at %s (count %d) is not in %s's final state; its branch ends at op %s on the live %s %s",
				op.ID, recs[0].Node, recs[0].Inc, clock(recs[0].T), recs[0].N, op.Obj, live.Op, live.Node, live.Inc)
		}
	}

	for _, e := range h.MoveUntyped {
		r.Untyped++
		detail("untyped error", "move: %s", e)
	}

	// Unserved after heal, from the driver's successful requests.
	okAt := map[string][]int64{}
	for _, op := range h.Ops {
		if op.OK && !op.Send {
			okAt[op.Obj] = append(okAt[op.Obj], op.End)
		}
	}
	var all []string
	for _, op := range h.Ops {
		if _, ok := okAt[op.Obj]; !ok {
			okAt[op.Obj] = nil
		}
	}
	for o := range okAt {
		all = append(all, o)
		sort.Slice(okAt[o], func(i, j int) bool { return okAt[o][i] < okAt[o][j] })
	}
	sort.Strings(all)
	for _, heal := range h.Heals {
		for _, o := range all {
			ts := okAt[o]
			i := sort.Search(len(ts), func(i int) bool { return ts[i] >= heal })
			var gap int64
			if i == len(ts) {
				gap = h.End - heal
				r.NeverServed++
				detail("never served after heal", "%s: no successful request from the heal at %s to the end at %s", o, clock(heal), clock(h.End))
			} else {
				gap = ts[i] - heal
			}
			if gap > r.MaxUnserved {
				r.MaxUnserved, r.UnservedObj = gap, o
			}
		}
	}
	for kind, n := range details {
		if n > maxDetails {
			r.Details = append(r.Details, fmt.Sprintf("%s: … %d cases in all", kind, n))
		}
	}
	return r
}

func clock(ns int64) string {
	return fmt.Sprintf("%d.%06d", ns/1e9%100000, ns%1e9/1e3)
}

// ReadLines reads every record file (*.jsonl) in dir. A torn last line (a
// process killed in the middle of a write, which O_APPEND single writes
// make unlikely) is skipped.
func ReadLines(dir string) ([]Line, error) {
	files, err := filepath.Glob(filepath.Join(dir, "records-*.jsonl"))
	if err != nil {
		return nil, err
	}
	var out []Line
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var l Line
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				out = append(out, l)
			}
		}
		fh.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}
