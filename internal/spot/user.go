package spot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/internal/ask"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// SpotRef is a snapshot of a Spot's location at lookup time
// (docs/PROTOCOL.md §7.1). It is not a messaging target: call by SpotID,
// and Find again to learn where the Spot is now.
type SpotRef struct {
	SpotID           string
	ObjectGeneration uint64
	MeshName         string
	NodeRid          string
	Kind             messages.SpotKind
	StableType       string
}

func refFrom(r *messages.SpotRef) SpotRef {
	return SpotRef{SpotID: r.GetSpotId(), ObjectGeneration: r.GetObjectGeneration(), MeshName: r.GetMesh(),
		NodeRid: r.GetNodeRid(), Kind: r.GetSpotKind(), StableType: r.GetStableType()}
}

func (r SpotRef) wire() *messages.SpotRef {
	return &messages.SpotRef{SpotId: r.SpotID, ObjectGeneration: r.ObjectGeneration, Mesh: r.MeshName,
		NodeRid: r.NodeRid, SpotKind: r.Kind, StableType: r.StableType}
}

// CreateState is how a Create or GetOrCreate ended (PROTOCOL.md §7.2).
type CreateState int

const (
	// Existing: a Ready incarnation of the same stable type was used; the
	// create callback did not run and there is no reply.
	Existing CreateState = iota + 1
	// Created: a new incarnation was committed Ready.
	Created
	// Rejected: the create callback declined; the reservation was cleaned
	// up. Ref names the declined attempt.
	Rejected
)

func (s CreateState) String() string {
	switch s {
	case Existing:
		return "Existing"
	case Created:
		return "Created"
	case Rejected:
		return "Rejected"
	}
	return fmt.Sprintf("CreateState(%d)", int(s))
}

// CreateResult is the terminal result of a Create or GetOrCreate.
type CreateResult struct {
	State CreateState
	Ref   SpotRef
	// Reply is what the create callback returned (Created, Rejected), if
	// anything.
	Reply proto.Message
}

// Creator is implemented by a User Spot's actor that takes a creation
// request. OnCreate runs on the actor's goroutine after the factory and
// before the Spot is Ready; it may run again for the same input if a
// target fails half-way, so it must tolerate re-execution (PROTOCOL.md §7.2).
// An error wrapping ErrRejected declines the creation (Rejected, with the
// reply); any other error fails it.
type Creator interface {
	OnCreate(request proto.Message) (reply proto.Message, err error)
}

// ErrRejected is what a Creator returns (wrapped or not) to decline.
var ErrRejected = errors.New("spot: creation rejected")

// MaxCreateRequestBytes bounds an encoded creation request (PROTOCOL.md §7.2).
const MaxCreateRequestBytes = 1 << 20

// CreateCall is a Create or GetOrCreate, built fluently and submitted once.
type CreateCall struct {
	builder
	m          *Manager
	spotID     string // "" for Create: the framework issues it
	stableType string
	request    proto.Message
}

// Create creates a User Spot of stableType under a new lowercase UUID v4
// Spot ID (PROTOCOL.md §7.2).
func (m *Manager) Create(stableType string) *CreateCall {
	return &CreateCall{m: m, stableType: stableType}
}

// GetOrCreate returns the Ready User Spot spotID of stableType (Existing),
// or creates it (Created / Rejected). Concurrent callers converge on one
// reservation and one factory run (PROTOCOL.md §7.2).
func (m *Manager) GetOrCreate(spotID, stableType string) *CreateCall {
	return &CreateCall{m: m, spotID: spotID, stableType: stableType}
}

// InMesh names the Mesh the Spot is first placed on.
func (c *CreateCall) InMesh(mesh string) *CreateCall {
	c.inMesh(mesh)
	return c
}

// Request is the creation request handed to the create callback (at most
// 1 MiB encoded).
func (c *CreateCall) Request(req proto.Message) *CreateCall {
	if c.once("Request") {
		c.request = req
	}
	return c
}

// Timeout sets the one deadline over resolve, reservation, factory and
// Ready. Default Config.DefaultTimeout.
func (c *CreateCall) Timeout(d time.Duration) *CreateCall {
	c.withTimeout(d)
	return c
}

