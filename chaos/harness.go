package chaos

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/roamactors/roam/location/consulstore/consultest"
)

// Settings configure a chaos run.
type Settings struct {
	// Node configuration: short leases for speed. cluster.Config accepts
	// whole seconds of at least 1 s; the default margin is max(TTL/5,
	// 500 ms), renewals every TTL/3.
	LeaseTTL, RestoreTimeout, CallTimeout time.Duration
	// Warm is the traffic and moves before a fault; Steady the traffic
	// after every object was served again.
	Warm, Steady time.Duration
	// Objects is the number of counters; each gets a call every OpEvery.
	Objects int
	OpEvery time.Duration
	// MoveEvery paces the mover.
	MoveEvery time.Duration
	// Bin is the roam-chaos binary (its node subcommand); Dir the work
	// directory.
	Bin, Dir string
	// Out receives the progress lines.
	Out io.Writer
	// Director runs the placement director (balance and co-location) on
	// every node: its idle moves join the mover's under every fault.
	Director bool
}

// Bound is the longest an object may stay unserved after its fault healed:
// Consul ends a session between TTL and 2×TTL after its last renewal, and
// a node takes a descriptor's absence for an ended owner only after seeing
// it gone for one more TTL, so an ended owner's objects become
// reactivatable at most 3×TTL after the fault began (a heal comes later); a move caught by the fault settles by its
// restore deadline (the fence-out adds one cutover wait, 1 s); a request
// already waiting on a dead route fails after the call timeout before its
// retry re-resolves; and 5 s of slack covers a rejoin's start-up and a busy
// 2-core machine.
func (s Settings) Bound() time.Duration {
	return 3*s.LeaseTTL + s.RestoreTimeout + time.Second + s.CallTimeout + 5*time.Second
}

// node is one node process, restartable under the same name and ports.
type node struct {
	env                   *env
	name                  string
	httpAddr, listen      string
	advertise, consulAddr string
	// proxy is in front of the node's remote (peers dial it), storeProxy
	// in front of its Consul (with Scenario.Proxy, node-3 only).
	proxy, storeProxy *proxy
	starts            int
	mu                sync.Mutex
	cmd               *exec.Cmd
	exited            chan struct{}
	proc              string
	up                bool // usable as an entry by the driver
	stopped           bool // SIGSTOPped
	ready             chan string
}

type env struct {
	set    Settings
	name   string
	dir    string
	consul []*consulServer
	nodes  []*node
	prefix string
	marks  chan string

	mu     sync.Mutex
	killed map[string]int64
	heals  []int64
	faults int
	events []string
}

func (e *env) logf(format string, args ...any) {
	line := fmt.Sprintf("%s [%s] %s", time.Now().Format("15:04:05.000"), e.name, fmt.Sprintf(format, args...))
	e.mu.Lock()
	e.events = append(e.events, line)
	e.mu.Unlock()
	fmt.Fprintln(e.set.Out, line)
}

func (e *env) heal() {
	e.mu.Lock()
	e.heals = append(e.heals, time.Now().UnixNano())
	e.mu.Unlock()
}

func (e *env) fault() {
	e.mu.Lock()
	e.faults++
	e.mu.Unlock()
}

