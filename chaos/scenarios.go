package chaos

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"syscall"
	"time"
)

// Scenario is one fault.
type Scenario struct {
	Name string
	Desc string
	// Consuls: 1 server, or 3 for a cluster (each node talks to its own).
	Consuls int
	// Proxy puts node-3's remote behind a proxy it advertises.
	Proxy  bool
	Inject func(e *env, d *driver) error
}

// Scenarios are every fault, in the order `make chaos` runs them.
func Scenarios() []Scenario {
	return []Scenario{
		{Name: "node-kill", Desc: "SIGKILL node-2, then start it again as a new process", Consuls: 1, Inject: nodeKill},
		{Name: "target-kill-at-commit", Desc: "SIGKILL node-3 as a move into it has its cutover (relay-ready answered, commit CAS not started)", Consuls: 1, Inject: targetKill},
		{Name: "node-stop-past-ttl", Desc: "SIGSTOP node-2 for 2×TTL+3 s, then SIGCONT", Consuls: 1, Inject: nodeStop},
		{Name: "consul-stop-5s", Desc: "SIGSTOP Consul for 5 s", Consuls: 1, Inject: consulStop(5 * time.Second)},
		{Name: "consul-stop-25s", Desc: "SIGSTOP Consul for 25 s", Consuls: 1, Inject: consulStop(25 * time.Second)},
		{Name: "consul-restart", Desc: "SIGKILL Consul and start it again on its data directory", Consuls: 1, Inject: consulRestart},
		{Name: "consul-leader-kill", Desc: "three Consul servers; SIGKILL the leader as a move's target has its cutover, restart it 10 s later", Consuls: 3, Inject: leaderKill},
		{Name: "net-cut", Desc: "partition node-3's remote (a proxy it advertises stops every byte) for 10 s", Consuls: 1, Proxy: true, Inject: netCut},
		{Name: "node-isolate-25s", Desc: "isolate node-3 for 25 s: its remote and its Consul link (proxies) stop every byte", Consuls: 1, Proxy: true, Inject: nodeIsolate},
		{Name: "consul-down-past-ttl", Desc: "SIGKILL Consul, keep it down for 2×TTL+3 s, start it again on its data directory", Consuls: 1, Inject: consulDownPastTTL},
		{Name: "rolling-restart", Desc: "SIGTERM each node in turn (it drains, then stops) and start it again: a deploy, which loses nothing", Consuls: 1, Inject: rollingRestart},
		{Name: "kill-mid-drain", Desc: "SIGTERM node-2 (it starts draining) and SIGKILL it 300 ms later, then start it again", Consuls: 1, Inject: killMidDrain},
	}
}

// ShortScenarios are `make chaos-short`'s subset.
func ShortScenarios() []string {
	return []string{"node-kill", "node-stop-past-ttl", "consul-restart", "rolling-restart"}
}

// rollingRestart is a deploy: each node in turn gets SIGTERM, drains its
// objects to the others, stops, and starts again as a new process. Not a
// fault: no lifecycle ends abnormally, so nothing may be lost.
func rollingRestart(e *env, d *driver) error {
	for _, n := range e.nodes {
		proc := n.proc
		n.shutdown()
		e.logf("%s (%s) drained and stopped on SIGTERM", n.name, proc)
		if err := n.start(); err != nil {
			return err
		}
		e.logf("%s restarted as %s", n.name, n.proc)
	}
	e.heal()
	return nil
}

// killMidDrain kills a node while its drain is moving objects out: moves
// past relay-ready complete on their targets, the rest are an ended
// owner's, recovered as after node-kill.
func killMidDrain(e *env, d *driver) error {
	n := e.nodes[1]
	n.mu.Lock()
	cmd, proc := n.cmd, n.proc
	n.mu.Unlock()
	_ = syscall.Kill(cmd.Process.Pid, syscall.SIGTERM)
	time.Sleep(300 * time.Millisecond) // the drain's head start, not a wait for an outcome
	n.kill()
	e.fault()
	e.logf("SIGTERMed %s (%s), SIGKILLed it 300 ms into its drain", n.name, proc)
	if err := n.start(); err != nil {
		return err
	}
	e.heal()
	e.logf("%s restarted: healed", n.name)
	return nil
}

func nodeKill(e *env, d *driver) error {
	n := e.nodes[1]
	proc := n.proc
	n.kill()
	e.fault()
	e.logf("SIGKILLed %s (%s)", n.name, proc)
	if err := n.start(); err != nil {
		return err
	}
	e.heal()
	e.logf("%s restarted: healed", n.name)
	return nil
}

func targetKill(e *env, d *driver) error {
	n := e.nodes[2]
	proc := n.proc
	var res CallResult
	if err := d.post(n, "/arm", map[string][]string{"mode": {"crash"}}, 5*time.Second, &res); err != nil {
		return fmt.Errorf("arm %s: %w", n.name, err)
	}
	e.logf("armed %s to SIGKILL itself at a move's cutover; moving counters into it", n.name)
	rnd := rand.New(rand.NewPCG(5, uint64(time.Now().UnixNano())))
	n.mu.Lock()
	exited := n.exited
	n.mu.Unlock()
	stop := make(chan struct{})
	go func() { // moves into n until it dies
		for {
			select {
			case <-stop:
				return
			case <-exited:
				return
			default:
			}
			_, _ = d.move(rnd, d.objs[rnd.IntN(len(d.objs))], n.name)
		}
	}()
	select {
	case <-exited:
		close(stop)
	case <-time.After(90 * time.Second):
		close(stop)
		return errors.New("no move into " + n.name + " reached its cutover within 90 s")
	}
	// The kill time is the crash record the process wrote just before.
	e.mu.Lock()
	e.killed[proc] = time.Now().UnixNano()
	e.mu.Unlock()
	e.fault()
	e.logf("%s (%s) killed itself between relay-ready and commit", n.name, proc)
	if err := n.start(); err != nil {
		return err
	}
	e.heal()
	e.logf("%s restarted: healed", n.name)
	return nil
}

