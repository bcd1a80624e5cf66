package relocation_test

import (
	"context"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// peer is a process that speaks roam's control messages by hand and
// collects what comes back to its "roam/relocation" address.
type peer struct {
	node *meshnode.Node
	self *actor.PID
	got  chan proto.Message
}

func newPeer(t *testing.T, store location.Store) *peer {
	t.Helper()
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: store, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	r := &replies{got: make(chan proto.Message, 64)}
	self, err := n.System().Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return r }), relocation.DriverName)
	require.NoError(t, err)
	return &peer{node: n, self: self, got: r.got}
}

// send sends msg to address's relocation actor, declaring from as the
// sender (any address: Proto.Actor carries what the sender claims).
func (p *peer) send(to string, from *actor.PID, msg proto.Message) {
	p.node.System().Root.RequestWithCustomSender(relocation.PID(to), msg, from)
}

// next waits for the next message of type T, skipping others.
func next[T proto.Message](t *testing.T, p *peer) T {
	t.Helper()
	deadline := time.After(testwait.Patience(t))
	for {
		select {
		case m := <-p.got:
			if v, ok := m.(T); ok {
				return v
			}
		case <-deadline:
			var zero T
			t.Fatalf("no %T came back", zero)
			return zero
		}
	}
}

// askCapability sends a capability query as a source does (a request, answered to
// its future) and returns the answer.
func askCapability(t *testing.T, sys *actor.ActorSystem, to string, src *messages.NodeRef) *messages.CapabilityReply {
	t.Helper()
	res, err := sys.Root.RequestFuture(relocation.PID(to), &messages.CapabilityQuery{Kind: location.KindActor, StableType: "counter", Source: src},
		testwait.Patience(t)).Result()
	require.NoError(t, err)
	reply, ok := res.(*messages.CapabilityReply)
	require.True(t, ok, "got %T", res)
	return reply
}

// forgedMove is a complete, well-formed move of key from owner's fence:
// everything a peer that read the store (or guessed) could build.
func forgedMove(t *testing.T, key location.AuthorityKey, owner *location.NodeDescriptor, rec *location.Record, sourceAddress string, state []byte) (*messages.RelocationPrepare, []*messages.RelocationState, *messages.Cutover) {
	return forgedMoveID(t, 7777, key, owner, rec, sourceAddress, state)
}

// forgedMoveID is forgedMove with the RelocationId rid.
func forgedMoveID(t *testing.T, rid uint64, key location.AuthorityKey, owner *location.NodeDescriptor, rec *location.Record, sourceAddress string, state []byte) (*messages.RelocationPrepare, []*messages.RelocationState, *messages.Cutover) {
	t.Helper()
	id := &messages.RelocationIdentity{RelocationId: rid, TargetAttemptGeneration: 1,
		CoordinatorFence: &messages.CoordinatorFence{NodeRid: owner.GetNodeRid(), NodeGeneration: owner.GetNodeGeneration(), OwnerGeneration: rec.GetAuthorityOwnerGeneration()}}
	stream, err := envelope.Encode(&envelope.Envelope{
		Relocation:        envelope.Relocation{RelocationID: rid, TargetAttemptGeneration: 1, CoordinatorFence: envelope.Fence{NodeRid: owner.GetNodeRid(), NodeGeneration: owner.GetNodeGeneration(), OwnerGeneration: rec.GetAuthorityOwnerGeneration()}},
		Object:            envelope.Object{Kind: uint8(key.Kind), ID: key.ID, ObjectGeneration: rec.GetObjectGeneration(), StableType: "counter"},
		ApplicationStates: []envelope.ApplicationState{{ParticipantID: 1, State: state}},
	})
	require.NoError(t, err)
	m, chunks, err := envelope.Split(stream, 64)
	require.NoError(t, err)
	prepare := &messages.RelocationPrepare{Identity: id, MoveTicket: make([]byte, 16),
		Object:     &messages.ObjectRef{Kind: key.Kind, Id: key.ID, ObjectGeneration: rec.GetObjectGeneration(), StableType: "counter"},
		Manifest:   &messages.PayloadManifest{PayloadTotalLength: m.TotalLength, PayloadChunkCount: m.ChunkCount, PayloadChecksumCrc32C: m.ChecksumCRC32C},
		ChunkLimit: 64, Source: &messages.NodeRef{NodeRid: owner.GetNodeRid(), NodeGeneration: owner.GetNodeGeneration(), Address: sourceAddress},
		RestoreDeadlineUnixMillis: time.Now().Add(10 * time.Second).UnixMilli(), NewOwnerGeneration: rec.GetAuthorityOwnerGeneration() + 1,
		SealedAtUnixNanos: time.Now().UnixNano()}
	var states []*messages.RelocationState
	for _, c := range chunks {
		states = append(states, &messages.RelocationState{Identity: id, Index: c.Index, Offset: c.Offset, Data: c.Data})
	}
	return prepare, states, &messages.Cutover{Identity: id}
}

