package relocation

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/stretchr/testify/require"
)

type plainActor struct{ system *actor.ActorSystem }

func (*plainActor) Receive(actor.Context) {}

// roam reads the application's producer out of its Props (Proto.Actor has
// no accessor) to run its actor inside roam's host: this pins that the
// Proto.Actor version roam is built with keeps it where roam looks, for
// every way Props are made, a cluster kind's included.
func TestTheApplicationsProducerIsReadFromItsProps(t *testing.T) {
	system := actor.NewActorSystem()
	t.Cleanup(system.Shutdown)
	for name, props := range map[string]*actor.Props{
		"PropsFromProducer": actor.PropsFromProducer(func() actor.Actor { return &plainActor{} }),
		"PropsFromProducerWithActorSystem": actor.PropsFromProducerWithActorSystem(func(s *actor.ActorSystem) actor.Actor {
			return &plainActor{system: s}
		}),
		"cluster.NewKind": pcluster.NewKind("plain", actor.PropsFromProducer(func() actor.Actor { return &plainActor{} })).Props,
		"Clone":           actor.PropsFromProducer(func() actor.Actor { return &plainActor{} }).Clone(actor.WithReceiverMiddleware()),
	} {
		p := producerOf(props)
		require.NotNil(t, p, name)
		a, ok := p(system).(*plainActor)
		require.True(t, ok, "%s makes the application's actor", name)
		if name == "PropsFromProducerWithActorSystem" {
			require.Same(t, system, a.system, "with the actor system it is given")
		}
	}
	fromFunc := producerOf(actor.PropsFromFunc(func(actor.Context) {}))
	require.NotNil(t, fromFunc)
	_, ok := fromFunc(system).(actor.ReceiveFunc)
	require.True(t, ok, "PropsFromFunc")
}
