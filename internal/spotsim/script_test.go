package spotsim

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/internal/simkit"
	"github.com/roamactors/roam/internal/simscript"
)

// TestScripts runs every scenario script under testdata (one world per
// file). go test ./internal/spotsim -run TestScripts -rewrite writes the
// actual outputs into the scripts; review the diff.
func TestScripts(t *testing.T) {
	simkit.RunScripts(t, "testdata", func() simkit.Commands { return (&scriptEnv{}).commands() })
}

// scriptEnv is the interaction environment of the Spot lifecycle's
// scenario scripts: its commands build one world (no random faults, no
// random traffic, no probes), schedule its calls, closes and faults, run
// it and print what came of it. The vocabulary is in docs/ARCHITECTURE.md
// ("Writing a scenario script").
type scriptEnv struct {
	w   *World
	log simkit.ScriptLog
	// targets picks the target node of a client's cold activations of a
	// Spot, by client and Spot index.
	targets  map[[2]int]int
	triggers simkit.Triggers[*Runner]
	faults   []*storeFault
}

// storeFault forces the answer of matching store calls.
type storeFault struct {
	*simkit.CallFault
	call      storeCall
	mode      simkit.StoreMode
	node      string // a node (n1) or a lifecycle (n1.1); "" any
	spot      string
	following *storeFault
}

func (e *scriptEnv) commands() simkit.Commands {
	return simkit.Commands{
		"world": e.world, "spot": e.spot, "call": e.call, "calls": e.calls, "close": e.close,
		"crash": e.fault, "lease-cut": e.fault, "cut": e.fault, "store-outage": e.fault, "rejoin": e.fault,
		"fault":      e.storeFault,
		"run":        func(*simscript.Cmd) string { return e.run() },
		"status":     func(*simscript.Cmd) string { return e.status() },
		"violations": func(*simscript.Cmd) string { return simkit.ListViolations(e.w.Violations()) },
		"trace":      e.trace,
	}
}

// ---- argument helpers ----

func (e *scriptEnv) nodeArg(c *simscript.Cmd, name string) *Node {
	for _, n := range e.w.nodes {
		if n.name == name {
			return n
		}
	}
	c.Fatalf("no node %q", name)
	return nil
}

func (e *scriptEnv) clientArg(c *simscript.Cmd, name string) *Client {
	for _, cl := range e.w.clients {
		if fmt.Sprintf("c%d", cl.id+1) == name {
			return cl
		}
	}
	c.Fatalf("no client %q", name)
	return nil
}

func (e *scriptEnv) spotArg(c *simscript.Cmd, id string) *Spot {
	if s := e.w.spotByID(id); s != nil {
		return s
	}
	c.Fatalf("no Spot %q", id)
	return nil
}

// atArg is the time of an action, which must not be in the past: actions
// are scheduled before run.
func atArg(c *simscript.Cmd) time.Duration {
	at := c.Dur("at", -1)
	if at < 0 {
		c.Fatalf("%s wants at=<time>", c.Name)
	}
	return at
}

func (e *scriptEnv) logf(format string, args ...any) { e.log.Logf(e.w.Now(), format, args...) }

// ---- world ----

var sabotages = map[string]Sabotage{
	"none":         SabotageNone,
	"no-fence":     SabotageNoFence,
	"no-id-queue":  SabotageNoIDQueue,
	"revoke-early": SabotageRevokeEarly,
	// The checkpoint and seal rules (doc.go's table).
	"checkpoint-no-judge":            SabotageCheckpointNoJudge,
	"claim-no-fence":                 SabotageClaimNoFence,
	"no-tombstone":                   SabotageNoTombstone,
	"checkpoint-no-lease":            SabotageCheckpointNoLease,
	"claim-older":                    SabotageClaimOlder,
	"reserve-skips-checkpoint-check": SabotageReserveSkipsCheckpointCheck,
	"claim-fail-starts-empty":        SabotageClaimFailStartsEmpty,
	"capture-under-pointer":          SabotageCaptureUnderPointer,
	"close-no-seal":                  SabotageCloseNoSeal,
}

