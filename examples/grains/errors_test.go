package grains_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/examples/grains"
	"github.com/roamactors/roam/examples/grains/shoppb"
	"github.com/roamactors/roam/internal/roamerrtest"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

// overLimit is more than a node accepts in one message (63 MiB).
const overLimit = 64 << 20

// startNodes starts n members sharing one store; they do not drain on
// Stop (the carts of these tests are large). Their leases last a minute:
// a 63 MiB message under the race detector on a busy machine can starve a
// node's renewals for longer than the default 10 s, and a node whose lease
// ended answers Unavailable, rightly, instead of the class these tests
// are about.
func startNodes(t *testing.T, n int) []*grains.Node {
	t.Helper()
	store := memstore.New()
	agent := test.NewInMemAgent()
	var nodes []*grains.Node
	for range n {
		node, err := grains.StartNode(context.Background(), test.NewTestProvider(agent), store, roam.WithDrainOnStop(false),
			roam.WithLeaseTTL(time.Minute))
		require.NoError(t, err)
		nodes = append(nodes, node)
	}
	t.Cleanup(func() {
		for _, node := range nodes {
			_ = node.Stop(context.Background())
		}
	})
	return nodes
}

// place activates a cart on the node at and returns its identity, so
// that calls from at are local and calls from the other nodes cross
// nodes. roam places a cold activation itself: place tries identities
// until one lands on at, rather than moving one there.
func place(t *testing.T, at *grains.Node, prefix string) string {
	t.Helper()
	for i := range 64 {
		id := fmt.Sprintf("%s-%d", prefix, i)
		_, err := shoppb.GetCartGrainClient(at.Cluster, id).Get(&shoppb.GetCart{}, patience(t))
		require.NoError(t, err)
		ref, err := at.Roam.Spots().Find(t.Context(), roam.GrainID(grains.CartKind, id))
		require.NoError(t, err)
		if ref.NodeRid == at.Roam.NodeRid() {
			return id
		}
	}
	t.Fatal("no cart was placed on the node in 64 tries")
	return ""
}

// patience bounds a call by the test's own deadline: an answer that
// only a timeout would give is not CapacityExceeded, and fails the test.
func patience(t *testing.T) cluster.GrainCallOption {
	return cluster.WithTimeout(testwait.Patience(t))
}

// A grain call over the size limit fails with CapacityExceeded through
// the generated client — and only that class — whether the grain is on
// another node or on the caller's own, answered at once rather than at
// the call's timeout. Before, across nodes the client got "unknown
// response type *messages.DeliveryFailed" once the message had been
// marshalled and copied several times, and on the caller's node the call
// ran.
func TestAGrainCallOverTheSizeLimitIsCapacityExceeded(t *testing.T) {
	nodes := startNodes(t, 2)
	a, b := nodes[0], nodes[1]
	id := place(t, b, "big")
	huge := &shoppb.AddItem{Sku: strings.Repeat("x", overLimit), Quantity: 1}
	for _, from := range []struct {
		name string
		node *grains.Node
	}{{"across nodes", a}, {"on the grain's node", b}} {
		t.Run(from.name, func(t *testing.T) {
			cart := shoppb.GetCartGrainClient(from.node.Cluster, id)
			_, err := cart.Add(huge, patience(t))
			roamerrtest.AssertOneClass(t, err, roamerr.ErrCapacityExceeded)
			for _, c := range roamerr.Classes() {
				if c != roamerr.ErrCapacityExceeded {
					require.False(t, errors.Is(err, c), "%v is not %v", err, c)
				}
			}
			require.False(t, errors.Is(err, roamerr.ErrOwnerEnding))

			// The cart did not run the call.
			got, err := cart.Get(&shoppb.GetCart{}, patience(t))
			require.NoError(t, err)
			require.Empty(t, got.GetItems())
		})
	}
}