// A process that is not a node of the mesh, and knows everything the
// store holds about an object (owner RID, generations), cannot move it:
// its capability query is refused without a ticket, and a Restore
// request without one — whether it declares its own address or the
// owner's — is refused; the record and the serving incarnation stay.
func TestOutsiderCannotMoveAnObject(t *testing.T) {
	c := startNodes(t, 2)
	ctx := context.Background()
	a, b := c.nodes[0], c.nodes[1]
	key := location.Key(location.KindActor, "victim")
	pid, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	for i := int64(1); i <= 5; i++ {
		a.node.System().Root.Send(pid, wrapperspb.Int64(i))
	}
	require.Equal(t, int64(5), get(t, a.node.System(), pid))
	before, err := c.store.Read(ctx, key)
	require.NoError(t, err)

	outsider := newPeer(t, memstore.New()) // a node of another store: not a member here
	owner := a.node.Descriptor()
	ownerDriver := relocation.PID(a.node.Address())

	// The capability query, naming the real owner as its source, from the
	// outsider's own address: refused, no ticket.
	reply := askCapability(t, outsider.node.System(), b.node.Address(),
		&messages.NodeRef{NodeRid: owner.GetNodeRid(), NodeGeneration: owner.GetNodeGeneration(), Address: outsider.node.Address()})
	require.False(t, reply.GetSupported())
	require.Empty(t, reply.GetMoveTicket())
	require.Empty(t, reply.GetNode().GetNodeRid(), "a refusal names nothing")

	// The whole move, declaring the owner's address: the target answers
	// the owner, which knows no such move; nothing commits.
	state := make([]byte, 24)
	state[7] = 99 // count 99: the outsider's state
	prepare, chunks, cutover := forgedMove(t, key, owner, before.Record, a.node.Address(), state)
	outsider.send(b.node.Address(), ownerDriver, prepare)
	for _, ch := range chunks {
		outsider.send(b.node.Address(), ownerDriver, ch)
	}
	outsider.send(b.node.Address(), ownerDriver, cutover)
	// The same from its own address, after those on the same connection:
	// its refusal comes back, so the first one has been judged too.
	prepare2, chunks2, _ := forgedMove(t, key, owner, before.Record, outsider.node.Address(), state)
	// One identity for the whole move: set before anything is sent (the
	// transport serializes a sent message on its own goroutine).
	prepare2.Identity.RelocationId = 7778
	outsider.send(b.node.Address(), outsider.self, prepare2)
	for _, ch := range chunks2 {
		outsider.send(b.node.Address(), outsider.self, ch)
	}
	failed := next[*messages.RelocationFailed](t, outsider)
	require.Equal(t, uint64(7778), failed.GetIdentity().GetRelocationId())
	require.NotContains(t, failed.GetDetail(), b.node.Descriptor().GetNodeRid())
	// Had either been admitted, the target would hold a move of the key
	// until it committed (by its cutover-wait fallback) or gave up.
	testwait.For(t, func() bool { return !relocation.Arriving(b.driver, key) }, "a forged move is in progress on the target")

	after, err := c.store.Read(ctx, key)
	require.NoError(t, err)
	require.Equal(t, before.Version, after.Version, "the owner record is untouched")
	serving, err := b.driver.Serving(ctx, key)
	require.NoError(t, err)
	require.False(t, serving, "nothing runs the object on the target")
	require.Equal(t, int64(5), get(t, a.node.System(), pid), "the owner still serves its own state")

	// And the owner can still move it there.
	out, err := a.driver.Relocate(ctx, key, c.rid(1))
	require.NoError(t, err)
	require.Equal(t, c.rid(1), out.To)
	require.Equal(t, int64(5), get(t, a.node.System(), pid))
}

