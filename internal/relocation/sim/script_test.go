package sim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/simkit"
	"github.com/roamactors/roam/internal/simscript"
)

// TestScripts runs every scenario script under testdata (one world per
// file). go test ./internal/relocation/sim -run TestScripts -rewrite
// writes the actual outputs into the scripts; review the diff.
func TestScripts(t *testing.T) {
	simkit.RunScripts(t, "testdata", func() simkit.Commands { return (&scriptEnv{}).commands() })
}

// scriptEnv is the interaction environment of the scenario scripts: its
// commands build one world, schedule its traffic, moves and faults, run it
// and print what came of it. The vocabulary is in docs/ARCHITECTURE.md
// ("Writing a scenario script").
type scriptEnv struct {
	w        *World
	log      simkit.ScriptLog
	triggers simkit.Triggers[*Move]
	drops    []*drop
	faults   []*storeFault
}

// drop loses (or duplicates) packets of a kind.
type drop struct {
	desc      string
	kind      pktKind
	from, to  int // -1: any
	left      int // -1: every one
	duplicate bool
	after     time.Duration
	seen      int
}

// storeFault forces the answer of matching store calls.
type storeFault struct {
	*simkit.CallFault
	call storeCall
	mode simkit.StoreMode
	node string
}

func (e *scriptEnv) commands() simkit.Commands {
	return simkit.Commands{
		"world": e.world, "sends": e.sends, "move": e.move, "join": e.join,
		"cut": e.fault, "store-outage": e.fault, "crash": e.fault, "stop": e.fault,
		"drop": e.drop, "duplicate": e.drop, "fault": e.storeFault,
		"run":        func(*simscript.Cmd) string { return e.run() },
		"status":     func(*simscript.Cmd) string { return e.status() },
		"violations": func(*simscript.Cmd) string { return simkit.ListViolations(e.w.Violations()) },
		"trace":      e.trace,
	}
}

// ---- argument helpers ----

func boolArg(c *simscript.Cmd, key string, def bool) bool {
	v := c.Val(key, "")
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		c.Fatalf("%s=%s: %v", key, v, err)
	}
	return b
}

func (e *scriptEnv) nodeArg(c *simscript.Cmd, name string) *Node {
	n := e.w.node(name)
	if n == nil {
		c.Fatalf("no node %q", name)
	}
	return n
}

func (e *scriptEnv) logf(format string, args ...any) { e.log.Logf(e.w.Now(), format, args...) }

// ---- world ----

var sabotages = map[string]Sabotage{
	"none":                       SabotageNone,
	"skip-fence-out":             SabotageSkipFenceOut,
	"open-without-commit":        SabotageOpenWithoutCommit,
	"skip-session-seal":          SabotageSkipSessionSeal,
	"handle-after-seal":          SabotageHandleAfterSeal,
	"split-unit":                 SabotageSplitUnit,
	"cutover-before-relay-ready": SabotageCutoverBeforeRelayReady,
}