// cluster.Request and cluster.RequestFuture, without a generated client,
// get the same typed answers: a grain request (cluster.GrainRequest) a
// *cluster.GrainErrorResponse, which is the error; any other request a
// *messages.DeliveryFailed, which roam.DeliveryError types.
func TestClusterRequestOverTheSizeLimitIsCapacityExceeded(t *testing.T) {
	nodes := startNodes(t, 2)
	a, b := nodes[0], nodes[1]
	id := place(t, b, "big")
	data, err := proto.Marshal(&shoppb.AddItem{Sku: strings.Repeat("x", overLimit), Quantity: 1})
	require.NoError(t, err)
	grainRequest := &cluster.GrainRequest{MethodIndex: 0, MessageData: data}
	plain := &shoppb.Greet{Name: strings.Repeat("x", overLimit)}
	// The ticker is a relocatable kind written by hand: it answers
	// plain messages, not grain requests.
	_, err = a.Cluster.Request("t-big", grains.TickerKind, &shoppb.Tick{}, patience(t))
	require.NoError(t, err)

	for _, from := range []*grains.Node{a, b} {
		res, err := from.Cluster.Request(id, grains.CartKind, grainRequest, patience(t))
		require.NoError(t, err)
		gerr, ok := res.(*cluster.GrainErrorResponse)
		require.True(t, ok, "got %T", res)
		roamerrtest.AssertOneClass(t, gerr, roamerr.ErrCapacityExceeded)
		roamerrtest.AssertOneClass(t, roam.DeliveryError(res), roamerr.ErrCapacityExceeded)

		f, err := from.Cluster.RequestFuture(id, grains.CartKind, grainRequest, patience(t))
		require.NoError(t, err)
		res, err = f.Result()
		require.NoError(t, err)
		roamerrtest.AssertOneClass(t, res.(error), roamerr.ErrCapacityExceeded)

		res, err = from.Cluster.Request("t-big", grains.TickerKind, plain, patience(t))
		require.NoError(t, err)
		roamerrtest.AssertOneClass(t, roam.DeliveryError(res), roamerr.ErrCapacityExceeded)
	}
}

// A reply over the size limit reaches the caller as CapacityExceeded,
// from a grain on another node and on the caller's own. Before, across
// nodes it was "unknown response type *messages.DeliveryFailed", and on
// the caller's node the reply went through.
func TestAGrainReplyOverTheSizeLimitIsCapacityExceeded(t *testing.T) {
	nodes := startNodes(t, 2)
	a, b := nodes[0], nodes[1]
	for i, from := range []*grains.Node{a, b} {
		id := place(t, b, []string{"remote-reply", "local-reply"}[i])
		cart := shoppb.GetCartGrainClient(from.Cluster, id)
		_, err := cart.Add(&shoppb.AddItem{Sku: "1" + strings.Repeat("y", 2<<10), Quantity: 1}, patience(t))
		require.NoError(t, err)
		// This Add is just under the limit; its reply, with both items,
		// just over it.
		_, err = cart.Add(&shoppb.AddItem{Sku: "2" + strings.Repeat("y", overLimit-(1<<20)-(1<<10)), Quantity: 1}, patience(t))
		roamerrtest.AssertOneClass(t, err, roamerr.ErrCapacityExceeded)
	}
}

// A grain call that roam cannot serve has roam's class through the
// generated client too: here no serving node hosts the kind (every node
// drains), so the cold activation is Unavailable. Before, Proto.Actor
// retried the lookup and gave "have reached max retries: 3".
func TestAGrainCallRoamCannotServeIsTyped(t *testing.T) {
	t.Parallel() // as TestGrainsMoveWithStateWhileAPlainKindAnswers
	nodes := startNodes(t, 1)
	a := nodes[0]
	_, err := a.Roam.Drain(t.Context(), roam.DrainOptions{})
	require.NoError(t, err)

	_, err = shoppb.GetCartGrainClient(a.Cluster, "nobody-serves").Add(&shoppb.AddItem{Sku: "tea", Quantity: 1}, patience(t))
	roamerrtest.AssertOneClass(t, err, roamerr.ErrUnavailable)
	require.False(t, errors.Is(err, roamerr.ErrCapacityExceeded))
	require.False(t, errors.Is(err, roamerr.ErrNotFound))

	res, err := a.Cluster.Request("nobody-serves", grains.TickerKind, &shoppb.Tick{}, patience(t))
	require.NoError(t, err)
	roamerrtest.AssertOneClass(t, roam.DeliveryError(res), roamerr.ErrUnavailable)
}
