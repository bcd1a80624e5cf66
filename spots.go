package roam

import (
	"context"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Spots is the node's API of Spots by ID (Roam.Spots): calls by Spot ID
// that follow a Spot wherever it moves, and the lifecycle of User Spots.
// Every method takes per-call options, as Proto.Actor's cluster.Request
// does; before Start and after Stop every method answers
// roamerr.ErrInvalidOperation.
type Spots struct{ r *Roam }

// A CallOption sets one thing about one call by Spot ID. An option the
// call does not take is refused with roamerr.ErrInvalidOperation, and so is
// an option given twice.
type CallOption func(*callOptions)

type callOptions struct {
	set      map[string]bool
	err      error
	timeout  time.Duration
	mesh     string
	instance *string
	from     actor.Context
	request  proto.Message
}

func (o *callOptions) once(name string) bool {
	if o.set == nil {
		o.set = map[string]bool{}
	}
	if o.set[name] {
		o.err = fmt.Errorf("%w: option %s given twice", roamerr.ErrInvalidOperation, name)
		return false
	}
	o.set[name] = true
	return true
}

// Timeout bounds the call: resolve, activation or creation, delivery and
// reply (ctx may end it sooner). It must be positive. Default 5 s
// (SpotConfig.DefaultTimeout).
func Timeout(d time.Duration) CallOption {
	return func(o *callOptions) {
		if o.once("Timeout") {
			if d <= 0 {
				o.err = fmt.Errorf("%w: Timeout must be positive, got %s", roamerr.ErrInvalidOperation, d)
			}
			o.timeout = d
		}
	}
}

// InMesh names the mesh a Spot that does not exist yet is first placed
// on (a Missing Instance Spot's activation, a Create). It does not move or
// restrict a Spot that exists. Default: this node's mesh.
func InMesh(mesh string) CallOption {
	return func(o *callOptions) {
		if o.once("InMesh") {
			o.mesh = mesh
		}
	}
}

// InstanceSpot lets a Request or Send to a Missing Spot activate it as an
// Instance Spot of the kind stableType (a grain), or of the mesh's only
// Instance kind when stableType is "". Without it a call reaches only a
// Spot that exists, and NotFound otherwise.
func InstanceSpot(stableType string) CallOption {
	return func(o *callOptions) {
		if o.once("InstanceSpot") {
			o.instance = &stableType
		}
	}
}

// From names the relocatable object whose turn makes the call (its actor
// context), so placement's co-location can count who talks to whom
// (docs/PLACEMENT.md). Nothing else about the call changes.
func From(c actor.Context) CallOption {
	return func(o *callOptions) {
		if o.once("From") {
			if c == nil {
				o.err = fmt.Errorf("%w: From(nil)", roamerr.ErrInvalidOperation)
			}
			o.from = c
		}
	}
}

// CreateRequest is the creation request a Create or GetOrCreate hands to
// the User Spot's create callback (at most 1 MiB encoded).
func CreateRequest(req proto.Message) CallOption {
	return func(o *callOptions) {
		if o.once("CreateRequest") {
			if req == nil {
				o.err = fmt.Errorf("%w: CreateRequest(nil)", roamerr.ErrInvalidOperation)
			}
			o.request = req
		}
	}
}

// callOpts applies opts for the call what, refusing the options it does
// not take.
func callOpts(what string, opts []CallOption, takes ...string) (callOptions, error) {
	var o callOptions
	for _, opt := range opts {
		if opt == nil {
			return o, fmt.Errorf("%w: %s: nil CallOption", roamerr.ErrInvalidOperation, what)
		}
		opt(&o)
	}
	if o.err != nil {
		return o, fmt.Errorf("%s: %w", what, o.err)
	}
	for name := range o.set {
		ok := false
		for _, t := range takes {
			ok = ok || t == name
		}
		if !ok {
			return o, fmt.Errorf("%w: %s does not take the option %s", roamerr.ErrInvalidOperation, what, name)
		}
	}
	return o, nil
}

func (s *Spots) manager() (*spot.Manager, error) {
	ext, err := s.r.started()
	if err != nil {
		return nil, err
	}
	return ext.Spots(), nil
}

// Request sends msg to the Spot spotID, wherever it is, and returns its
// reply. A reply roam gave in place of the Spot (it is gone, unavailable,
// or moved past the follow window) comes back as the error, typed. Options:
// Timeout, InstanceSpot, InMesh, From.
func (s *Spots) Request(ctx context.Context, spotID string, msg proto.Message, opts ...CallOption) (proto.Message, error) {
	return s.call(ctx, "Request", spotID, msg, opts, true)
}

// Send sends msg to the Spot spotID one way; it returns once the message
// is handed to the transport. A send that activates the Spot returns once
// the new incarnation dispatches it, or with the activation's typed
// failure, so the caller's next call cannot overtake it. Options: Timeout,
// InstanceSpot, InMesh, From.
func (s *Spots) Send(ctx context.Context, spotID string, msg proto.Message, opts ...CallOption) error {
	_, err := s.call(ctx, "Send", spotID, msg, opts, false)
	return err
}

func (s *Spots) call(ctx context.Context, what, spotID string, msg proto.Message, opts []CallOption, request bool) (proto.Message, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: %s: nil context", roamerr.ErrInvalidOperation, what)
	}
	if msg == nil {
		return nil, fmt.Errorf("%w: %s: nil message", roamerr.ErrInvalidOperation, what)
	}
	o, err := callOpts(what, opts, "Timeout", "InstanceSpot", "InMesh", "From")
	if err != nil {
		return nil, err
	}
	m, err := s.manager()
	if err != nil {
		return nil, err
	}
	var c *spot.Call
	if request {
		c = m.Request(spotID, msg)
	} else {
		c = m.Send(spotID, msg)
	}
	if o.timeout > 0 {
		c.Timeout(o.timeout)
	}
	if o.mesh != "" || o.set["InMesh"] {
		c.InMesh(o.mesh)
	}
	if o.instance != nil {
		if *o.instance == "" {
			c.InstanceSpot()
		} else {
			c.InstanceSpot(*o.instance)
		}
	}
	if o.from != nil {
		c.From(o.from)
	}
	return c.Do(ctx)
}