// world [seed=1] [nodes=3] [spots=3] [clients=3] [sabotage=none|<one of sabotages>]
func (e *scriptEnv) world(c *simscript.Cmd) string {
	cfg := DefaultConfig()
	cfg.Nodes, cfg.Spots, cfg.Clients = c.Int("nodes", cfg.Nodes), c.Int("spots", cfg.Spots), c.Int("clients", cfg.Clients)
	cfg.Sabotage = simkit.ChoiceArg(c, "sabotage", "none", sabotages)
	e.w = NewWorld(cfg, uint64(c.Int("seed", 1)), nil)
	e.w.SetTracing(true)
	e.targets = map[[2]int]int{}
	e.w.hooks = Hooks{Effect: e.onEffect, StoreMode: e.onStoreCall, Target: e.onTarget}
	var nodes, spots, clients []string
	for _, n := range e.w.nodes {
		nodes = append(nodes, n.name)
	}
	for _, sp := range e.w.spots {
		spots = append(spots, sp.id+" "+kindString(sp.kind))
	}
	for _, cl := range e.w.clients {
		clients = append(clients, fmt.Sprintf("c%d on %s", cl.id+1, cl.node.name))
	}
	return strings.Join(nodes, " ") + "\n" + strings.Join(spots, ", ") + "\n" + strings.Join(clients, ", ")
}

func kindString(k activation.Kind) string {
	if !k.PreservesState {
		return "stateless"
	}
	s := "preserves state"
	if k.ReactivateEmpty {
		s += ", reactivates empty"
	}
	if k.Checkpointed {
		s += ", checkpointed"
	}
	return s
}

// spot s2 stateless | preserves-state [reactivate-empty] [checkpointed]
//
// sets the Spot's kind (NewWorld makes every other Spot a checkpointed
// PreserveStateWith one).
func (e *scriptEnv) spot(c *simscript.Cmd) string {
	words := c.Words()
	if len(words) < 2 {
		c.Fatalf("spot wants a Spot and its kind")
	}
	s := e.spotArg(c, words[0])
	k := activation.Kind{Registered: true}
	for _, wd := range words[1:] {
		switch wd {
		case "stateless":
		case "preserves-state":
			k.PreservesState = true
		case "reactivate-empty":
			k.ReactivateEmpty = true
		case "checkpointed":
			k.Checkpointed = true
		default:
			c.Fatalf("no kind %q (stateless, preserves-state, reactivate-empty, checkpointed)", wd)
		}
	}
	if (k.ReactivateEmpty || k.Checkpointed) && !k.PreservesState {
		c.Fatalf("reactivate-empty and checkpointed are PreserveStateWith kinds: add preserves-state")
	}
	s.kind = k
	return s.id + " " + kindString(k)
}

// call c1 s1 at=20ms [request] [target=n2]
//
// The client calls the Spot at that time, on its node's current
// lifecycle, whatever else it has in progress (another caller on the same
// node). target= sends this client's cold activations of the Spot to that
// node, as a caller with another view of the live nodes would.
func (e *scriptEnv) call(c *simscript.Cmd) string {
	w := e.w
	words := c.Words()
	request := slices.Contains(words, "request")
	words = slices.DeleteFunc(words, func(s string) bool { return s == "request" })
	if len(words) != 2 {
		c.Fatalf("call wants a client and a Spot")
	}
	cl, s, at := e.clientArg(c, words[0]), e.spotArg(c, words[1]), atArg(c)
	if t := c.Val("target", ""); t != "" {
		e.setTarget(c, cl, s, e.nodeArg(c, t))
	}
	w.at(at, func() {
		l := cl.node.cur
		if l == nil || !l.usable() {
			e.logf("c%d cannot call %s: %s does not serve", cl.id+1, s.id, cl.node.name)
			return
		}
		cl.call(l, s, request, false, nil)
	})
	return ""
}