// A live member with a ticket of its own still cannot move an object it
// does not own: the target checks the record before relay-ready, and
// refuses a Restore request whose source is not the owner at the fence.
func TestMemberCannotMoveAnObjectItDoesNotOwn(t *testing.T) {
	c := startNodes(t, 2)
	ctx := context.Background()
	a, b := c.nodes[0], c.nodes[1]
	key := location.Key(location.KindActor, "not-yours")
	pid, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	a.node.System().Root.Send(pid, wrapperspb.Int64(1))
	require.Equal(t, int64(1), get(t, a.node.System(), pid))
	before, err := c.store.Read(ctx, key)
	require.NoError(t, err)

	member := newPeer(t, c.store) // a node of this mesh, not the owner
	md := member.node.Descriptor()
	reply := askCapability(t, member.node.System(), b.node.Address(),
		&messages.NodeRef{NodeRid: md.GetNodeRid(), NodeGeneration: md.GetNodeGeneration(), Address: member.node.Address()})
	require.True(t, reply.GetSupported(), reply.GetReason())
	require.Len(t, reply.GetMoveTicket(), 16)

	// The member names itself as source and fence (the ticket is its own),
	// but the record's owner is a.
	prepare, chunks, cutover := forgedMove(t, key, md, before.Record, member.node.Address(), make([]byte, 24))
	prepare.MoveTicket = reply.GetMoveTicket()
	member.send(b.node.Address(), member.self, prepare)
	for _, ch := range chunks {
		member.send(b.node.Address(), member.self, ch)
	}
	member.send(b.node.Address(), member.self, cutover)
	failed := next[*messages.RelocationFailed](t, member)
	require.Equal(t, messages.FailureReason_FAILURE_REASON_STALE, failed.GetReason())

	// A ticket is single-use: the same one again is refused at once. (A
	// copy: the first prepare may still be in the sender's outgoing queue,
	// and a sent message is not the sender's to change.)
	again := proto.Clone(prepare).(*messages.RelocationPrepare)
	again.Identity.RelocationId = 7779
	member.send(b.node.Address(), member.self, again)
	refused := next[*messages.RelocationFailed](t, member)
	require.Equal(t, uint64(7779), refused.GetIdentity().GetRelocationId())
	testwait.For(t, func() bool { return !relocation.Arriving(b.driver, key) }, "a forged move is in progress on the target")

	after, err := c.store.Read(ctx, key)
	require.NoError(t, err)
	require.Equal(t, before.Version, after.Version, "the owner record is untouched")
	require.Equal(t, int64(1), get(t, a.node.System(), pid))

	// The refused move kept nothing the owner's own move needs: its
	// staging incarnation (named for the next owner generation) is gone
	// once the refusal is done, and the owner moves the object there.
	out, err := a.driver.Relocate(ctx, key, c.rid(1))
	require.NoError(t, err)
	require.Equal(t, c.rid(1), out.To)
	require.Equal(t, int64(1), get(t, a.node.System(), pid))
}