// Create creates a User Spot of the kind stableType under a new ID and
// runs its create callback. Options: Timeout, InMesh, CreateRequest.
func (s *Spots) Create(ctx context.Context, stableType string, opts ...CallOption) (CreateResult, error) {
	return s.create(ctx, "Create", "", stableType, opts)
}

// GetOrCreate returns the Ready User Spot spotID of the kind stableType
// (Existing), or creates it (Created, Rejected). Concurrent callers
// converge on one creation. Options: Timeout, InMesh, CreateRequest.
func (s *Spots) GetOrCreate(ctx context.Context, spotID, stableType string, opts ...CallOption) (CreateResult, error) {
	if spotID == "" {
		return CreateResult{}, fmt.Errorf("%w: GetOrCreate: empty Spot ID (Create makes one)", roamerr.ErrInvalidOperation)
	}
	return s.create(ctx, "GetOrCreate", spotID, stableType, opts)
}

func (s *Spots) create(ctx context.Context, what, spotID, stableType string, opts []CallOption) (CreateResult, error) {
	if ctx == nil {
		return CreateResult{}, fmt.Errorf("%w: %s: nil context", roamerr.ErrInvalidOperation, what)
	}
	o, err := callOpts(what, opts, "Timeout", "InMesh", "CreateRequest")
	if err != nil {
		return CreateResult{}, err
	}
	m, err := s.manager()
	if err != nil {
		return CreateResult{}, err
	}
	var c *spot.CreateCall
	if spotID == "" {
		c = m.Create(stableType)
	} else {
		c = m.GetOrCreate(spotID, stableType)
	}
	if o.timeout > 0 {
		c.Timeout(o.timeout)
	}
	if o.set["InMesh"] {
		c.InMesh(o.mesh)
	}
	if o.request != nil {
		c.Request(o.request)
	}
	res, err := c.Do(ctx)
	return createResult(res), err
}

// Find returns where the Ready Spot spotID is now. NotFound when it has no
// Ready incarnation.
func (s *Spots) Find(ctx context.Context, spotID string) (SpotRef, error) {
	if ctx == nil {
		return SpotRef{}, fmt.Errorf("%w: Find: nil context", roamerr.ErrInvalidOperation)
	}
	m, err := s.manager()
	if err != nil {
		return SpotRef{}, err
	}
	ref, err := m.Find(ctx, spotID)
	return SpotRef(ref), err
}

// Query lists the Spots of one kind (User or Instance) in pages of at most
// size, in ID order, after the cursor after ("" for the first page).
func (s *Spots) Query(ctx context.Context, kind SpotKind, size int, after string) (QueryPage, error) {
	if ctx == nil {
		return QueryPage{}, fmt.Errorf("%w: Query: nil context", roamerr.ErrInvalidOperation)
	}
	if size <= 0 {
		return QueryPage{}, fmt.Errorf("%w: Query: page size must be positive, got %d", roamerr.ErrInvalidOperation, size)
	}
	m, err := s.manager()
	if err != nil {
		return QueryPage{}, err
	}
	page, err := m.Query(ctx, messages.SpotKind(kind), size, after)
	out := QueryPage{Next: page.Next}
	for _, r := range page.Refs {
		out.Refs = append(out.Refs, SpotRef(r))
	}
	return out, err
}

// Close closes the User Spot incarnation ref names: its close callback
// runs and its record goes. False when it was closed already. Options:
// Timeout.
func (s *Spots) Close(ctx context.Context, ref SpotRef, opts ...CallOption) (bool, error) {
	if ctx == nil {
		return false, fmt.Errorf("%w: Close: nil context", roamerr.ErrInvalidOperation)
	}
	o, err := callOpts("Close", opts, "Timeout")
	if err != nil {
		return false, err
	}
	m, err := s.manager()
	if err != nil {
		return false, err
	}
	if o.timeout > 0 {
		return m.Close(ctx, spot.SpotRef(ref), o.timeout)
	}
	return m.Close(ctx, spot.SpotRef(ref))
}

// SpawnMember spawns the relocatable Actor actorID of the kind stableType
// as a member of the User Spot incarnation ref names, on this node. A
// SpotWide Spot's members are spawned on its own node.
func (s *Spots) SpawnMember(ctx context.Context, ref SpotRef, stableType, actorID string) (*actor.PID, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: SpawnMember: nil context", roamerr.ErrInvalidOperation)
	}
	m, err := s.manager()
	if err != nil {
		return nil, err
	}
	return m.SpawnMember(ctx, spot.SpotRef(ref), stableType, actorID)
}

// ReleaseEnded accepts that the Spot spotID's owner ended and its state is
// lost, so that it can be created or activated again (Roam.ReleaseEnded).
func (s *Spots) ReleaseEnded(ctx context.Context, spotID string) (bool, error) {
	if ctx == nil {
		return false, fmt.Errorf("%w: ReleaseEnded: nil context", roamerr.ErrInvalidOperation)
	}
	m, err := s.manager()
	if err != nil {
		return false, err
	}
	return m.ReleaseEnded(ctx, spotID)
}
