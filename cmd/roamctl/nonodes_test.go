package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location/consulstore"
	"github.com/roamactors/roam/location/consulstore/consultest"
	"github.com/roamactors/roam/roamerr"
)

// A look that finds no live node fails (exit status 1, NotFound), names
// the prefix and mesh it looked in and the meshes that have live nodes;
// before, nodes and placement printed "no live nodes" and exited 0.
func TestNoLiveNodesSaysWhereItLookedAndWhatExists(t *testing.T) {
	store := manualStore()
	claim(t, store, "blue", "n1", 0)
	claim(t, store, "red", "n2", 0)
	ctx := context.Background()
	want := `no live nodes under prefix "roam" in mesh "green"; live nodes are in mesh blue, red (-mesh blue)`
	for name, cmd := range map[string]func(*ctl) error{
		"nodes":     func(c *ctl) error { return c.Nodes(ctx) },
		"placement": func(c *ctl) error { return c.Placement(ctx) },
		"ended":     func(c *ctl) error { return c.Ended(ctx) },
	} {
		c, out, _ := testCtl(store)
		c.prefix, c.mesh = "roam", "green"
		err := cmd(c)
		require.Equal(t, exitFailed, codeOf(err), name)
		require.ErrorIs(t, err, roamerr.ErrNotFound, name)
		require.EqualError(t, err, want, name)
		require.Empty(t, out.String(), name)
	}

	// -json still prints its (empty) document.
	c, out, _ := testCtl(store)
	c.mesh, c.json = "green", true
	require.Equal(t, exitFailed, codeOf(c.Nodes(ctx)))
	require.Equal(t, "{\"nodes\":[]}\n", out.String())

	// An empty store: where it looked, and what to check.
	c, _, _ = testCtl(manualStore())
	c.prefix = "roam"
	require.EqualError(t, c.Nodes(ctx), `no live nodes under prefix "roam" in any mesh; are the nodes running, and is -prefix their consulstore.Config.Prefix?`)

	// watch waits for nodes to start, and says where it waits.
	c, _, errOut := testCtl(store)
	c.prefix, c.mesh = "roam", "green"
	wctx, cancel := context.WithCancelCause(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Watch(wctx, 0) }()
	testwait.For(t, func() bool { return strings.Contains(errOut.String(), want+"; waiting for nodes to start\n") }, "watch's hint")
	cancel(errInterrupted)
	require.NoError(t, <-done)
}

// Against a real Consul: the wrong -prefix is named, with the prefix the
// nodes use; the wrong -mesh under the right prefix with the nodes' mesh.
func TestWrongPrefixOrMeshOnConsul(t *testing.T) {
	srv := consultest.Start(t)
	s, err := consulstore.New(consulstore.Config{Address: srv.Addr, Prefix: "roam-elsewhere"})
	require.NoError(t, err)
	claim(t, s, "default", "node-a", 0)

	runCtl := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"-http-addr", srv.Addr, "-timeout", "30s"}, args...), &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	code, out, errOut := runCtl("nodes")
	require.Equal(t, exitFailed, code, out)
	require.Equal(t, "roamctl: no live nodes under prefix \"roam\" in any mesh; prefix roam-elsewhere has live nodes (-prefix roam-elsewhere)\n", errOut)

	code, _, errOut = runCtl("-prefix", "roam-elsewhere", "-mesh", "nope", "placement")
	require.Equal(t, exitFailed, code)
	require.Equal(t, "roamctl: no live nodes under prefix \"roam-elsewhere\" in mesh \"nope\"; live nodes are in mesh default (-mesh default)\n", errOut)

	code, out, errOut = runCtl("-prefix", "roam-elsewhere", "nodes")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "node-a")
}