// Newest prepare wins: two Restore requests of one object never share its
// temporary queue on the target. A newer one (another RelocationId) ends
// an older one still restoring with an explicit failure, which its source
// restores itself on; once the older is past relay-ready — irreversible —
// the newer is refused instead, and the older commits.
// Reference: docs/PROTOCOL.md §5.7, §12.1 (two prewarm prepares never coexist).
func TestNewestPrepareWins(t *testing.T) {
	c := startNodes(t, 1)
	ctx := context.Background()
	b := c.nodes[0]
	owner := newPeer(t, c.store) // the object's owner, speaking by hand
	od := owner.node.Descriptor()
	key := location.Key(location.KindActor, "newest")
	rec := &location.Record{ObjectGeneration: 1, AuthorityOwnerGeneration: 1, StableType: "counter",
		State:      messages.LifecycleState_LIFECYCLE_STATE_READY,
		Owner:      &messages.Owner{Mesh: od.GetMesh(), NodeRid: od.GetNodeRid(), NodeGeneration: od.GetNodeGeneration(), LeaseId: od.GetLeaseId()},
		Membership: &messages.Membership{SpotId: od.GetEntrySpotId(), SpotGeneration: 1}}
	_, err := c.store.Apply(ctx, []location.Op{location.CreateOp(key, rec)})
	require.NoError(t, err)
	src := &messages.NodeRef{NodeRid: od.GetNodeRid(), NodeGeneration: od.GetNodeGeneration(), Address: owner.node.Address()}
	state := make([]byte, 24)
	state[7] = 5 // count 5
	attempt := func(rid, ownerGeneration uint64) (*messages.RelocationPrepare, []*messages.RelocationState, *messages.Cutover) {
		reply := askCapability(t, owner.node.System(), b.node.Address(), src)
		require.True(t, reply.GetSupported(), reply.GetReason())
		p, chunks, cut := forgedMoveID(t, rid, key, od, rec, owner.node.Address(), state)
		p.MoveTicket, p.NewOwnerGeneration = reply.GetMoveTicket(), ownerGeneration
		return p, chunks, cut
	}
	to := b.node.Address()

	first, _, _ := attempt(7001, 2) // its chunks never come: it stays restoring
	// ... until long after this test: only the newer prepare can end it.
	first.RestoreDeadlineUnixMillis = time.Now().Add(time.Hour).UnixMilli()
	owner.send(to, owner.self, first)
	testwait.For(t, func() bool { return relocation.Arriving(b.driver, key) }, "the first prepare is not in progress")

	second, chunks, cutover := attempt(7002, 3)
	owner.send(to, owner.self, second)
	failed := next[*messages.RelocationFailed](t, owner)
	require.Equal(t, uint64(7001), failed.GetIdentity().GetRelocationId(), "the older prepare ends")
	for _, ch := range chunks {
		owner.send(to, owner.self, ch)
	}
	ready := next[*messages.RelayReady](t, owner)
	require.Equal(t, uint64(7002), ready.GetIdentity().GetRelocationId())

	third, _, _ := attempt(7003, 4)
	owner.send(to, owner.self, third)
	refused := next[*messages.RelocationFailed](t, owner)
	require.Equal(t, uint64(7003), refused.GetIdentity().GetRelocationId(), "past relay-ready the older one stays")

	owner.send(to, owner.self, cutover)
	testwait.For(t, func() bool {
		v, err := c.store.Read(ctx, key)
		return err == nil && v.Record.GetRelocationId() == 7002 && v.Record.GetOwner().GetNodeRid() == c.rid(0)
	}, "the second move did not commit")
	pid, err := b.driver.Resolve(ctx, key)
	require.NoError(t, err)
	require.Equal(t, int64(5), get(t, b.node.System(), pid), "the winning move's state")
}