// Do submits the call.
func (c *CreateCall) Do(ctx context.Context) (CreateResult, error) {
	if err := c.submit("create"); err != nil {
		return CreateResult{}, err
	}
	if err := c.m.d.Usable(); err != nil {
		return CreateResult{}, err
	}
	create := c.spotID == ""
	if create {
		newIDCalls.Add(1)
		c.spotID = newID()
	} else if err := ValidateID(c.spotID); err != nil {
		return CreateResult{}, err
	}
	if err := ValidateStableType(c.stableType); err != nil {
		return CreateResult{}, err
	}
	var content []byte
	if c.request != nil {
		var err error
		if content, err = deterministic.Marshal(c.request); err != nil {
			return CreateResult{}, fmt.Errorf("%w: creation request: %w", roamerr.ErrInvalidOperation, err)
		}
		if len(content) > MaxCreateRequestBytes {
			return CreateResult{}, fmt.Errorf("%w: creation request is %d bytes, over %d", roamerr.ErrInvalidOperation, len(content), MaxCreateRequestBytes)
		}
	}
	ctx, cancel := c.m.deadlineCtx(ctx, c.timeout)
	defer cancel()
	op := uuid.NewString()
	skip := map[string]bool{} // targets that answered CapacityExceeded or NodeDraining
	for {
		if err := ctx.Err(); err != nil {
			return CreateResult{}, fmt.Errorf("%w: Spot %q is neither Ready nor Missing: %w", roamerr.ErrDeadlineExceeded, c.spotID, err)
		}
		res, err := c.attempt(ctx, op, create, content, skip)
		if !errors.Is(err, errRetry) {
			return res, err
		}
	}
}

