package chaos

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/roamactors/roam/location/consulstore/consultest"
)

// ConsulVersion is the Consul release the chaos test runs (make consul).
const ConsulVersion = "1.14.11"

// ConsulBinary is $ROAM_CONSUL, else ~/.cache/roam/consul-1.14.11/consul.
func ConsulBinary() (string, error) {
	path := os.Getenv("ROAM_CONSUL")
	if path == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		path = filepath.Join(home, ".cache", "roam", "consul-"+ConsulVersion, "consul")
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("consul %s not found at %s (run `make consul`): %w", ConsulVersion, path, err)
	}
	return path, nil
}

// consulServer is one Consul server agent with a real data directory, so a
// kill and a restart keep its data (not -dev). Its ports stay the same
// across restarts.
type consulServer struct {
	bin, name, dataDir, logPath    string
	http, server, serfLAN, serfWAN int
	args                           []string
	cmd                            *exec.Cmd
	exited                         chan struct{}
}

// HTTPAddr is the server's HTTP API address.
func (s *consulServer) HTTPAddr() string { return "127.0.0.1:" + strconv.Itoa(s.http) }

// RaftAddr is the server's RPC address, as /v1/status/leader names it.
func (s *consulServer) RaftAddr() string { return "127.0.0.1:" + strconv.Itoa(s.server) }

// newConsulServers prepares n servers (1, or 3 for a cluster) in dir.
func newConsulServers(bin, dir string, n int) ([]*consulServer, error) {
	ports, err := consultest.FreePorts(4 * n)
	if err != nil {
		return nil, err
	}
	var ss []*consulServer
	for i := 0; i < n; i++ {
		s := &consulServer{bin: bin, name: fmt.Sprintf("consul-%d", i+1),
			http: ports[4*i], server: ports[4*i+1], serfLAN: ports[4*i+2], serfWAN: ports[4*i+3]}
		s.dataDir = filepath.Join(dir, s.name+"-data")
		s.logPath = filepath.Join(dir, s.name+".log")
		if err := os.MkdirAll(s.dataDir, 0o755); err != nil {
			return nil, err
		}
		ss = append(ss, s)
	}
	for _, s := range ss {
		var joins []int
		for _, o := range ss {
			if o != s {
				joins = append(joins, o.serfLAN)
			}
		}
		s.args = consultest.ServerArgs(s.name, s.dataDir, n, [4]int{s.http, s.server, s.serfLAN, s.serfWAN}, joins)
	}
	return ss, nil
}

// Start starts the agent (again, on the same data directory).
func (s *consulServer) Start() error {
	logf, err := os.OpenFile(s.logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", s.name, err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	exited := s.exited
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	return nil
}

// Running reports whether the agent process is alive.
func (s *consulServer) Running() bool {
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// Kill SIGKILLs the agent and waits for it to exit.
func (s *consulServer) Kill() {
	if !s.Running() {
		return
	}
	_ = syscall.Kill(s.cmd.Process.Pid, syscall.SIGCONT) // a stopped process dies too
	_ = syscall.Kill(s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
}

// Signal sends sig (SIGSTOP, SIGCONT) to the agent.
func (s *consulServer) Signal(sig syscall.Signal) error {
	if !s.Running() {
		return errors.New(s.name + " is not running")
	}
	return syscall.Kill(s.cmd.Process.Pid, sig)
}

// Leader asks this agent for the cluster's leader (its RPC address);
// "" when there is none or the agent does not answer.
func (s *consulServer) Leader() string {
	client := &http.Client{Timeout: time.Second}
	resp, err := client.Get("http://" + s.HTTPAddr() + "/v1/status/leader")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return ""
	}
	return strings.Trim(strings.TrimSpace(string(body)), `"`)
}

// kvWorks reports whether a consistent KV read succeeds through this agent.
func (s *consulServer) kvWorks() bool {
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + s.HTTPAddr() + "/v1/kv/roam-chaos-probe?consistent")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200 || resp.StatusCode == 404
}

// WaitReady waits until the agent knows a leader and serves consistent
// reads, bounded by limit.
func (s *consulServer) WaitReady(limit time.Duration) error {
	return waitFor(limit, 100*time.Millisecond, func() (bool, error) {
		if !s.Running() {
			return false, fmt.Errorf("%s exited (log %s)", s.name, s.logPath)
		}
		return s.Leader() != "" && s.kvWorks(), nil
	}, s.name+" ready")
}

// waitFor polls cond every step until it holds, fails, or limit passes.
func waitFor(limit, step time.Duration, cond func() (bool, error), what string) error {
	deadline := time.Now().Add(limit)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(step)
	}
}