// world nodes=3 objects=1 clients=2 seed=1 sessions=false sabotage=none members=(k0,k1,...) budget=(peer,node,window) source-check=true
//
// source-check=false: the nodes do not check a move's source before its
// seal (Config.NoSourceCheck), as an older version's.
// members=(k0,...): object i is a SpotWide User Spot with ki members
// (Config.Members), numbered after the objects. budget=(...): every
// node's in-flight payload budget in bytes (Config.Budget; 0: none).
func (e *scriptEnv) world(c *simscript.Cmd) string {
	cfg := DefaultConfig()
	if boolArg(c, "sessions", false) {
		cfg = SessionsConfig()
	}
	cfg.Nodes, cfg.Objects, cfg.Clients = c.Int("nodes", 3), c.Int("objects", 1), c.Int("clients", 2)
	cfg.Sabotage = simkit.ChoiceArg(c, "sabotage", "none", sabotages)
	cfg.NoSourceCheck = !boolArg(c, "source-check", true)
	if ks, ok := c.Vals("members"); ok {
		for _, k := range ks {
			n, err := strconv.Atoi(k)
			if err != nil {
				c.Fatalf("members=%s: %v", k, err)
			}
			cfg.Members = append(cfg.Members, n)
		}
	}
	if bs, ok := c.Vals("budget"); ok {
		var v [3]int64
		for i := range min(len(bs), 3) {
			n, err := strconv.ParseInt(bs[i], 10, 64)
			if err != nil {
				c.Fatalf("budget=%s: %v", bs[i], err)
			}
			v[i] = n
		}
		cfg.Budget = PayloadBudget{PerPeer: v[0], PerNode: v[1], Window: v[2]}
	}
	e.w = NewWorld(cfg, uint64(c.Int("seed", 1)), nil)
	e.w.SetTracing(true)
	e.w.hooks = Hooks{SourceEffect: e.onSourceEffect, TargetEffect: e.onTargetEffect, Packet: e.onPacket, StoreMode: e.onStoreCall}
	var objs []string
	for _, o := range e.w.objs {
		objs = append(objs, fmt.Sprintf("o%d on %s", o.id, e.w.store.recs[o.id].OwnerNode))
	}
	var names []string
	for _, n := range e.w.nodes {
		names = append(names, n.name)
	}
	out := strings.Join(names, " ") + "; " + strings.Join(objs, ", ")
	for _, o := range e.w.objs {
		if len(o.members) > 0 {
			var ms []string
			for _, m := range o.members {
				ms = append(ms, fmt.Sprintf("o%d", m))
			}
			out += fmt.Sprintf("\no%d is a SpotWide User Spot; its members %s", o.id, strings.Join(ms, ", "))
		}
	}
	if cfg.Sessions {
		var bound []string
		for _, o := range e.w.objs {
			cl := e.w.clients[e.w.boundTo(o.id)]
			bound = append(bound, fmt.Sprintf("o%d bound to %s of c%d", o.id, cl.gw.sid, cl.id+1))
		}
		out += "\n" + strings.Join(bound, ", ")
	}
	return out
}

// sends clients=(1,2) obj=0 from=10ms every=20ms count=120 requests=every3
//
// Message i goes from clients[i mod len(clients)] at from+i*every; it is a
// request when i is a multiple of N (requests=everyN), always
// (requests=all) or never (requests=none).
func (e *scriptEnv) sends(c *simscript.Cmd) string {
	w := e.w
	var clients []*Client
	names, ok := c.Vals("clients")
	if !ok {
		names = []string{c.Val("client", "1")}
	}
	for _, s := range names {
		k, err := strconv.Atoi(s)
		if err != nil || k < 1 || k > len(w.clients) {
			c.Fatalf("no client %q (clients are 1..%d)", s, len(w.clients))
		}
		clients = append(clients, w.clients[k-1])
	}
	o := c.Int("obj", 0)
	if o < 0 || o >= len(w.objs) {
		c.Fatalf("no object %d", o)
	}
	from, every, count := c.Dur("from", 10*time.Millisecond), c.Dur("every", 20*time.Millisecond), c.Int("count", 1)
	isRequest := func(int) bool { return false }
	switch r := c.Val("requests", "none"); {
	case r == "none":
	case r == "all":
		isRequest = func(int) bool { return true }
	case strings.HasPrefix(r, "every"):
		k, err := strconv.Atoi(strings.TrimPrefix(r, "every"))
		if err != nil || k < 1 {
			c.Fatalf("requests=%s: want none, all or everyN", r)
		}
		isRequest = func(i int) bool { return i%k == 0 }
	default:
		c.Fatalf("requests=%s: want none, all or everyN", r)
	}
	requests := 0
	for i := 0; i < count; i++ {
		req := isRequest(i)
		if req {
			requests++
		}
		w.scheduleSend(from+time.Duration(i)*every, clients[i%len(clients)], ObjID(o), req, false)
	}
	var cs []string
	for _, cl := range clients {
		cs = append(cs, fmt.Sprintf("c%d", cl.id+1))
	}
	return fmt.Sprintf("%d messages (%d requests) from %s to o%d, %s to %s", count, requests, strings.Join(cs, ","), o, from, from+time.Duration(count-1)*every)
}