func (c *CreateCall) attempt(ctx context.Context, op string, create bool, content []byte, skip map[string]bool) (CreateResult, error) {
	m := c.m
	auth, err := m.readAuthority(ctx, c.spotID)
	if err != nil {
		return CreateResult{}, err
	}
	rec := auth.v.Record
	if auth.v.Present() {
		if create {
			// A taken UUID is terminal: no second UUID (PROTOCOL.md §7.2).
			return CreateResult{}, fmt.Errorf("%w: Spot %q", roamerr.ErrAlreadyExists, c.spotID)
		}
		if auth.v.Key.Kind != location.KindUserSpot || rec.GetStableType() != c.stableType {
			return CreateResult{}, fmt.Errorf("%w: Spot %q is a %s of stable type %q", roamerr.ErrTypeMismatch, c.spotID, rec.GetSpotKind(), rec.GetStableType())
		}
		switch {
		case auth.ready() && !auth.ended:
			return CreateResult{State: Existing, Ref: refFrom(auth.ref())}, nil
		case m.abandoned(rec):
			// Its operation gave up long ago (a lost UserSpotCreate): release
			// it with its fence in the reserving transaction below.
		case !auth.ended:
			// Another operation's attempt is in progress: wait for Ready
			// or Missing, never start a second reservation (PROTOCOL.md §7.2).
			if err := m.watch(ctx, auth.v.Key, auth.v.Version); err != nil {
				return CreateResult{}, err
			}
			return CreateResult{}, errRetry
		}
		// The owner ended: its record is released in the same transaction
		// that reserves anew, unless members remain (PROTOCOL.md §7.10).
		if auth.ready() && rec.GetMemberCount() > 0 {
			return CreateResult{}, m.endedOwnerError(c.spotID, rec, "while Actors are members")
		}
		if auth.ready() && rec.GetPreservesState() {
			// Its in-memory state ended with the owner: a new, empty
			// incarnation answered Created would lose it without a word
			// (docs/FAULTS.md, End states).
			return CreateResult{}, m.endedOwnerError(c.spotID, rec, "with its in-memory state")
		}
	}
	mesh, nodes, err := m.selectMesh(ctx, c.mesh)
	if err != nil {
		return CreateResult{}, err
	}
	var target *location.NodeDescriptor
	hosted := false
	for _, n := range candidates(nodes, c.stableType, false, "") {
		hosted = true
		if !skip[n.Node.GetNodeRid()] {
			target = n.Node
			break
		}
	}
	switch {
	case target == nil && hosted:
		return CreateResult{}, fmt.Errorf("%w: every node hosting %q is full", roamerr.ErrCapacityExceeded, c.stableType)
	case target == nil:
		return CreateResult{}, fmt.Errorf("%w: no serving node of mesh %q hosts User Spot type %q", roamerr.ErrNotFound, mesh, c.stableType)
	}
	key := location.Key(location.KindUserSpot, c.spotID)
	dl, _ := ctx.Deadline()
	intent := &messages.CreationIntent{OperationId: op, DeadlineUnixNanos: dl.UnixNano()}
	if c.request != nil {
		ref, err := m.roots.PutRoot(ctx, "create-"+op, content)
		if err != nil {
			return CreateResult{}, storeError("store the creation request", err)
		}
		intent.ContentRef, intent.ContentHash, intent.Size = ref.Key, ref.SHA256[:], ref.Size
		intent.RequestType = string(c.request.ProtoReflect().Descriptor().FullName())
	}
	reserved := &location.Record{
		ObjectGeneration:         m.newGeneration(rec.GetObjectGeneration()),
		AuthorityOwnerGeneration: 1,
		State:                    messages.LifecycleState_LIFECYCLE_STATE_CREATING,
		Owner:                    location.OwnerOf(target),
		StableType:               c.stableType,
		SpotKind:                 messages.SpotKind_SPOT_KIND_USER,
		CreationIntent:           intent,
	}
	intent.ReservationFence = reserved.ObjectGeneration
	// The reservation takes a pending capacity slot of the target in the
	// same transaction (PROTOCOL.md §7.12): the fence's
	// PendingCapacityDelta.
	version, err := m.reserve(ctx, key, auth.v.Version, reserved, location.KindInstanceSpot, func(r *location.Record) bool {
		return r.GetCreationIntent().GetOperationId() == op
	}, rec, target.GetCapacity())
	if err != nil {
		m.deleteRoot(intent.GetContentRef())
		if errors.Is(err, roamerr.ErrCapacityExceeded) {
			// The target's capacity slots are all held (PROTOCOL.md
			// §7.12): as for a full node's refusal, try the next one.
			skip[target.GetNodeRid()] = true
			return CreateResult{}, errRetry
		}
		if create && errors.Is(err, errRetry) {
			return CreateResult{}, fmt.Errorf("%w: Spot %q", roamerr.ErrAlreadyExists, c.spotID)
		}
		return CreateResult{}, err
	}
	// A replaced reservation's creation request is nobody's now.
	m.deleteRoot(rec.GetCreationIntent().GetContentRef())
	cmd := &messages.UserSpotCreate{
		OperationId: op, SourceNodeRid: m.desc.GetNodeRid(), SourceNodeGeneration: m.desc.GetNodeGeneration(),
		SpotId: c.spotID, StableType: c.stableType, DeadlineUnixNanos: dl.UnixNano(),
		Fence: &messages.ReservationFence{
			StoreVersion: uint64(version), ObjectGeneration: reserved.ObjectGeneration, AuthorityOwnerGeneration: 1,
			TargetNodeRid: target.GetNodeRid(), TargetNodeGeneration: target.GetNodeGeneration(),
			TargetLeaseId: target.GetLeaseId(), PendingCapacityDelta: 1,
		},
	}
	reply, err := m.command(ctx, target.GetAddress(), op, cmd, func() *messages.SpotReply { return m.onCreate(cmd) })
	m.met.operation("create", replyOutcome(reply, err))
	if err != nil {
		return CreateResult{}, err
	}
	if reply.GetFailureCode() != "" {
		ferr := roamerr.FromCode(reply.GetFailureCode(), reply.GetFailureDetail())
		if errors.Is(ferr, roamerr.ErrCapacityExceeded) || errors.Is(ferr, roamerr.ErrNodeDraining) {
			// A full target aborts the reservation itself; one that refused
			// the command before running it (its in-flight limit) did not:
			// the next attempt must not find this one's reservation.
			m.abortReservation(key, version, reserved)
			skip[target.GetNodeRid()] = true
			return CreateResult{}, errRetry
		}
		return CreateResult{}, ferr
	}
	out := CreateResult{State: CreateState(reply.GetResult() - messages.CreateResult_CREATE_RESULT_UNSPECIFIED), Ref: refFrom(reply.GetRef())}
	if reply.GetReply() != nil {
		r, err := relocation.FromWire(reply.GetReply())
		if err != nil {
			return CreateResult{}, err
		}
		out.Reply, _ = r.(proto.Message)
	}
	return out, nil
}