func (e *scriptEnv) setTarget(c *simscript.Cmd, cl *Client, s *Spot, n *Node) {
	k := [2]int{cl.id, s.idx}
	if old, ok := e.targets[k]; ok && old != n.idx {
		c.Fatalf("c%d's activations of %s already go to %s", cl.id+1, s.id, e.w.nodes[old].name)
	}
	e.targets[k] = n.idx
}

func (e *scriptEnv) onTarget(w *World, c *Client, s *Spot) int {
	if i, ok := e.targets[[2]int{c.id, s.idx}]; ok {
		return i
	}
	return -1
}

// calls c1 at=20ms do=(send s1, request s1) [think=D]
//
// The client's calls one after the other, as an application makes them:
// each once the previous one returned (and think passed).
func (e *scriptEnv) calls(c *simscript.Cmd) string {
	w := e.w
	words := c.Words()
	if len(words) != 1 {
		c.Fatalf("calls wants one client")
	}
	cl, at, think := e.clientArg(c, words[0]), atArg(c), c.Dur("think", 0)
	do, ok := c.Vals("do")
	if !ok || len(do) == 0 {
		c.Fatalf("calls wants do=(send s1, request s1, …)")
	}
	var plan []planned
	for _, d := range do {
		f := strings.Fields(d)
		if len(f) != 2 || (f[0] != "send" && f[0] != "request") {
			c.Fatalf("do=%s: want send <spot> or request <spot>", d)
		}
		plan = append(plan, planned{spot: e.spotArg(c, f[1]), request: f[0] == "request", think: think})
	}
	// The plan is the client's only at its time: a client with planned
	// calls starts them as soon as its node serves.
	w.at(at, func() {
		cl.plan = append(cl.plan, plan...)
		cl.issue()
	})
	return ""
}

// close s1 at=T: the Spot's serving incarnation closes itself
// (CloseSelf).
func (e *scriptEnv) close(c *simscript.Cmd) string {
	w := e.w
	words := c.Words()
	if len(words) != 1 {
		c.Fatalf("close wants one Spot")
	}
	s, at := e.spotArg(c, words[0]), atArg(c)
	w.at(at, func() {
		for _, l := range w.lives {
			if inc := l.objects[s.idx]; inc != nil && inc.mode == mOpen && !l.gone {
				e.logf("%s closes itself", inc)
				l.closeInstance(inc)
				return
			}
		}
		e.logf("close %s: no incarnation serves", s.id)
	})
	return ""
}