// move obj=0 to=n2 at=50ms
func (e *scriptEnv) move(c *simscript.Cmd) string {
	w := e.w
	o, dst, at := ObjID(c.Int("obj", 0)), e.nodeArg(c, c.Val("to", "")), c.Dur("at", 0)
	w.at(at, "move", func() {
		if !w.StartMove(o, dst) {
			e.logf("move of o%d to %s refused", o, dst.name)
			return
		}
		e.logf("%s started", w.moves[len(w.moves)-1])
	})
	return ""
}

// join obj=1 spot=0 at=30ms: a JoinSpot of Actor obj into SpotWide
// Spot spot, on another node (World.StartJoin).
func (e *scriptEnv) join(c *simscript.Cmd) string {
	w := e.w
	o, spot, at := ObjID(c.Int("obj", 0)), ObjID(c.Int("spot", 0)), c.Dur("at", 0)
	w.at(at, "join", func() {
		if !w.StartJoin(o, spot) {
			e.logf("join of o%d into o%d refused", o, spot)
			return
		}
		e.logf("%s started, with a Join into o%d", w.moves[len(w.moves)-1], spot)
	})
	return ""
}

// cut n1 n2 for=20ms [oneway] (at=T | on=<effect> [move=N] [after=D])
// store-outage [node=n1] for=D (at=T | on=...)
// crash n2 (at=T | on=...)
// stop n2 (at=T | on=...)
func (e *scriptEnv) fault(c *simscript.Cmd) string {
	w := e.w
	var desc string
	var action func()
	words := c.Words()
	switch c.Name {
	case "cut":
		if len(words) != 2 {
			c.Fatalf("cut wants two nodes")
		}
		a, b, d := e.nodeArg(c, words[0]), e.nodeArg(c, words[1]), c.Dur("for", 0)
		both := !c.Has("oneway")
		desc = fmt.Sprintf("cut %s→%s for %s", a.name, b.name, d)
		if both {
			desc = fmt.Sprintf("cut %s⇄%s for %s", a.name, b.name, d)
		}
		action = func() { w.net.cut(a.idx, b.idx, both, d) }
	case "store-outage":
		d := c.Dur("for", 0)
		if name := c.Val("node", ""); name != "" {
			n := e.nodeArg(c, name)
			desc = fmt.Sprintf("%s cut from the store for %s", n.name, d)
			action = func() { w.storeCutFor(n, d) }
			break
		}
		desc = fmt.Sprintf("store down for %s", d)
		action = func() {
			w.stats.StoreOutages++
			w.store.down = true
			w.tracef("store DOWN for %s (script)", d)
			w.after(d, "store-up", func() { w.store.down = false; w.tracef("store up") })
		}
	case "crash", "stop":
		if len(words) != 1 {
			c.Fatalf("%s wants one node", c.Name)
		}
		n := e.nodeArg(c, words[0])
		desc = c.Name + " " + n.name
		action = n.crash
		if c.Name == "stop" {
			action = n.stop
		}
	}
	if on := simkit.EffectArg(c, effectNames); on != "" {
		move, after := uint64(c.Int("move", 0)), c.Dur("after", 0)
		t := &simkit.Trigger[*Move]{Desc: fmt.Sprintf("%s (on %s)", desc, on), Effect: on,
			Match: func(mv *Move) bool { return move == 0 || move == mv.id }}
		fire := func() { e.logf("%s", t.Desc); action() }
		t.Fire = func(*Move) {
			if after == 0 {
				fire()
				return
			}
			w.after(after, "script", fire)
		}
		e.triggers = append(e.triggers, t)
		return ""
	}
	at := c.Dur("at", -1)
	if at < 0 {
		c.Fatalf("%s wants at=<time> or on=<effect>", c.Name)
	}
	w.at(at, c.Name, func() { e.logf("%s", desc); action() })
	return ""
}