// A capability query may ask for tickets for the moves coming after its
// own: a node without a capacity gives them (at most 16 in all), each
// admitting one Restore request of the asking node only; a node with a
// capacity answers each move by its load then, so it gives one.
// Reference: docs/PROTOCOL.md §5.2.
func TestSpareTicketsAdmitOneMoveEachOfTheAskingNodeOnly(t *testing.T) {
	store := newStore(t)
	ask := func(target *meshnode.Node, asker *peer, want uint32) *messages.CapabilityReply {
		return askTickets(t, target, asker, want, nil)
	}
	b := startNodeConfig(t, store, relocation.Config{Logger: testLogger()}, counterKind)
	member := newPeer(t, store)
	reply := ask(b.node, member, 40)
	require.True(t, reply.GetSupported(), reply.GetReason())
	all := append([][]byte{reply.GetMoveTicket()}, reply.GetSpareMoveTickets()...)
	require.Len(t, all, 16, "at most 16 tickets in one answer")
	seen := map[string]bool{}
	for _, tk := range all {
		require.Len(t, tk, 16)
		require.False(t, seen[string(tk)], "tickets are distinct")
		seen[string(tk)] = true
	}
	require.Empty(t, ask(b.node, member, 0).GetSpareMoveTickets(), "no spares unless asked")

	// A spare ticket admits its holder's Restore request once: a forged
	// one of a key the member does not own passes admission and is judged
	// by the record (stale), and the same ticket again is refused at once.
	owner := startNodeConfig(t, store, relocation.Config{Logger: testLogger()}, counterKind)
	key := location.Key(location.KindActor, "spare")
	_, err := owner.driver.Spawn(context.Background(), "counter", key.ID)
	require.NoError(t, err)
	rec, err := store.Read(context.Background(), key)
	require.NoError(t, err)
	for i, want := range []messages.FailureReason{messages.FailureReason_FAILURE_REASON_STALE, messages.FailureReason_FAILURE_REASON_STALE} {
		p, _, _ := forgedMoveID(t, uint64(9100+i), key, member.node.Descriptor(), rec.Record, member.node.Address(), make([]byte, 24))
		p.MoveTicket = all[3]
		member.send(b.node.Address(), member.self, p)
		failed := next[*messages.RelocationFailed](t, member)
		require.Equal(t, uint64(9100+i), failed.GetIdentity().GetRelocationId())
		require.Equal(t, want, failed.GetReason())
		if i == 1 {
			require.Contains(t, failed.GetDetail(), "no valid move ticket", "the spare was used once")
		} else {
			require.NotContains(t, failed.GetDetail(), "ticket", "the spare admitted the request; the record refused it")
		}
	}

	// A source holds at most 128 spare tickets on a target (they never
	// displace a ticket); spares it gives back make room again, and only
	// its own can be given back.
	flooder := newPeer(t, store)
	var spares [][]byte
	for i := 0; i < 20; i++ {
		r := ask(b.node, flooder, 16)
		require.NotEmpty(t, r.GetMoveTicket())
		spares = append(spares, r.GetSpareMoveTickets()...)
	}
	require.Len(t, spares, 128)
	require.Empty(t, ask(b.node, flooder, 16).GetSpareMoveTickets(), "the source holds 128 spares here")
	giveBack := func(asker *peer, tickets [][]byte) *messages.CapabilityReply {
		return askTickets(t, b.node, asker, 16, tickets)
	}
	giveBack(member, spares[:15]) // another node cannot give back the flooder's tickets
	require.Empty(t, ask(b.node, flooder, 16).GetSpareMoveTickets(), "still full")
	require.Len(t, giveBack(flooder, spares[:15]).GetSpareMoveTickets(), 15, "given back, the room is used again")

	bounded := startBoundedNode(t, store, 10, counterKind)
	reply = ask(bounded.node, member, 40)
	require.True(t, reply.GetSupported(), reply.GetReason())
	require.NotEmpty(t, reply.GetMoveTicket())
	require.Empty(t, reply.GetSpareMoveTickets(), "a node with a capacity answers one move at a time")
}

// A ticket given before its target began draining admits no move in: the
// Restore request is refused node_draining (the typed error a drain and
// Relocate's caller match), and the object serves on at its owner.
// Reference: docs/PROTOCOL.md §5.2.
func TestATicketFromBeforeADrainAdmitsNothing(t *testing.T) {
	c := startNodes(t, 2)
	ctx := context.Background()
	a, b := c.nodes[0], c.nodes[1]
	key := location.Key(location.KindActor, "late")
	pid, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	a.node.System().Root.Send(pid, wrapperspb.Int64(1))
	require.Equal(t, int64(1), get(t, a.node.System(), pid))

	owner := newPeer(t, c.store)
	od := owner.node.Descriptor()
	reply := askCapability(t, owner.node.System(), b.node.Address(),
		&messages.NodeRef{NodeRid: od.GetNodeRid(), NodeGeneration: od.GetNodeGeneration(), Address: owner.node.Address()})
	require.True(t, reply.GetSupported(), reply.GetReason())
	require.NoError(t, b.node.SetDraining(ctx))

	rec, err := c.store.Read(ctx, key)
	require.NoError(t, err)
	prepare, _, _ := forgedMove(t, key, od, rec.Record, owner.node.Address(), make([]byte, 24))
	prepare.MoveTicket = reply.GetMoveTicket()
	owner.send(b.node.Address(), owner.self, prepare)
	failed := next[*messages.RelocationFailed](t, owner)
	require.Equal(t, messages.FailureReason_FAILURE_REASON_NODE_DRAINING, failed.GetReason())

	_, err = a.driver.Relocate(ctx, key, c.rid(1))
	require.ErrorIs(t, err, roamerr.ErrNodeDraining)
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	require.Equal(t, int64(1), get(t, a.node.System(), pid), "the object serves on at its owner")
}

// askTickets sends asker's capability query for a counter move to target,
// asking for want tickets and giving back returned, and returns the answer.
func askTickets(t *testing.T, target *meshnode.Node, asker *peer, want uint32, returned [][]byte) *messages.CapabilityReply {
	t.Helper()
	d := asker.node.Descriptor()
	res, err := asker.node.System().Root.RequestFuture(relocation.PID(target.Address()), &messages.CapabilityQuery{
		Kind: location.KindActor, StableType: "counter", WantTickets: want, ReturnedTickets: returned,
		Source: &messages.NodeRef{NodeRid: d.GetNodeRid(), NodeGeneration: d.GetNodeGeneration(), Address: asker.node.Address()}},
		testwait.Patience(t)).Result()
	require.NoError(t, err)
	return res.(*messages.CapabilityReply)
}

