package spotservice

import (
	"errors"
	"testing"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

type passOnStub struct {
	nodes   []location.VersionedNode
	err     error
	mesh    string
	sentTo  string
	sent    *messages.SpotActivation
	ordered bool
}

func (s *passOnStub) ListNodes(mesh string, done func([]location.VersionedNode, error)) {
	s.mesh = mesh
	done(s.nodes, s.err)
}

func (s *passOnStub) Candidates(nodes []location.VersionedNode, _ *messages.SpotActivation) []location.VersionedNode {
	s.ordered = true
	return nodes
}

func (s *passOnStub) Send(n location.VersionedNode, next *messages.SpotActivation) {
	s.sentTo, s.sent = n.Node.GetNodeRid(), next
}

func node(rid string, gen uint64, version location.StoreVersion) location.VersionedNode {
	return location.VersionedNode{Node: &messages.NodeDescriptor{NodeRid: rid, NodeGeneration: gen}, Version: version}
}

// A full node lists its Mesh's nodes, orders them as the placement does
// and sends the envelope to the first that has not refused it, naming
// that node's descriptor; a failed listing or a Mesh where every node
// refused passes nothing on. Reference: docs/PROTOCOL.md §7.5 step 9.
func TestRunPassOnSendsToTheFirstCandidateNotFull(t *testing.T) {
	a := &messages.SpotActivation{SpotId: "s", TargetMesh: "m1", FullNodeRids: []string{"n1"}}
	stub := &passOnStub{nodes: []location.VersionedNode{node("n1", 1, 10), node("n2", 2, 20), node("n3", 3, 30)}}
	var passed bool
	RunPassOn(stub, a, "n2", func(p bool) { passed = p })
	if !passed || stub.mesh != "m1" || !stub.ordered || stub.sentTo != "n3" || stub.sent.GetDescriptorVersion() != 30 {
		t.Fatalf("passed=%v mesh=%q ordered=%v sent to %q (descriptor %d), want n3 (30) of m1", passed, stub.mesh, stub.ordered, stub.sentTo, stub.sent.GetDescriptorVersion())
	}

	for name, stub := range map[string]*passOnStub{
		"listing failed": {err: errors.New("down"), nodes: []location.VersionedNode{node("n3", 3, 30)}},
		"all full":       {nodes: []location.VersionedNode{node("n1", 1, 10), node("n2", 2, 20)}},
	} {
		passed := true
		RunPassOn(stub, a, "n2", func(p bool) { passed = p })
		if passed || stub.sent != nil {
			t.Fatalf("%s: passed=%v, sent to %q", name, passed, stub.sentTo)
		}
	}
}