// effectNames are the protocol effects a fault can be set off at: each
// handoff effect's type name in kebab case.
var effectNames = simkit.KebabNames([]handoff.Effect{
	handoff.QueryCapability{}, handoff.AwaitAdmission{}, handoff.CheckSource{}, handoff.Seal{}, handoff.SealSessions{}, handoff.AbortSessions{},
	handoff.UpdateSessionRoutes{}, handoff.SendPrepare{}, handoff.SendChunks{}, handoff.Unseal{}, handoff.SendAbort{},
	handoff.RelayThenCutover{}, handoff.ResendBoundary{}, handoff.ReleasePayload{}, handoff.ReturnBudget{}, handoff.StartFollow{},
	handoff.ReleaseBoundary{}, handoff.AckBoundary{}, handoff.EndFollow{}, handoff.Reconcile{}, handoff.AdoptTargetRoute{},
	handoff.FailHeld{}, handoff.ConfirmCommit{}, handoff.FenceOut{}, handoff.CloseOut{}, handoff.Reinstate{},
	handoff.InstallStaging{}, handoff.VerifySource{}, handoff.SendCredit{}, handoff.RestorePayload{}, handoff.SendFailed{},
	handoff.SendRelayReady{}, handoff.CommitOwner{}, handoff.OpenDispatch{}, handoff.DeliverLate{}, handoff.RemoveTarget{},
})

func (e *scriptEnv) onSourceEffect(_ *World, r *SourceRun, eff handoff.Effect) {
	e.triggers.Effect(eff, r.mv)
}

func (e *scriptEnv) onTargetEffect(_ *World, t *TargetRun, eff handoff.Effect) {
	e.triggers.Effect(eff, t.mv)
}

// drop relay-ready [from=n2] [to=n1] [count=1|all]
// duplicate cutover [from=n1] [to=n2] [count=1|all] [after=D]
func (e *scriptEnv) drop(c *simscript.Cmd) string {
	words := c.Words()
	if len(words) != 1 {
		c.Fatalf("%s wants one packet kind", c.Name)
	}
	k := slices.Index(pktNames[:], words[0])
	if k < 0 {
		c.Fatalf("no packet kind %q (one of %s)", words[0], strings.Join(pktNames[:], ", "))
	}
	d := &drop{desc: c.Line, kind: pktKind(k), from: -1, to: -1, left: c.Count(1), duplicate: c.Name == "duplicate",
		after: c.Dur("after", time.Millisecond)}
	if n := c.Val("from", ""); n != "" {
		d.from = e.nodeArg(c, n).idx
	}
	if n := c.Val("to", ""); n != "" {
		d.to = e.nodeArg(c, n).idx
	}
	e.drops = append(e.drops, d)
	return ""
}

func (e *scriptEnv) onPacket(w *World, p *packet) bool {
	for _, d := range e.drops {
		if d.left == 0 || p.kind != d.kind || (d.from >= 0 && p.from != d.from) || (d.to >= 0 && p.to != d.to) {
			continue
		}
		if d.left > 0 {
			d.left--
		}
		d.seen++
		if !d.duplicate {
			e.logf("dropped %s %s→%s %s", p.kind, w.endpointName(p.from), w.endpointName(p.to), idString(p.id))
			return true
		}
		e.logf("duplicated %s %s→%s %s (the copy %s later)", p.kind, w.endpointName(p.from), w.endpointName(p.to), idString(p.id), d.after)
		cp := *p
		w.after(d.after, "duplicate", func() {
			if w.nodes[cp.from].alive {
				w.net.send(&cp)
			}
		})
		return false
	}
	return false
}

// storeCall names the store calls of the hand-off a fault can answer.
type storeCall struct {
	name string
	kind opKind
	why  string // the prefix of storeOp.why; empty: any
}

