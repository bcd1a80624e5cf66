package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/roamactors/roam/roamerr"
)

// noNodesError is a look that found no live node: the usual cause is a
// -prefix or -mesh that is not the nodes'. roamerr.ErrNotFound.
type noNodesError struct{ msg string }

func (e *noNodesError) Error() string        { return e.msg }
func (e *noNodesError) Is(target error) bool { return target == roamerr.ErrNotFound }

// noLiveNodes is the error of a command that found no live node under
// c.prefix and c.mesh: it names where it looked and, when the store shows
// them, the meshes and prefixes that do have live nodes. Exit status 1.
func (c *ctl) noLiveNodes(ctx context.Context) error {
	return &exitError{code: exitFailed, err: &noNodesError{msg: c.noNodesHint(ctx)}}
}

// noNodesHint says where roamctl looked and what it found elsewhere.
func (c *ctl) noNodesHint(ctx context.Context) string {
	// The look-ups are a hint only: bounded, and left out when they fail.
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	where := "in any mesh"
	if c.mesh != "" {
		where = fmt.Sprintf("in mesh %q", c.mesh)
	}
	if c.prefix != "" {
		where = fmt.Sprintf("under prefix %q %s", c.prefix, where)
	}
	msg := "no live nodes " + where
	var hints []string
	if c.mesh != "" {
		if nodes, err := c.store.ListNodes(ctx, ""); err == nil {
			var meshes []string
			for _, n := range nodes {
				if m := n.Node.GetMesh(); !slices.Contains(meshes, m) {
					meshes = append(meshes, m)
				}
			}
			slices.Sort(meshes)
			if len(meshes) > 0 {
				hints = append(hints, fmt.Sprintf("live nodes are in mesh %s (-mesh %s)", strings.Join(meshes, ", "), meshes[0]))
			}
		}
	}
	if c.prefixes != nil {
		if ps, err := c.prefixes(ctx); err == nil {
			ps = slices.DeleteFunc(ps, func(p string) bool { return p == c.prefix })
			if len(ps) > 0 {
				hints = append(hints, fmt.Sprintf("prefix %s has live nodes (-prefix %s)", strings.Join(ps, ", "), ps[0]))
			}
		}
	}
	if len(hints) == 0 {
		hints = append(hints, "are the nodes running, and is -prefix their consulstore.Config.Prefix?")
	}
	return msg + "; " + strings.Join(hints, "; ")
}