func nodeStop(e *env, d *driver) error {
	n := e.nodes[1]
	pause := 2*e.set.LeaseTTL + 3*time.Second
	n.signal(syscall.SIGSTOP)
	e.fault()
	e.logf("SIGSTOPped %s for %s (its lease TTL is %s)", n.name, pause, e.set.LeaseTTL)
	time.Sleep(pause) // the fault's length, not a wait for an outcome
	n.signal(syscall.SIGCONT)
	e.heal()
	e.logf("SIGCONT %s: healed", n.name)
	return nil
}

func consulStop(length time.Duration) func(e *env, d *driver) error {
	return func(e *env, d *driver) error {
		s := e.consul[0]
		if err := s.Signal(syscall.SIGSTOP); err != nil {
			return err
		}
		e.fault()
		e.logf("SIGSTOPped Consul for %s", length)
		time.Sleep(length) // the fault's length
		if err := s.Signal(syscall.SIGCONT); err != nil {
			return err
		}
		e.heal()
		e.logf("SIGCONT Consul: healed")
		return nil
	}
}

func consulRestart(e *env, d *driver) error { return restartConsul(e, 0) }

// restartConsul SIGKILLs the Consul server, keeps it down for down, and
// starts it again on its data directory.
func restartConsul(e *env, down time.Duration) error {
	s := e.consul[0]
	s.Kill()
	e.fault()
	e.logf("SIGKILLed Consul; down for %s (lease TTL %s)", down, e.set.LeaseTTL)
	time.Sleep(down) // the fault's length, not a wait for an outcome
	if err := s.Start(); err != nil {
		return err
	}
	if err := s.WaitReady(2 * time.Minute); err != nil {
		return err
	}
	e.heal()
	e.logf("Consul restarted on its data directory and has a leader: healed")
	return nil
}

func leaderKill(e *env, d *driver) error {
	lead, err := e.leader()
	if err != nil {
		return err
	}
	for _, n := range e.nodes {
		var res CallResult
		if err := d.post(n, "/arm", map[string][]string{"mode": {"mark"}}, 5*time.Second, &res); err != nil {
			return fmt.Errorf("arm %s: %w", n.name, err)
		}
	}
	e.logf("leader is %s; waiting for a move's cutover to kill it", lead.name)
	select {
	case who := <-e.marks:
		lead.Kill()
		e.fault()
		e.logf("SIGKILLed the Consul leader %s as a move into %s had its cutover", lead.name, who)
	case <-time.After(90 * time.Second):
		return errors.New("no move reached its cutover within 90 s")
	}
	for _, n := range e.nodes { // disarm the others
		var res CallResult
		if n.isUp() {
			_ = d.post(n, "/arm", map[string][]string{"mode": {"none"}}, 5*time.Second, &res)
		}
	}
	time.Sleep(10 * time.Second) // the fault's length
	if err := lead.Start(); err != nil {
		return err
	}
	if err := lead.WaitReady(2 * time.Minute); err != nil {
		return err
	}
	e.heal()
	e.logf("%s restarted and rejoined: healed", lead.name)
	return nil
}

// nodeIsolate cuts node-3 off from its peers and from Consul: it fences
// itself, the others revoke its lease a TTL after its last heartbeat and
// recover its objects; after the heal it learns its lease ended and
// rejoins as a new lifecycle.
func nodeIsolate(e *env, d *driver) error {
	n := e.nodes[2]
	n.proxy.Cut()
	n.storeProxy.Cut()
	e.fault()
	e.logf("isolated %s (remote and Consul link cut)", n.name)
	time.Sleep(25 * time.Second) // the fault's length
	n.storeProxy.Heal()
	n.proxy.Heal()
	e.heal()
	e.logf("healed the isolation")
	return nil
}

// consulDownPastTTL keeps the store away longer than every lease: every
// node fences itself. Whether a lease outlives the restart is Consul's
// (a new leader starts the sessions' TTL timers again): a node whose lease
// did unfences at its next renewal, one whose lease ended rejoins as a new
// lifecycle and its objects are recovered; either way every object serves
// again.
func consulDownPastTTL(e *env, d *driver) error {
	return restartConsul(e, 2*e.set.LeaseTTL+3*time.Second)
}

func netCut(e *env, d *driver) error {
	n := e.nodes[2]
	n.proxy.Cut()
	e.fault()
	e.logf("cut %s's remote (proxy %s -> %s)", n.name, n.advertise, n.listen)
	time.Sleep(10 * time.Second) // the fault's length
	n.proxy.Heal()
	e.heal()
	e.logf("healed the cut")
	return nil
}
