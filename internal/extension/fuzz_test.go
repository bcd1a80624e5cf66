package extension_test

import (
	"context"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
)

// controlTypes are every message roam's actors take from a peer.
var controlTypes = []func() proto.Message{
	func() proto.Message { return &messages.CapabilityQuery{} },
	func() proto.Message { return &messages.CapabilityReply{} },
	func() proto.Message { return &messages.RelocationPrepare{} },
	func() proto.Message { return &messages.RelocationState{} },
	func() proto.Message { return &messages.RelocationStateCredit{} },
	func() proto.Message { return &messages.RelayReady{} },
	func() proto.Message { return &messages.RelocationFailed{} },
	func() proto.Message { return &messages.RelayedRecord{} },
	func() proto.Message { return &messages.BoundaryAck{} },
	func() proto.Message { return &messages.OwnerCommitted{} },
	func() proto.Message { return &messages.Cutover{} },
	func() proto.Message { return &messages.RelocationAbort{} },
	func() proto.Message { return &messages.DeliveryFailed{} },
	func() proto.Message { return &messages.SpotActivation{} },
	func() proto.Message { return &messages.UserSpotCreate{} },
	func() proto.Message { return &messages.UserSpotClose{} },
	func() proto.Message { return &messages.SpotReply{} },
	func() proto.Message { return &messages.RouteHint{} },
	func() proto.Message { return &messages.RouteBarrier{} },
	func() proto.Message { return &messages.GrainActivate{} },
	func() proto.Message { return &messages.TimerTick{} },
	func() proto.Message { return &messages.SourceCheck{} },
	func() proto.Message { return &messages.SourceCheckReply{} },
}

// Any control message, decoded from any bytes and delivered to the
// relocation driver, the Spot service or a serving incarnation as the
// remote reader delivers it, leaves the node alive and its object
// serving: no panic in a handler's goroutine ends the process, and no
// actor is left stuck.
func FuzzControlMessages(f *testing.F) {
	ctx := context.Background()
	e, err := extension.Start(ctx, extension.Config{Node: meshnode.Config{Store: memstore.New()}})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = e.Stop(ctx) })
	if err := e.RegisterKind(extension.Kind{StableType: "greeter", Producer: func() actor.Actor { return &greeter{} },
		Policy: extension.PreserveStateWith(greeterState{})}); err != nil {
		f.Fatal(err)
	}
	pid, err := e.SpawnActor(ctx, "greeter", "g")
	if err != nil {
		f.Fatal(err)
	}
	for i, mk := range controlTypes {
		b, _ := proto.Marshal(mk())
		f.Add(uint8(i), uint8(0), b)
	}
	act, _ := relocation.ToWire("s", wrapperspb.String("x"))
	b, _ := proto.Marshal(&messages.SpotActivation{OperationId: "op", RouteKind: 2, SpotId: "s", StableType: "greeter", First: act,
		DeadlineUnixNanos: time.Now().Add(time.Hour).UnixNano()})
	f.Add(uint8(12), uint8(1), b)
	targets := []*actor.PID{
		relocation.PID(e.Node().Address()),
		actor.NewPID(e.Node().Address(), spot.ServiceName),
		pid,
	}
	sender := actor.NewPID("127.0.0.1:1", "fuzz")
	f.Fuzz(func(t *testing.T, kind, target uint8, b []byte) {
		msg := controlTypes[int(kind)%len(controlTypes)]()
		if proto.Unmarshal(b, msg) != nil {
			return
		}
		e.System().Root.RequestWithCustomSender(targets[int(target)%len(targets)], msg, sender)
		res, err := e.System().Root.RequestFuture(pid, wrapperspb.String("alive?"), 10*time.Second).Result()
		if err != nil {
			t.Fatalf("the object stopped answering after a %T: %v", msg, err)
		}
		if _, ok := res.(*wrapperspb.Int64Value); !ok {
			t.Fatalf("the object answered %T after a %T", res, msg)
		}
	})
}