var storeCalls = []storeCall{
	{"commit-read", opRead, "commit #"},
	{"commit-cas", opCAS, "commit #"},
	{"commit-apply", opApply, "commit #"},
	{"settle-cas", opCAS, "settle fence-out #"},
	{"verify-read", opRead, "verify source #"},
	{"reconcile-read", opRead, "reconcile #"},
	{"confirm-watch", opWatch, "confirm #"},
	{"fence-out-cas", opCAS, "fence-out #"},
	{"renew", opRenew, ""},
	{"read", opRead, ""},
	{"cas", opCAS, ""},
}

// fault <store-call> <answer> [node=n2] [skip=N] [count=1|all] [until=T] [latency=D]
//
// The first count calls of that kind (after skipping skip of them), by
// node if given, before until if given, are answered so; latency is the
// delay of a late write.
func (e *scriptEnv) storeFault(c *simscript.Cmd) string {
	var names []string
	for _, sc := range storeCalls {
		names = append(names, sc.name)
	}
	cf, call, mode := simkit.ParseCallFault(c, names, simkit.StoreModeNames(simkit.ModeLate))
	f := &storeFault{CallFault: cf, call: storeCalls[call], mode: simkit.StoreMode(mode), node: c.Val("node", "")}
	if f.mode == simkit.ModeLate && f.Latency <= 0 {
		c.Fatalf("a late answer wants latency=<duration>")
	}
	if f.node != "" {
		e.nodeArg(c, f.node)
	}
	e.faults = append(e.faults, f)
	return ""
}

