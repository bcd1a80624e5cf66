package main

import (
	"context"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location/memstore"
)

// browser finds Chromium (ROAM_CHROMIUM, else chromium on the PATH). Without
// it the test is skipped, unless ROAM_REQUIRE_BROWSER is set (make test
// installs Chromium and sets it, so there it cannot pass by skipping).
func browser(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("ROAM_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("ROAM_REQUIRE_BROWSER") != "" {
		t.Fatal("no Chromium found (install Debian's chromium, or set ROAM_CHROMIUM)")
	}
	t.Skip("no Chromium found: install Debian's chromium (make test does) or set ROAM_CHROMIUM")
	return ""
}

// The web view in headless Chromium against three real nodes: it lists
// the nodes with their load, names the director, and a move shows up in
// its list of moves (from → to, pause) without reloading the page.
func TestWebViewInABrowser(t *testing.T) {
	exe := browser(t)
	ctx := context.Background()
	store := memstore.New()
	a := startNode(t, store, "node-a")
	startNode(t, store, "node-b")
	startNode(t, store, "node-c")
	_, err := a.SpawnActor(ctx, "counter", "web-1")
	require.NoError(t, err)

	c := newCtl(store, store, nil)
	srv := httptest.NewServer(c.webHandler())
	defer srv.Close()

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.Flag("headless", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(srv.URL)))

	// text is the text of the page's element sel now ("" while the page
	// has not drawn it).
	text := func(sel string) string {
		s, err := chromedp.Run(bctx, chromedp.Evaluate[string](`(document.querySelector(`+"`"+sel+"`"+`) || {}).textContent || ""`))
		if err != nil {
			return ""
		}
		return s
	}
	testwait.For(t, func() bool {
		nodes := text("#nodes tbody")
		return strings.Contains(nodes, "node-a") && strings.Contains(nodes, "node-b") && strings.Contains(nodes, "node-c")
	}, "the page lists the three nodes")
	require.Contains(t, text("#director tbody"), "default", "the director table has the mesh")

	_, err = a.Relocate(ctx, roam.ActorRef("web-1"), "node-b")
	require.NoError(t, err)
	testwait.For(t, func() bool { return strings.Contains(text("#moves"), "actor/web-1  node-a → node-b  pause") },
		"the move shows up in the page's list of moves")
	testwait.For(t, func() bool {
		rows, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("#pauses tbody tr").length`))
		return err == nil && rows == len(pauseBounds)+1
	}, "the pause histogram has its buckets")
}
