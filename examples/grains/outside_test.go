package grains_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// outsideMain is the rest of the program around the README's cluster
// section (startNode): a grain implementation in the manner of
// examples/grains, and calls a user makes through the generated client.
const outsideMain = `
type cart struct{ contents *shoppb.CartContents }

func newCart() shoppb.Cart { return &cart{contents: &shoppb.CartContents{Items: map[string]int32{}}} }

func (c *cart) Init(ctx cluster.GrainContext) {
	if err := roam.KeepState(ctx, c); err != nil {
		panic(err)
	}
}
func (c *cart) Terminate(cluster.GrainContext)      {}
func (c *cart) ReceiveDefault(cluster.GrainContext) {}
func (c *cart) Add(req *shoppb.AddItem, _ cluster.GrainContext) (*shoppb.CartContents, error) {
	c.contents.Items[req.GetSku()] += req.GetQuantity()
	return c.contents, nil
}
func (c *cart) Get(*shoppb.GetCart, cluster.GrainContext) (*shoppb.CartContents, error) { return c.contents, nil }
func (c *cart) CaptureState() ([]byte, error)                                        { return proto.Marshal(c.contents) }
func (c *cart) RestoreState(b []byte) error {
	c.contents = &shoppb.CartContents{}
	return proto.Unmarshal(b, c.contents)
}

func main() {
	ctx := context.Background()
	agent := test.NewInMemAgent()
	store := memstore.New()
	var members []*cluster.Cluster
	var nodes []*roam.Roam
	for range 2 {
		c, r, err := startNode(ctx, test.NewTestProvider(agent), store)
		if err != nil {
			panic(err)
		}
		defer c.Shutdown(true)
		defer r.Stop(ctx)
		members, nodes = append(members, c), append(nodes, r)
	}
	if _, err := shoppb.GetCartGrainClient(members[0], "alice").Add(&shoppb.AddItem{Sku: "tea", Quantity: 2}); err != nil {
		panic(err)
	}
	at, err := nodes[0].Spots().Find(ctx, roam.GrainID("Cart", "alice"))
	if err != nil {
		panic(err)
	}
	home, away := 0, 1
	if at.NodeRid == nodes[1].NodeRid() {
		home, away = 1, 0
	}
	huge := &shoppb.AddItem{Sku: strings.Repeat("x", 80<<20), Quantity: 1}
	_, err = shoppb.GetCartGrainClient(members[home], "alice").Add(huge)
	fmt.Println("oversize on its node:", errors.Is(err, roamerr.ErrCapacityExceeded))
	_, err = shoppb.GetCartGrainClient(members[away], "alice").Add(huge)
	fmt.Println("oversize from the other node:", errors.Is(err, roamerr.ErrCapacityExceeded))
	if _, err := nodes[home].Relocate(ctx, roam.GrainRef("Cart", "alice"), nodes[away].NodeRid()); err != nil {
		panic(err)
	}
	got, err := shoppb.GetCartGrainClient(members[home], "alice").Get(&shoppb.GetCart{})
	if err != nil {
		panic(err)
	}
	now, _ := nodes[0].Spots().Find(ctx, roam.GrainID("Cart", "alice"))
	fmt.Println("moved:", now.NodeRid == nodes[away].NodeRid(), "tea:", got.GetItems()["tea"])
}
`

// A module outside this repository, as a user writes it: the README's
// cluster section and examples/grains' generated grain, built against this
// checkout. Through the generated client a call over the size limit is
// ErrCapacityExceeded (on the grain's node and from another), the grain
// moves by kind and identity, and its state moves with it.
func TestOutsideModuleFromTheREADME(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a program")
	}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	blocks := regexp.MustCompile("(?s)```go cluster\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	require.Len(t, blocks, 1, "the README has one cluster section")

	dir := t.TempDir()
	src := `package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"google.golang.org/protobuf/proto"

	"example.com/shop/shoppb"
	"github.com/roamactors/roam"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

var _ = actor.NewActorSystem
var _ location.Store

` + blocks[0][1] + outsideMain
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "shoppb"), 0o755))
	for _, f := range []string{"shop.pb.go", "shop_grain.pb.go"} {
		b, err := os.ReadFile(filepath.Join("shoppb", f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "shoppb", f), b, 0o644))
	}
	// The repository's own requirements, so that the build needs nothing
	// the module cache does not hold already.
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	mod := strings.Replace(string(gomod), "module github.com/roamactors/roam", "module example.com/shop", 1) +
		"\nrequire github.com/roamactors/roam v0.0.0-00010101000000-000000000000\n\nreplace github.com/roamactors/roam => " + root + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod), 0o644))
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	run := exec.CommandContext(ctx, "go", "run", "-mod=mod", ".")
	run.Dir = dir
	out, err := run.CombinedOutput()
	require.NoError(t, err, "the outside module failed:\n%s\n--- main.go:\n%s", out, src)
	require.Contains(t, string(out), "oversize on its node: true")
	require.Contains(t, string(out), "oversize from the other node: true")
	require.Contains(t, string(out), "moved: true tea: 2")
}
