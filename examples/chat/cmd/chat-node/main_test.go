package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// mainEnv makes the test binary run main with the arguments after "--"
// (TestMain), to check what the command itself does on a wrong flag.
const mainEnv = "CHAT_NODE_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{"chat-node"}, os.Args[i+1:]...)
				break
			}
		}
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Every flag is checked before a node starts: a wrong one is refused with
// what it accepts, never a panic or a process without nodes.
func TestFlagsAreChecked(t *testing.T) {
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--rooms", "-5"}, "--rooms must be from 0 to 1000000, got -5"},
		{[]string{"--rooms", "1000001"}, "--rooms must be from 0 to 1000000"},
		{[]string{"--nodes", "0"}, "--nodes must be from 1 to 64, got 0"},
		{[]string{"--nodes", "-1"}, "--nodes must be from 1 to 64"},
		{[]string{"--nodes", "65"}, "--nodes must be from 1 to 64"},
		{[]string{"--store", "consul", "--nodes", "3"}, "--nodes must be 1 with --store consul"},
		{[]string{"--store", "etcd"}, "--store must be memory or consul"},
		{[]string{"--store", "consul", "--consul", ""}, "--consul must name at least one Consul agent"},
		{[]string{"--store", "consul", "--prefix", ""}, "--prefix must not be empty"},
		{[]string{"--listen", "7001"}, "--listen must be host:port with a port from 0 to 65535"},
		{[]string{"--listen", "127.0.0.1:70000"}, "--listen must be host:port with a port from 0 to 65535"},
		{[]string{"--listen", "127.0.0.1:-1"}, "--listen must be host:port"},
		{[]string{"--listen", "127.0.0.1:65535", "--nodes", "2"}, "--listen's port must be at most 65534 for --nodes 2"},
		{[]string{"--name", ""}, "--name must be UTF-8 of 1 to 252 bytes"},
		{[]string{"--name", strings.Repeat("n", 253)}, "--name must be UTF-8 of 1 to 252 bytes, got 253"},
		{[]string{"--max-clients", "0"}, "--max-clients must be from 1 to 1000000, got 0"},
		{[]string{"--max-clients", "2000000"}, "--max-clients must be from 1 to 1000000"},
		{[]string{"--idle-timeout", "-1s"}, "--idle-timeout must be 0 (never) or more"},
		{[]string{"--tls-dir", "/nonexistent/certs"}, "--tls-dir must be a directory"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--rooms", "many"}, "invalid value"},
	} {
		var stderr bytes.Buffer
		_, err := parseFlags(c.args, &stderr)
		require.Error(t, err, "%v", c.args)
		require.Contains(t, err.Error()+stderr.String(), c.says, "%v", c.args)
	}

	c, err := parseFlags([]string{"--nodes", "3", "--listen", "127.0.0.1:7001", "--rooms", "0", "--idle-timeout", "0"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 3, c.nodes)
	require.Equal(t, "127.0.0.1", c.host)
	require.Equal(t, 7001, c.port)
	require.Negative(t, c.gateway.IdleTimeout, "0 is never: GatewayOptions' negative")
	c, err = parseFlags([]string{"--store", "consul", "--consul", "10.0.0.1:8500,10.0.0.2:8500", "--listen", "127.0.0.1:0", "--name", "node-a"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 1, c.nodes)
	_, err = parseFlags([]string{"-h"}, io.Discard)
	require.ErrorIs(t, err, flag.ErrHelp, "-h: the flags are listed, and main exits 0")
}

// The command exits 2 on a wrong flag, with one line naming the valid
// range, before it starts anything.
func TestWrongFlagExits2(t *testing.T) {
	for _, args := range [][]string{{"--rooms", "-5"}, {"--nodes", "0"}} {
		cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
		cmd.Env = append(os.Environ(), mainEnv+"=1")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit), "%v: %v", args, err)
		require.Equal(t, 2, exit.ExitCode(), "%v", args)
		require.Contains(t, stderr.String(), "must be from", "%v", args)
		require.NotContains(t, stderr.String(), "panic", "%v", args)
		require.NotContains(t, stdout.String(), "serving chat", "%v: no node started", args)
	}
}