// crash n1 (at=T | on=<effect> …)
// lease-cut n1 for=D (at=T | on=…)     the node cannot reach the store
// cut n1 n2 for=D [oneway] (at=T | on=…)
// store-outage for=D (at=T | on=…)
// rejoin n1 (at=T | on=…)               its lifecycle ends; a new one starts
//
// on=<effect> [machine=act|rec|clear|release|closing] [spot=s1] fires the
// first time such a machine is about to run the effect (its type in kebab
// case: compare-and-set, reserve, open, …); crash, lease-cut and rejoin
// without a node act on the machine's node.
func (e *scriptEnv) fault(c *simscript.Cmd) string {
	w := e.w
	words := c.Words()
	var nodes []*Node
	for _, wd := range words {
		if wd != "oneway" {
			nodes = append(nodes, e.nodeArg(c, wd))
		}
	}
	on := simkit.EffectArg(c, effectNames)
	want := map[string]int{"crash": 1, "lease-cut": 1, "rejoin": 1, "cut": 2, "store-outage": 0}[c.Name]
	if len(nodes) != want && !(on != "" && want == 1 && len(nodes) == 0) {
		c.Fatalf("%s wants %d node(s)", c.Name, want)
	}
	d := c.Dur("for", 0)
	if (c.Name == "lease-cut" || c.Name == "cut" || c.Name == "store-outage") && d <= 0 {
		c.Fatalf("%s wants for=<duration>", c.Name)
	}
	both := !c.Has("oneway")
	// node is the node acted on: the named one, else the machine's.
	node := func(r *Runner) *Node {
		if len(nodes) > 0 {
			return nodes[0]
		}
		return r.life.node
	}
	var action func(r *Runner) string
	switch c.Name {
	case "crash":
		action = func(r *Runner) string {
			n := node(r)
			if n.cur == nil || n.cur.gone {
				return "crash " + n.name + ": already down"
			}
			w.tracef("%s CRASHES (script)", n.name)
			n.crash()
			return "crash " + n.name
		}
	case "lease-cut":
		action = func(r *Runner) string {
			n := node(r)
			w.storeCutFor(n, d)
			return fmt.Sprintf("%s cut from the store for %s", n.name, d)
		}
	case "cut":
		action = func(*Runner) string {
			w.net.cut(nodes[0].idx, nodes[1].idx, both, d)
			if both {
				return fmt.Sprintf("cut %s⇄%s for %s", nodes[0].name, nodes[1].name, d)
			}
			return fmt.Sprintf("cut %s→%s for %s", nodes[0].name, nodes[1].name, d)
		}
	case "store-outage":
		action = func(*Runner) string {
			w.stats.StoreOutages++
			w.store.down = true
			w.tracef("store DOWN for %s (script)", ms(d))
			w.after(d, func() { w.store.down = false; w.tracef("store up") })
			return fmt.Sprintf("store down for %s", d)
		}
	case "rejoin":
		action = func(r *Runner) string {
			n := node(r)
			l := n.cur
			if l == nil || !l.usable() {
				return "rejoin " + n.name + ": no lifecycle serves"
			}
			l.endLifecycle("the script made it rejoin")
			return "rejoin " + n.name + ": " + l.rid + " ended"
		}
	}
	if on != "" {
		// The machine's label (act, rec, clear, release, closing), Spot
		// and node, where given, pick the machines it fires at.
		machine, spot := c.Val("machine", ""), c.Val("spot", "")
		var node *Node
		if len(nodes) > 0 && c.Name != "cut" {
			node = nodes[0]
		}
		if spot != "" {
			e.spotArg(c, spot)
		}
		e.triggers = append(e.triggers, &simkit.Trigger[*Runner]{Desc: c.Line, Effect: on,
			Match: func(r *Runner) bool {
				return (machine == "" || machine == r.label) && (spot == "" || spot == r.spot.id) && (node == nil || node == r.life.node)
			},
			Fire: func(r *Runner) { e.logf("%s (on %s of %s)", action(r), on, r) }})
		return ""
	}
	if len(nodes) == 0 && want == 1 {
		c.Fatalf("%s at a time wants a node", c.Name)
	}
	at := atArg(c)
	w.at(at, func() { e.logf("%s", action(nil)) })
	return ""
}

// effectNames are the activation effects a fault can be set off at: each
// effect's type name in kebab case.
var effectNames = simkit.KebabNames([]activation.Effect{
	activation.ReadAuthority{}, activation.Watch{}, activation.PutRoot{}, activation.GetRoot{}, activation.Reserve{},
	activation.CompareAndSet{}, activation.ReadRecord{}, activation.AbortReservation{}, activation.Delete{},
	activation.DeleteRoot{}, activation.ReadOwner{}, activation.LockKey{}, activation.UnlockKey{}, activation.AdmitCapacity{},
	activation.ReleaseCapacity{}, activation.Stage{}, activation.DiscardStaged{}, activation.Open{}, activation.Forward{},
	activation.PassOn{}, activation.RespondFailure{}, activation.CloseLocal{}, activation.DropRoute{}, activation.Log{},
	activation.Finish{}, activation.ClaimCheckpoint{},
})