// command sends a Spot command (UserSpotCreate, UserSpotClose) to the
// service at address and waits for its SpotReply within ctx; to this node
// it runs local.
func (m *Manager) command(ctx context.Context, address, op string, cmd proto.Message, local func() *messages.SpotReply) (*messages.SpotReply, error) {
	if address == m.desc.GetAddress() {
		return m.once(op, local), nil
	}
	dl, _ := ctx.Deadline()
	// The target confirms the operation with this node before it runs it
	// (CommandConfirm): it is pending while this call waits.
	m.pendingOps.Store(op, struct{}{})
	defer m.pendingOps.Delete(op)
	res, err := ask.Ask(ctx, m.sys, servicePID(address), cmd, machine.Until(m.clock, dl), ask.Question{Clock: m.clock, From: address, What: "Spot command", Accept: func(msg any) bool {
		r, ok := msg.(*messages.SpotReply)
		return ok && r.GetOperationId() == op
	}})
	switch {
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return nil, fmt.Errorf("%w: no command 20 from %s: %w", roamerr.ErrDeadlineExceeded, address, err)
	case errors.Is(err, actor.ErrTimeout):
		return nil, fmt.Errorf("%w: no command 20 from %s", roamerr.ErrDeadlineExceeded, address)
	case err != nil:
		return nil, fmt.Errorf("%w: %s: %w", roamerr.ErrUnavailable, address, err)
	}
	reply, ok := res.(*messages.SpotReply)
	if !ok {
		return nil, fmt.Errorf("%w: %s answered %T", roamerr.ErrUnavailable, address, res)
	}
	return reply, nil
}