// newEnv starts Consul (1 or 3 servers) and three node processes.
func newEnv(set Settings, name string, consuls int, withProxy bool) (*env, error) {
	dir := filepath.Join(set.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	e := &env{set: set, name: name, dir: dir, prefix: "roam-chaos/" + name, marks: make(chan string, 16), killed: map[string]int64{}}
	bin, err := ConsulBinary()
	if err != nil {
		return nil, err
	}
	e.consul, err = newConsulServers(bin, dir, consuls)
	if err != nil {
		return nil, err
	}
	for _, s := range e.consul {
		if err := s.Start(); err != nil {
			e.close()
			return nil, err
		}
	}
	for _, s := range e.consul {
		if err := s.WaitReady(90 * time.Second); err != nil {
			e.close()
			return nil, err
		}
	}
	e.logf("consul: %d server(s) ready (%s)", consuls, e.consul[0].HTTPAddr())
	ports, err := consultest.FreePorts(6)
	if err != nil {
		e.close()
		return nil, err
	}
	for i := 0; i < 3; i++ {
		n := &node{env: e, name: fmt.Sprintf("node-%d", i+1),
			httpAddr: "127.0.0.1:" + strconv.Itoa(ports[2*i]), listen: "127.0.0.1:" + strconv.Itoa(ports[2*i+1]),
			consulAddr: e.consul[i%len(e.consul)].HTTPAddr()}
		if withProxy && i == 2 {
			p, err := newProxy("127.0.0.1:0", n.listen)
			if err != nil {
				e.close()
				return nil, err
			}
			n.proxy, n.advertise = p, p.Addr()
			sp, err := newProxy("127.0.0.1:0", n.consulAddr)
			if err != nil {
				p.Close()
				e.close()
				return nil, err
			}
			n.storeProxy, n.consulAddr = sp, sp.Addr()
		}
		e.nodes = append(e.nodes, n)
	}
	errs := make(chan error, len(e.nodes))
	for _, n := range e.nodes {
		go func() { errs <- n.start() }()
	}
	for range e.nodes {
		if err := <-errs; err != nil {
			e.close()
			return nil, err
		}
	}
	return e, nil
}

// start starts the node's process and waits until it serves.
func (n *node) start() error {
	n.mu.Lock()
	n.starts++
	records := filepath.Join(n.env.dir, fmt.Sprintf("records-%s-%d.jsonl", n.name, n.starts))
	args := []string{"node", "--consul", n.consulAddr, "--prefix", n.env.prefix, "--name", n.name,
		"--listen", n.listen, "--http", n.httpAddr, "--records", records,
		"--ttl", n.env.set.LeaseTTL.String(), "--restore", n.env.set.RestoreTimeout.String(),
		"--call-timeout", n.env.set.CallTimeout.String()}
	if n.advertise != "" {
		args = append(args, "--advertise", n.advertise)
	}
	if n.env.set.Director {
		args = append(args, "--director")
	}
	logf, err := os.OpenFile(filepath.Join(n.env.dir, n.name+".log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		n.mu.Unlock()
		return err
	}
	cmd := exec.Command(n.env.set.Bin, args...)
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		n.mu.Unlock()
		logf.Close()
		return err
	}
	if err := cmd.Start(); err != nil {
		n.mu.Unlock()
		logf.Close()
		return err
	}
	exited, ready := make(chan struct{}), make(chan string, 1)
	n.cmd, n.exited, n.ready, n.proc, n.up, n.stopped = cmd, exited, ready, "", false, false
	n.mu.Unlock()
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "READY "):
				for _, f := range strings.Fields(line) {
					if p, ok := strings.CutPrefix(f, "proc="); ok {
						ready <- p
					}
				}
			case strings.HasPrefix(line, "MARK "):
				select {
				case n.env.marks <- n.name:
				default:
				}
			}
		}
		_ = cmd.Wait()
		logf.Close()
		n.mu.Lock()
		if n.exited == exited {
			n.up = false // the driver stops calling through it at once
		}
		n.mu.Unlock()
		close(exited)
	}()
	select {
	case p := <-ready:
		n.mu.Lock()
		n.proc, n.up = p, true
		n.mu.Unlock()
		n.env.logf("%s ready (process %d, %s)", n.name, cmd.Process.Pid, p)
		return nil
	case <-exited:
		return fmt.Errorf("%s exited before it served (log %s)", n.name, filepath.Join(n.env.dir, n.name+".log"))
	case <-time.After(2 * time.Minute):
		return fmt.Errorf("%s did not serve within 2 minutes", n.name)
	}
}

func (n *node) isUp() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.up
}

func (n *node) running() bool {
	n.mu.Lock()
	ch := n.exited
	n.mu.Unlock()
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return false
	default:
		return true
	}
}

// kill SIGKILLs the process and waits for it to exit.
func (n *node) kill() {
	n.mu.Lock()
	cmd, exited, proc := n.cmd, n.exited, n.proc
	n.up = false
	n.mu.Unlock()
	_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
	n.env.mu.Lock()
	n.env.killed[proc] = time.Now().UnixNano()
	n.env.mu.Unlock()
	<-exited
}

// signal sends SIGSTOP or SIGCONT.
func (n *node) signal(sig syscall.Signal) {
	n.mu.Lock()
	defer n.mu.Unlock()
	_ = syscall.Kill(n.cmd.Process.Pid, sig)
	n.stopped = sig == syscall.SIGSTOP
	n.up = !n.stopped
}

// shutdown stops the process gracefully (SIGTERM: extension Stop), bounded.
func (n *node) shutdown() {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.up = false
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(cmd.Process.Pid, syscall.SIGCONT)
	_ = syscall.Kill(cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		n.env.logf("%s did not stop within 30 s of SIGTERM; killed", n.name)
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
}

func (e *env) close() {
	var wg sync.WaitGroup
	for _, n := range e.nodes {
		wg.Add(1)
		go func() { defer wg.Done(); n.shutdown() }()
	}
	wg.Wait()
	for _, n := range e.nodes {
		if n.proxy != nil {
			n.proxy.Close()
			n.storeProxy.Close()
		}
	}
	for _, s := range e.consul {
		s.Kill()
	}
}

// upNodes are the nodes the driver may call through.
func (e *env) upNodes() []*node {
	var out []*node
	for _, n := range e.nodes {
		if n.isUp() {
			out = append(out, n)
		}
	}
	return out
}

func (e *env) nodeByName(name string) *node {
	for _, n := range e.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// leader is the Consul server leading the cluster, asked of running ones.
func (e *env) leader() (*consulServer, error) {
	for _, s := range e.consul {
		if !s.Running() {
			continue
		}
		if addr := s.Leader(); addr != "" {
			for _, c := range e.consul {
				if c.RaftAddr() == addr {
					return c, nil
				}
			}
			return nil, fmt.Errorf("unknown leader %s", addr)
		}
	}
	return nil, errors.New("no Consul server knows a leader")
}