func (e *scriptEnv) onEffect(_ *World, r *Runner, eff activation.Effect) { e.triggers.Effect(eff, r) }

// storeCall names a kind of store call a fault can answer.
type storeCall struct {
	name  string
	kind  opKind
	match func(why string) bool // nil: every call of the kind
}

func prefix(p string) func(string) bool {
	return func(why string) bool { return strings.HasPrefix(why, p) }
}

var storeCalls = []storeCall{
	{"reserve", opApply, prefix("reserve ")},
	{"commit", opApply, prefix("cas Ready ")},
	{"clear", opApply, prefix("cas Ready(no pointer) ")},
	{"closing", opApply, prefix("cas Closing ")},
	{"abort", opApply, prefix("abort ")},
	{"authority", opRead, func(why string) bool {
		return strings.HasPrefix(why, "authority ") && !strings.HasPrefix(why, "authority (user) ")
	}},
	{"record", opRead, prefix("record ")},
	{"read", opRead, nil},
	{"apply", opApply, nil},
	{"read-node", opReadNode, nil},
	{"list-nodes", opListNodes, nil},
	{"list", opList, nil},
	{"watch", opWatch, nil},
	{"renew", opRenew, nil},
	{"put-root", opPutRoot, nil},
	{"get-root", opGetRoot, nil},
	{"delete-root", opDeleteRoot, nil},
	{"revoke", opRevoke, nil},
	{"capture", opCapture, nil},
	{"checkpoint", opCheckpoint, nil},
	{"checkpoint-claim", opCheckpointClaim, nil},
}

// fault <call> <answer> [node=n1|n1.1] [spot=s1] [skip=N] [count=1|all] [until=T] [latency=D] [following=<call>]
//
// The first count calls of that kind (after skipping skip of them), by
// that node or lifecycle, for that Spot, before until, and once the fault
// on the following call answered, are answered so; latency is how late
// the call reaches the store (and applies). The authority call is the
// Instance key's read of a resolve (not the User key's). The checkpoint
// calls (checkpoint.go) take latency (capture: in the node's writer,
// before its lease check; checkpoint: on the write's way to the store)
// or unavailable (checkpoint: the write is lost; checkpoint-claim: the
// claim fails).
func (e *scriptEnv) storeFault(c *simscript.Cmd) string {
	cf, call, mode := simkit.ParseCallFault(c, callNames(), simkit.StoreModeNames(simkit.ModeSlow))
	f := &storeFault{CallFault: cf, call: storeCalls[call], mode: simkit.StoreMode(mode), node: c.Val("node", ""), spot: c.Val("spot", "")}
	if f.node != "" {
		e.nodeArg(c, strings.Split(f.node, ".")[0])
	}
	if f.spot != "" {
		e.spotArg(c, f.spot)
	}
	if fl := c.Val("following", ""); fl != "" {
		for _, g := range e.faults {
			if g.call.name == fl {
				f.following = g
				break
			}
		}
		if f.following == nil {
			c.Fatalf("following=%s: no earlier fault on that call", fl)
		}
	}
	e.faults = append(e.faults, f)
	return ""
}

func callNames() []string {
	var out []string
	for _, sc := range storeCalls {
		out = append(out, sc.name)
	}
	return out
}

// onStoreCall decides a call only when a fault matches it: an undecided
// call draws its answer from the world's random source as before, so a
// script's faults change no other draw.
func (e *scriptEnv) onStoreCall(w *World, l *Life, op *storeOp) (simkit.StoreMode, time.Duration, bool) {
	for _, f := range e.faults {
		if !f.Open(w.Now()) || op.kind != f.call.kind || (f.call.match != nil && !f.call.match(op.why)) ||
			(f.node != "" && f.node != l.node.name && f.node != l.rid) || (f.spot != "" && !simscript.HasTokens(op.why, []string{f.spot})) ||
			(f.following != nil && f.following.Answered() == 0) {
			continue
		}
		answer := f.mode.String()
		if f.Latency > 0 {
			answer += fmt.Sprintf(" %s late", f.Latency)
		}
		if f.Take(&e.log, w.Now(), "%s %s (%s) answered %s", l, f.call.name, op.why, answer) {
			return f.mode, f.Latency, true
		}
	}
	return simkit.ModeOK, 0, false
}