// onCreate is the target of UserSpotCreate (PROTOCOL.md §7.2): it checks the
// reservation fence against the store, reads the creation request from the
// Relocation Store and checks its hash, runs the factory and the create
// callback with the Spot staged, and commits Ready — or, on Rejected or a
// failure, releases the reservation with the same fence.
func (m *Manager) onCreate(cmd *messages.UserSpotCreate) *messages.SpotReply {
	ctx, cancel := m.wireDeadlineCtx(cmd.GetDeadlineUnixNanos())
	defer cancel()
	f := cmd.GetFence()
	if f.GetTargetNodeRid() != m.desc.GetNodeRid() || f.GetTargetNodeGeneration() != m.desc.GetNodeGeneration() {
		return failure(fmt.Errorf("%w: command 47 for node %s reached another node", roamerr.ErrStale, f.GetTargetNodeRid()))
	}
	if f.GetPendingCapacityDelta() != 1 {
		// One creation holds one slot (PROTOCOL.md §7.12).
		return failure(fmt.Errorf("%w: command 47 reserves %d capacity, a creation holds 1", roamerr.ErrInvalidOperation, f.GetPendingCapacityDelta()))
	}
	key := location.Key(location.KindUserSpot, cmd.GetSpotId())
	late := ctx.Err() != nil
	readCtx := ctx
	if late {
		var cancelRead context.CancelFunc
		readCtx, cancelRead = machine.WithTimeout(context.Background(), m.clock, m.cfg.DefaultTimeout)
		defer cancelRead()
	}
	v, err := m.store.Read(readCtx, key)
	if err != nil {
		return failure(storeError("read the reservation", err))
	}
	rec := v.Record
	_, holdsSlot := relocation.RecordSlot(rec)
	if uint64(v.Version) != f.GetStoreVersion() || rec.GetState() != messages.LifecycleState_LIFECYCLE_STATE_CREATING ||
		m.d.Slots().Bounded() && !holdsSlot ||
		rec.GetObjectGeneration() != f.GetObjectGeneration() || !sameOwner(rec.GetOwner(), m.owner()) ||
		rec.GetCreationIntent().GetOperationId() != cmd.GetOperationId() {
		return failure(fmt.Errorf("%w: the reservation of Spot %q changed", roamerr.ErrStale, cmd.GetSpotId()))
	}
	intent := rec.GetCreationIntent()
	if late {
		// Nobody waits for this create any more: release its reservation
		// with the same fence instead of creating.
		m.abortReservation(key, v.Version, rec)
		return failure(fmt.Errorf("%w: command 47 for Spot %q arrived after its deadline", roamerr.ErrDeadlineExceeded, cmd.GetSpotId()))
	}
	abort := func(err error) *messages.SpotReply {
		m.abortReservation(key, v.Version, rec)
		return failure(err)
	}
	if _, ok := m.d.Kind(rec.GetStableType()); !ok {
		return abort(fmt.Errorf("%w: User Spot type %q is not registered on node %s", roamerr.ErrNotFound, rec.GetStableType(), m.desc.GetNodeRid()))
	}
	release, err := m.admitCapacity(ctx)
	if err != nil {
		return abort(err)
	}
	defer release() // once open, the incarnation counts as serving
	request, err := m.creationRequest(ctx, intent)
	if err != nil {
		return abort(err)
	}
	staged, err := m.d.Stage(ctx, key, rec.GetStableType(), rec.GetObjectGeneration(), rec.GetAuthorityOwnerGeneration())
	if err != nil {
		return abort(err)
	}
	// The callback's result comes back on its own channel: if the deadline
	// ends the wait, the callback may still be running and its reply is
	// never read.
	type created struct {
		reply proto.Message
		err   error
	}
	result := make(chan created, 1)
	if err := staged.Do(ctx, func(a actor.Actor) error {
		var r created
		if c, ok := a.(Creator); ok {
			r.reply, r.err = c.OnCreate(request)
		}
		result <- r
		return nil
	}); err != nil {
		staged.Discard()
		return abort(err)
	}
	cb := <-result
	reply, err := cb.reply, cb.err
	ready := proto.Clone(rec).(*location.Record)
	ready.State = messages.LifecycleState_LIFECYCLE_STATE_READY
	ready.CreationIntent = nil
	if k, ok := m.d.Kind(rec.GetStableType()); ok {
		ready.PreservesState = relocation.PreservesState(k.Policy)
	}
	out := &messages.SpotReply{Ref: authority{v: location.Versioned{Key: key, Record: ready}}.ref()}
	if reply != nil {
		var werr error
		if out.Reply, werr = relocation.ToWire(cmd.GetSpotId(), reply); werr != nil {
			staged.Discard()
			return abort(werr)
		}
	}
	switch {
	case errors.Is(err, ErrRejected):
		staged.Discard()
		m.abortReservation(key, v.Version, rec)
		out.Result = messages.CreateResult_CREATE_RESULT_REJECTED
		return out
	case err != nil:
		staged.Discard()
		return abort(roamerr.Wrap(roamerr.ErrInvalidOperation, fmt.Sprintf("create callback of Spot %q", cmd.GetSpotId()), err))
	}
	if _, err := m.commit(ctx, key, v.Version, ready); err != nil {
		staged.Discard()
		if errors.Is(err, errRetry) {
			return failure(fmt.Errorf("%w: the reservation of Spot %q changed before Ready", roamerr.ErrStale, cmd.GetSpotId()))
		}
		return abort(err)
	}
	if err := staged.Open(ctx, nil, "", nil); err != nil {
		return failure(err)
	}
	m.deleteRoot(intent.GetContentRef())
	out.Result = messages.CreateResult_CREATE_RESULT_CREATED
	m.log.Info().Str("event", "spot_created").Str("spot_id", key.ID).Uint64("object_generation", ready.GetObjectGeneration()).
		Str("operation_id", cmd.GetOperationId()).Str("stable_type", ready.GetStableType()).Msg("User Spot created")
	return out
}