// startBoundedNode starts a node of the given capacity hosting kinds.
func startBoundedNode(t *testing.T, store location.Store, capacity uint32, kinds ...relocation.Kind) *testNode {
	t.Helper()
	return startMeshNode(t, meshnode.Config{Store: store, Logger: testLogger(), Capacity: capacity}, relocation.Config{Logger: testLogger()}, kinds...)
}

// The source check before the seal (PROTOCOL.md §5.2) answers only a
// ticket's holder, from the address the ticket was issued to, and backs
// only the owner: a member of the mesh that asks about an object it does
// not own hears Stale; one that asks without a ticket, in another's
// name, or a second time with one ticket, hears nothing; and the check
// uses no ticket up.
func TestSourceCheckAnswersOnlyATicketHolderAndBacksOnlyTheOwner(t *testing.T) {
	c := startNodes(t, 2)
	ctx := context.Background()
	a, b := c.nodes[0], c.nodes[1]
	key := location.Key(location.KindActor, "checked")
	_, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	rec, err := c.store.Read(ctx, key)
	require.NoError(t, err)

	member := newPeer(t, c.store)
	md := member.node.Descriptor()
	self := &messages.NodeRef{NodeRid: md.GetNodeRid(), NodeGeneration: md.GetNodeGeneration(), Address: member.node.Address()}
	reply := askCapability(t, member.node.System(), b.node.Address(), self)
	require.True(t, reply.GetSourceCheck(), "the target offers the check")
	prepare, _, _ := forgedMove(t, key, md, rec.Record, member.node.Address(), make([]byte, 24))
	check := &messages.SourceCheck{Identity: prepare.GetIdentity(), Object: prepare.GetObject(), Source: self,
		MoveTicket: reply.GetMoveTicket(), RestoreDeadlineUnixMillis: prepare.GetRestoreDeadlineUnixMillis()}

	// No ticket, or the ticket in the name of another address: unanswered.
	forged := proto.Clone(check).(*messages.SourceCheck)
	forged.MoveTicket = make([]byte, 16)
	forged.Identity.RelocationId = 7801
	member.send(b.node.Address(), member.self, forged)
	elsewhere := proto.Clone(check).(*messages.SourceCheck)
	elsewhere.Identity.RelocationId = 7802
	elsewhere.Source = &messages.NodeRef{NodeRid: md.GetNodeRid(), NodeGeneration: md.GetNodeGeneration(), Address: a.node.Address()}
	member.send(b.node.Address(), actor.NewPID(a.node.Address(), relocation.DriverName), elsewhere)

	// The holder asks about an object it does not own: Stale, and that is
	// the first answer to come back (the forged checks went first on the
	// same connection).
	member.send(b.node.Address(), member.self, check)
	got := next[*messages.SourceCheckReply](t, member)
	require.Equal(t, prepare.GetIdentity().GetRelocationId(), got.GetIdentity().GetRelocationId())
	require.Equal(t, roamerr.CodeStale, got.GetCode(), got.GetDetail())

	// One check per ticket: a second is refused unanswered (each reads
	// the store). The ticket is still good for the Restore request,
	// refused Stale by the target's own read, not for want of a ticket —
	// and that answer is the next thing to come back.
	again := proto.Clone(check).(*messages.SourceCheck)
	again.Identity.RelocationId = 7803
	member.send(b.node.Address(), member.self, again)
	prepare.MoveTicket = reply.GetMoveTicket()
	member.send(b.node.Address(), member.self, prepare)
	got2 := testwait.Recv(t, member.got, "the answer to the Restore request")
	failed, ok := got2.(*messages.RelocationFailed)
	require.True(t, ok, "a second check with one ticket was answered: %v", got2)
	require.Equal(t, messages.FailureReason_FAILURE_REASON_STALE, failed.GetReason(), failed.GetDetail())

	after, err := c.store.Read(ctx, key)
	require.NoError(t, err)
	require.Equal(t, rec.Version, after.Version, "the owner record is untouched")
}