// ---- running and reporting ----

// run runs the world to its end and prints what the script's own actions
// did, and any that never happened.
func (e *scriptEnv) run() string {
	e.w.Run()
	return e.log.Report(append(e.triggers.Never(), simkit.Unreached(e.faults)...))
}

// status prints the nodes' lifecycles; per Spot its store record and
// every incarnation it had (its state, what it opened with and what it
// handled); per message how its call went, where it was handled, failed
// or lost; and the tallies.
func (e *scriptEnv) status() string {
	w := e.w
	var out []string
	for _, n := range w.nodes {
		var lives []string
		for _, l := range n.lives {
			lives = append(lives, l.rid+" "+lifeState(l))
		}
		out = append(out, n.name+": "+strings.Join(lives, ", "))
	}
	for _, s := range w.spots {
		out = append(out, fmt.Sprintf("%s %s: store %s", s.id, kindString(s.kind), recString(w.store.Read(s.key()))))
		for _, l := range w.lives {
			for _, inc := range l.incs {
				if inc.spot == s {
					out = append(out, "  "+incState(inc))
				}
			}
		}
	}
	var handled, again, failed, lost, unaccepted, open int
	for _, m := range w.msgs {
		out = append(out, msgState(m))
		switch {
		case len(m.handled) > 1:
			again++
		case len(m.handled) == 1:
			handled++
		case len(m.failures) > 0:
			failed++
		case !m.accepted:
			unaccepted++
		case m.loss != lossNone:
			lost++
		default:
			open++
		}
	}
	st := w.stats
	out = append(out, fmt.Sprintf("command 39s %d: activated %d, forwarded %d, passed on %d, resumed %d, failed %d; reactivations refused %d",
		st.Activations, st.Activated, st.Forwarded, st.PassedOn, st.Resumed, st.ActivationFailed, st.RefusedPreserved))
	out = append(out, fmt.Sprintf("messages %d: handled once %d, more than once %d, failed loudly %d, lost %d, not accepted %d, neither %d",
		len(w.msgs), handled, again, failed, lost, unaccepted, open))
	return strings.Join(out, "\n")
}

func lifeState(l *Life) string {
	switch {
	case l.gone && l.ended:
		return "ended, gone"
	case l.gone:
		return "gone"
	case l.ended:
		return "ended"
	case !l.claimed:
		return "claiming"
	case l.fenced():
		return "fenced"
	}
	return "serves"
}

func incState(inc *Inc) string {
	s := inc.String() + " " + incModeNames[inc.mode]
	if inc.mode == mOpen && inc.life.valid() {
		s += ", serving"
	}
	if inc.openedAt > 0 {
		s += fmt.Sprintf("; opened at %s with %s first", ms(inc.openedAt), msgList(inc.firsts))
		if inc.resumedFrom != "" {
			s += " (resumed from " + inc.resumedFrom + ")"
		}
		if inc.restored != nil {
			s += "; restored " + msgList(inc.restored)
		}
	} else {
		s += "; never opened"
	}
	return s + "; handled " + msgList(inc.handled)
}