func (e *scriptEnv) onStoreCall(w *World, n *Node, op *storeOp) (simkit.StoreMode, time.Duration, bool) {
	for _, f := range e.faults {
		if !f.Open(w.Now()) || op.kind != f.call.kind || !strings.HasPrefix(op.why, f.call.why) ||
			(f.node != "" && n.name != f.node) {
			continue
		}
		if f.Take(&e.log, w.Now(), "%s %s (%s) answered %s", n.name, f.call.name, op.why, f.mode) {
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
	never := e.triggers.Never()
	for _, d := range e.drops {
		if d.seen == 0 {
			never = append(never, d.desc)
		}
	}
	return e.log.Report(append(never, simkit.Unreached(e.faults)...))
}

// status prints each object's store record and serving incarnation, each
// move's outcome on both sides, and what became of the messages.
func (e *scriptEnv) status() string {
	w := e.w
	var out []string
	for _, o := range w.objs {
		rec := w.store.recs[o.id]
		var serving []string
		for _, inc := range w.serving(o.id) {
			serving = append(serving, fmt.Sprintf("%s (version %d)", inc, inc.version))
		}
		if len(serving) == 0 {
			serving = []string{"none"}
		}
		out = append(out, fmt.Sprintf("o%d: store %s; serving %s; history %d", o.id, rec, strings.Join(serving, ", "), o.head))
		if w.cfg.Sessions && w.boundTo(o.id) >= 0 {
			cl := w.clients[w.boundTo(o.id)]
			if route, sealed, ok := cl.gw.run.Owner().BindingOf(cl.gw.sid, actorName(o.id)); ok {
				s := ""
				if sealed {
					s = ", sealed"
				}
				out = append(out, fmt.Sprintf("  %s routes o%d to %s%s", cl.gw.sid, o.id, route, s))
			} else {
				out = append(out, fmt.Sprintf("  %s closed", cl.gw.sid))
			}
		}
	}
	for _, mv := range w.moves {
		out = append(out, mv.String())
		r := mv.src
		out = append(out, "  source "+mv.from.name+": "+runState(r.m.Phase(), r.m.Finished(), r.dead, map[string]bool{
			"cutover sent": mv.cutoverSent, "fenced out": mv.fencedOut, "serves again": mv.reinstated,
		}))
		if t := mv.tgt; t != nil {
			out = append(out, "  target "+mv.to.name+": "+runState(t.m.Phase(), t.m.Finished(), t.dead, map[string]bool{
				"relay-ready sent": mv.relayReadySent, "committed in store": mv.committedInStore, "opened": mv.opened, "removed": mv.targetRemoved,
			}))
		} else {
			out = append(out, "  target "+mv.to.name+": never prepared")
		}
	}
	var handled, failed, lostNode, lostFollow, unaccepted, other int
	for _, m := range w.msgs {
		switch {
		case m.handled > 0:
			handled++
		case m.failed > 0:
			failed++
		case !m.accepted:
			unaccepted++
		case m.loss == lossCrash || m.loss == lossEnded:
			lostNode++
		case m.loss == lossFollow:
			lostFollow++
		default:
			other++
		}
	}
	out = append(out, fmt.Sprintf("messages: %d sent: %d handled, %d failed loudly, %d lost with a node, %d lost following, %d not accepted, %d otherwise",
		len(w.msgs), handled, failed, lostNode, lostFollow, unaccepted, other))
	return strings.Join(out, "\n")
}

func runState(ph handoff.Phase, finished, dead bool, flags map[string]bool) string {
	s := ph.String()
	switch {
	case dead:
		s += " (its node went down)"
	case finished:
		s += " (finished)"
	default:
		s += " (not finished)"
	}
	var set []string
	for k, v := range flags {
		if v {
			set = append(set, k)
		}
	}
	slices.Sort(set)
	if len(set) > 0 {
		s += "; " + strings.Join(set, ", ")
	}
	return s
}

// trace [raw] [word ...]
//
// Without raw, the protocol steps of the moves: each machine step that
// changed a phase or had effects other than timers, the owner writes,
// faults, nodes going down, violations. With raw, every line of the
// world's trace. Words keep only the lines that contain each of them as a
// whole token (m1 does not match m17).
func (e *scriptEnv) trace(c *simscript.Cmd) string {
	phase := map[string]string{}
	return simkit.ScriptTrace(c, e.w.Trace(), func(l string) (string, bool) { return protocolStep(l, phase) })
}

// stepMarkers are the lines of the world's trace that are protocol steps
// or faults, besides the machines' steps.
var stepMarkers = []string{" starts move ", "store: o", " DOWN", "VIOLATION", "net: cut", " lifecycle ended", "store up",
	" cut from the store", " refuses ", "dropped (scenario)", " finished (phase", " store cas ", " store apply ", " session-", " is SpotWide: "}

// protocolStep condenses a trace line of a machine step ("n1 src #1 Event →
// Phase [effects]") to its event, phase and effects without timers, and
// keeps it if the phase changed or an effect is left; phase remembers
// each machine's phase. Other lines are kept if they are faults or owner
// writes.
func protocolStep(l string, phase map[string]string) (string, bool) {
	i := strings.Index(l, " src #")
	if i < 0 {
		i = strings.Index(l, " tgt #")
	}
	if i < 0 {
		for _, m := range stepMarkers {
			if m == " store cas " || m == " store apply " {
				if !strings.Contains(l, " answered ") {
					continue
				}
				// A failed answer carries no record.
				l = strings.TrimSuffix(l, " "+Record{}.String())
			}
			if strings.Contains(l, m) {
				return l, true
			}
		}
		return "", false
	}
	arrow := strings.Index(l, " → ")
	open := strings.LastIndex(l, " [")
	if arrow < 0 || open < arrow || !strings.HasSuffix(l, "]") {
		return l, true // "created", "finished": keep as is
	}
	// The machine: "<time> <node> src #N <event> → ...".
	f := strings.Fields(l)
	machine := strings.Join(f[1:4], " ")
	ph := l[arrow+len(" → ") : open]
	effects := simkit.WithoutTimers(l[open+2 : len(l)-1])
	changed := phase[machine] != ph
	phase[machine] = ph
	if !changed && len(effects) == 0 {
		return "", false
	}
	return l[:open] + " [" + strings.Join(effects, " ") + "]", true
}