// creationRequest reads the creation request from the Relocation Store
// and checks it is the content the intent recorded (PROTOCOL.md §7.2).
func (m *Manager) creationRequest(ctx context.Context, intent *messages.CreationIntent) (proto.Message, error) {
	if intent.GetContentRef() == "" {
		return nil, nil
	}
	data, ref, err := m.roots.GetRoot(ctx, intent.GetContentRef())
	if err != nil {
		return nil, storeError("read the creation request", err)
	}
	if !bytes.Equal(ref.SHA256[:], intent.GetContentHash()) || ref.Size != intent.GetSize() {
		return nil, fmt.Errorf("%w: the creation request changed since its reservation", roamerr.ErrConflict)
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(intent.GetRequestType()))
	if err != nil {
		return nil, fmt.Errorf("%w: creation request type %q is not linked here", roamerr.ErrTypeMismatch, intent.GetRequestType())
	}
	msg := mt.New().Interface()
	if err := proto.Unmarshal(data, msg); err != nil {
		return nil, fmt.Errorf("%w: creation request: %w", roamerr.ErrTypeMismatch, err)
	}
	return msg, nil
}

// Find returns the SpotRef of the Spot's current Ready authority; it never
// creates (PROTOCOL.md §7.3). NotFound when there is none.
func (m *Manager) Find(ctx context.Context, spotID string) (SpotRef, error) {
	if err := m.d.Usable(); err != nil {
		return SpotRef{}, err
	}
	if err := ValidateID(spotID); err != nil {
		return SpotRef{}, err
	}
	auth, err := m.readAuthority(ctx, spotID)
	if err != nil {
		return SpotRef{}, err
	}
	if !auth.ready() {
		return SpotRef{}, fmt.Errorf("%w: Spot %q has no Ready authority", roamerr.ErrNotFound, spotID)
	}
	return refFrom(auth.ref()), nil
}

// QueryPage is one page of Query.
type QueryPage struct {
	Refs []SpotRef
	// Next is the cursor of the following page; "" on the last.
	Next string
}

// Query lists the Ready Spots of one kind (User or Instance), a bounded
// page at a time: size 1..1000, at most 4 MiB (PROTOCOL.md §7.3).
func (m *Manager) Query(ctx context.Context, kind messages.SpotKind, size int, after string) (QueryPage, error) {
	if err := m.d.Usable(); err != nil {
		return QueryPage{}, err
	}
	var k location.Kind
	switch kind {
	case messages.SpotKind_SPOT_KIND_USER:
		k = location.KindUserSpot
	case messages.SpotKind_SPOT_KIND_INSTANCE:
		k = location.KindInstanceSpot
	default:
		return QueryPage{}, fmt.Errorf("%w: query User or Instance Spots", roamerr.ErrInvalidOperation)
	}
	page, err := m.store.List(ctx, k, location.PageRequest{Size: size, After: after})
	if err != nil {
		return QueryPage{}, storeError("query", err)
	}
	out := QueryPage{Next: page.Next}
	for _, v := range page.Items {
		a := authority{v: v}
		if a.ready() {
			out.Refs = append(out.Refs, refFrom(a.ref()))
		}
	}
	return out, nil
}

// Close closes the User Spot incarnation ref names (PROTOCOL.md §7.9): false
// when that incarnation no longer exists or Actors are still members,
// InvalidOperation when another generation of the ID exists, Unavailable
// while it moves or its owner is gone. It never closes another
// incarnation than ref's.
func (m *Manager) Close(ctx context.Context, ref SpotRef, timeout ...time.Duration) (bool, error) {
	if err := m.d.Usable(); err != nil {
		return false, err
	}
	if err := ValidateID(ref.SpotID); err != nil {
		return false, err
	}
	var to time.Duration
	if len(timeout) > 0 {
		to = timeout[0]
	}
	ctx, cancel := m.deadlineCtx(ctx, to)
	defer cancel()
	key := location.Key(location.KindUserSpot, ref.SpotID)
	v, err := m.store.Read(ctx, key)
	if errors.Is(err, location.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, storeError("read "+key.String(), err)
	}
	rec := v.Record
	if rec.GetObjectGeneration() != ref.ObjectGeneration {
		return false, fmt.Errorf("%w: Spot %q is not at generation %d, which the ref names", roamerr.ErrInvalidOperation, ref.SpotID, ref.ObjectGeneration)
	}
	if rec.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY {
		return false, fmt.Errorf("%w: Spot %q is %s", roamerr.ErrUnavailable, ref.SpotID, rec.GetState())
	}
	addr, alive, err := m.ownerAddress(ctx, rec.GetOwner())
	if err != nil {
		return false, err
	}
	if !alive {
		return false, fmt.Errorf("%w: the owner of Spot %q has ended; ReleaseEnded accepts the loss", roamerr.ErrUnavailable, ref.SpotID)
	}
	dl, _ := ctx.Deadline()
	op := uuid.NewString()
	cmd := &messages.UserSpotClose{
		OperationId: op, SourceNodeRid: m.desc.GetNodeRid(), SourceNodeGeneration: m.desc.GetNodeGeneration(),
		Ref: ref.wire(), TargetNodeRid: rec.GetOwner().GetNodeRid(), TargetNodeGeneration: rec.GetOwner().GetNodeGeneration(),
		ExpectedOwnerGeneration: rec.GetAuthorityOwnerGeneration(), ExpectedStoreVersion: uint64(v.Version),
		DeadlineUnixNanos: dl.UnixNano(),
	}
	reply, err := m.command(ctx, addr, op, cmd, func() *messages.SpotReply { return m.onClose(cmd) })
	m.met.operation("close", replyOutcome(reply, err))
	if err != nil {
		return false, err
	}
	if reply.GetFailureCode() != "" {
		return false, roamerr.FromCode(reply.GetFailureCode(), reply.GetFailureDetail())
	}
	if reply.GetClosed() {
		m.cache.drop(ref.SpotID)
	}
	return reply.GetClosed(), nil
}