func msgState(m *Msg) string {
	kind := "send"
	if m.request {
		kind = "request"
	}
	s := fmt.Sprintf("m%d c%d %s %s seq %d", m.id, m.client.id+1, kind, m.spot.id, m.seq)
	switch {
	case m.target == nil:
		s += " (not sent)"
	case m.viaCmd39:
		s += " (command 39 to " + m.target.rid + ")"
	default:
		s += " (direct to " + m.target.rid + ")"
	}
	var parts []string
	if len(m.handled) > 0 {
		var hs []string
		for i, inc := range m.handled {
			hs = append(hs, inc.String()+" at "+ms(m.handledAt[i]))
		}
		parts = append(parts, "handled by "+strings.Join(hs, ", "))
	}
	for _, f := range m.failures {
		parts = append(parts, fmt.Sprintf("failed loudly %s (definite=%v): %s", f.code, f.definite, f.why))
	}
	if len(m.handled) == 0 && len(m.failures) == 0 {
		switch {
		case !m.accepted:
			parts = append(parts, "not accepted")
		case m.loss != lossNone:
			parts = append(parts, "lost ("+lossNames[m.loss]+"): "+m.lossWhy)
		}
	}
	if c := m.call; c != nil {
		if c.ended {
			parts = append(parts, "call: "+c.outcome)
		} else {
			parts = append(parts, "call: not returned")
		}
	}
	return s + ": " + strings.Join(parts, "; ")
}

// trace [raw] [word …]
//
// Without raw, the protocol steps: calls and where they went, the steps
// of the machines (without their timers), store writes, incarnations
// opening, handling and closing, failures and losses, faults, lifecycles
// ending and starting again, violations. With raw, every line of the
// world's trace. Words keep only the lines that contain each of them as a
// whole token (m1 does not match m17).
func (e *scriptEnv) trace(c *simscript.Cmd) string {
	return simkit.ScriptTrace(c, e.w.Trace(), protocolStep)
}

// stepMarkers are the trace lines, besides the machines' steps, that are
// protocol steps or faults. The store's answers are left out: the step
// of the machine or call that got one says what it was.
var stepMarkers = []string{
	// calls
	" send m", " request m", " → command 39 ", " (route from ", " returns: ", " ← command 39 ",
	// the store's writes and leases, and forced answers
	"  store: ", " sent (mode ",
	// incarnations and messages
	" OPENS ", " HANDLES ", " discarded (", " closed", " recovery pointer settled", " asks to close itself",
	"instance_close_failed", "spot_close_unsettled", " answered DeadlineExceeded", " failed loudly", " copy lost ",
	" dead letter", " redelivers ",
	// faults and lifecycles
	" CRASHES", " DOWN: ", " lifecycle ended", " unfenced", "net: cut", " lost in the cut", " dropped (link down)",
	"store DOWN", "store up", " cut from the store", "horizon: ", "spot_recovery_failed", "VIOLATION",
}

// protocolStep keeps a trace line that is a protocol step, with a
// machine's timers left out of its effects; a machine step left with no
// effect is dropped, as is the first lifecycle of each node starting.
func protocolStep(l string) (string, bool) {
	if i := strings.Index(l, " starts (lifecycle "); i >= 0 {
		return l, !strings.HasPrefix(l[i:], " starts (lifecycle 1 ")
	}
	if isMachineLine(l) {
		open := strings.LastIndex(l, "[")
		if open < 0 || !strings.HasSuffix(l, "]") {
			return l, true // ends, log, forwards
		}
		effects := simkit.WithoutTimers(l[open+1 : len(l)-1])
		if len(effects) == 0 && !strings.Contains(l, " starts [") {
			return "", false
		}
		return l[:open] + "[" + strings.Join(effects, " ") + "]", true
	}
	for _, m := range stepMarkers {
		if strings.Contains(l, m) {
			return l, true
		}
	}
	return "", false
}

// isMachineLine: the line is a runner's (rid:label:spot…).
func isMachineLine(l string) bool {
	f := strings.Fields(l)
	if len(f) < 2 {
		return false
	}
	parts := strings.Split(f[1], ":")
	return len(parts) >= 3 && slices.Contains([]string{"act", "rec", "clear", "release", "closing"}, parts[1])
}