// onClose is the owner side of UserSpotClose (PROTOCOL.md §7.9): it reads the
// authority from the store and checks generation, owner generation,
// StoreVersion, membership and moving state together, then writes
// Closing, seals and closes the local incarnation, and releases the
// authority with the same fence.
func (m *Manager) onClose(cmd *messages.UserSpotClose) *messages.SpotReply {
	ctx, cancel := m.wireDeadlineCtx(cmd.GetDeadlineUnixNanos())
	defer cancel()
	if cmd.GetTargetNodeRid() != m.desc.GetNodeRid() || cmd.GetTargetNodeGeneration() != m.desc.GetNodeGeneration() {
		return failure(fmt.Errorf("%w: command 48 for node %s reached another node", roamerr.ErrUnavailable, cmd.GetTargetNodeRid()))
	}
	ref := cmd.GetRef()
	key := location.Key(location.KindUserSpot, ref.GetSpotId())
	unlock := m.lockKey(key.ID)
	defer unlock()
	v, err := m.store.Read(ctx, key)
	if errors.Is(err, location.ErrNotFound) {
		return &messages.SpotReply{Closed: false}
	}
	if err != nil {
		return failure(storeError("read "+key.String(), err))
	}
	rec := v.Record
	switch {
	case rec.GetObjectGeneration() != ref.GetObjectGeneration():
		return failure(fmt.Errorf("%w: Spot %q is not at generation %d, which the ref names", roamerr.ErrInvalidOperation, key.ID, ref.GetObjectGeneration()))
	case !sameOwner(rec.GetOwner(), m.owner()):
		return failure(fmt.Errorf("%w: node %s no longer owns Spot %q", roamerr.ErrUnavailable, m.desc.GetNodeRid(), key.ID))
	case rec.GetAuthorityOwnerGeneration() != cmd.GetExpectedOwnerGeneration() || uint64(v.Version) != cmd.GetExpectedStoreVersion():
		return failure(fmt.Errorf("%w: Spot %q changed since it was read", roamerr.ErrStale, key.ID))
	case rec.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY:
		return failure(fmt.Errorf("%w: Spot %q is %s", roamerr.ErrUnavailable, key.ID, rec.GetState()))
	}
	if li, ok, err := m.d.Local(ctx, key); err != nil || !ok || li.Generation != rec.GetObjectGeneration() {
		return failure(fmt.Errorf("%w: Spot %q is moving", roamerr.ErrUnavailable, key.ID))
	}
	if rec.GetMemberCount() > 0 {
		// Members keep the Spot: Close never moves or ends them
		// (PROTOCOL.md §7.9). The count is read with the version the
		// Closing write names, so a join meanwhile makes that write fail.
		return &messages.SpotReply{Closed: false}
	}
	closing := proto.Clone(rec).(*location.Record)
	closing.State = messages.LifecycleState_LIFECYCLE_STATE_CLOSING
	cv, err := m.commit(ctx, key, v.Version, closing)
	if errors.Is(err, errRetry) {
		return failure(fmt.Errorf("%w: Spot %q changed since it was read", roamerr.ErrStale, key.ID))
	}
	if err != nil {
		return failure(err)
	}
	if err := m.closeAndRelease(key, rec.GetObjectGeneration(), cv, rec); err != nil {
		return failure(err)
	}
	m.log.Info().Str("event", "spot_closed").Str("spot_id", key.ID).Uint64("object_generation", rec.GetObjectGeneration()).Msg("User Spot closed")
	return &messages.SpotReply{Closed: true}
}

// SpawnMember creates a relocatable Actor of stableType on this node as a
// member of the User Spot incarnation ref names. The membership is written
// only while that Spot is Ready with ref's generation under a live owner,
// checked in the same transaction; otherwise Stale (PROTOCOL.md §7.10).
func (m *Manager) SpawnMember(ctx context.Context, ref SpotRef, stableType, actorID string) (*actor.PID, error) {
	if err := m.d.Usable(); err != nil {
		return nil, err
	}
	if err := ValidateID(ref.SpotID); err != nil {
		return nil, err
	}
	key := location.Key(location.KindUserSpot, ref.SpotID)
	v, err := m.store.Read(ctx, key)
	if errors.Is(err, location.ErrNotFound) {
		return nil, fmt.Errorf("%w: User Spot %q is gone", roamerr.ErrStale, ref.SpotID)
	}
	if err != nil {
		return nil, storeError("read "+key.String(), err)
	}
	rec := v.Record
	if rec.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY || rec.GetObjectGeneration() != ref.ObjectGeneration {
		return nil, fmt.Errorf("%w: User Spot %q is not Ready at generation %d, which the ref names", roamerr.ErrStale, ref.SpotID, ref.ObjectGeneration)
	}
	switch _, alive, err := m.ownerAddress(ctx, rec.GetOwner()); {
	case errors.Is(err, roamerr.ErrOwnerEnding):
		// Its lease ended moments ago: that incarnation is over all the
		// same, though others take it over only later.
		return nil, fmt.Errorf("%w: the owner of User Spot %q has ended: %v", roamerr.ErrStale, ref.SpotID, err)
	case err != nil:
		return nil, err
	case !alive:
		return nil, fmt.Errorf("%w: the owner of User Spot %q has ended", roamerr.ErrStale, ref.SpotID)
	}
	return m.d.SpawnMember(ctx, stableType, actorID, &messages.Membership{SpotId: ref.SpotID, SpotGeneration: ref.ObjectGeneration}, v)
}

// replyOutcome names a command's ending for the operations metric.
func replyOutcome(reply *messages.SpotReply, err error) string {
	switch {
	case err != nil:
		return outcomeOf(err)
	case reply.GetFailureCode() != "":
		return reply.GetFailureCode()
	case reply.GetResult() == messages.CreateResult_CREATE_RESULT_CREATED:
		return "created"
	case reply.GetResult() == messages.CreateResult_CREATE_RESULT_REJECTED:
		return "rejected"
	case reply.GetClosed():
		return "closed"
	}
	return "ok"
}

// abandoned reports whether a User Spot reservation outlived its creating
// operation's deadline by activation.AbandonGrace.
func (m *Manager) abandoned(rec *location.Record) bool {
	return activation.AbandonedCreation(rec, m.clock.Now())
}

// endedOwnerError is the Unavailable a call to an ended owner's User Spot
// gets while it is not served: by its kind's policy, a live node recovers
// it by itself (RecoverEnded) — soon, so trying again helps — or it waits
// for an operator's ReleaseEnded.
func (m *Manager) endedOwnerError(spotID string, rec *location.Record, how string) error {
	switch m.kindOf(rec.GetStableType()).EndedPolicy() {
	case activation.EndedFromCheckpoint, activation.EndedEmpty:
		return fmt.Errorf("%w: the owner of User Spot %q ended %s; a live node recovers it, try again shortly", roamerr.ErrUnavailable, spotID, how)
	}
	return fmt.Errorf("%w: the owner of User Spot %q ended %s; it waits for an operator: ReleaseEnded accepts the loss", roamerr.ErrUnavailable, spotID, how)
}
