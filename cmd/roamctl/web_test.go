package main

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location/faulty"
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

// colored counts the pixels of a PNG that are clearly colored (not white,
// grey or black): the charts' data, the banner, never their axes or text.
func colored(t *testing.T, b []byte) int {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(b))
	require.NoError(t, err)
	n := 0
	bounds := img.Bounds()
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			hi, lo := max(r, g, bl)>>8, min(r, g, bl)>>8
			if hi-lo > 60 {
				n++
			}
		}
	}
	return n
}

// chartGeometry is what the page drew in its charts, as Chromium laid it
// out: bars of non-zero height, pause points, load lines of non-zero width.
type chartGeometry struct {
	Bars, P50, P99, LoadLines, LoadLegend int
}

const chartGeometryJS = `(() => {
  const count = (sel, ok) => [...document.querySelectorAll(sel)].filter(ok).length;
  return {
    Bars: count("#chart-moves rect.bar", e => e.getBBox().height > 0 && e.getBBox().width > 0),
    P50: count("#chart-pauses circle.p50", e => e.getBBox().width > 0),
    P99: count("#chart-pauses circle.p99", e => e.getBBox().width > 0),
    LoadLines: count("#chart-load polyline.load", e => e.getBBox().width > 0),
    LoadLegend: document.querySelectorAll("#legend-load span").length,
  };
})()`

// roamctl web against three real nodes, in headless Chromium, looked at as
// rendered: after moves, its charts (moves per second, pauses, load per
// node) are drawn and not blank; with the store cut off, a banner says so
// and the last state stays on screen, charts included; it goes once the
// store answers again.
func TestWebViewChartsAndAStoreOutageInABrowser(t *testing.T) {
	exe := browser(t)
	ctx := context.Background()
	store := memstore.New()
	a := startNode(t, store, "node-a")
	startNode(t, store, "node-b")
	startNode(t, store, "node-c")
	const actors = 6
	for i := range actors {
		_, err := a.SpawnActor(ctx, "counter", fmt.Sprintf("chart-%d", i))
		require.NoError(t, err)
	}

	// roamctl reads the nodes' store through a wrapper that can cut it
	// off; the nodes keep theirs.
	cut, err := faulty.New(store, faulty.Config{})
	require.NoError(t, err)
	errOut := &syncBuf{}
	c := newCtl(cut, cut, io.Discard)
	c.errOut, c.webTimeout = errOut, time.Second
	wctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- c.Web(wctx, "127.0.0.1:0") }()
	defer func() { cut.Partition(false); stop(); require.NoError(t, <-served) }()
	var url string
	testwait.For(t, func() bool {
		_, rest, ok := strings.Cut(errOut.String(), "the web view is at ")
		url, _, _ = strings.Cut(rest, "\n")
		return ok && strings.HasSuffix(rest, "\n")
	}, "roamctl web serves")

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.Flag("headless", true),
		chromedp.WindowSize(1280, 1200))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(url)))
	text := func(sel string) string {
		s, err := chromedp.Run(bctx, chromedp.Evaluate[string](`(document.querySelector(`+"`"+sel+"`"+`) || {}).textContent || ""`))
		if err != nil {
			return ""
		}
		return s
	}
	geometry := func() (chartGeometry, bool) {
		g, err := chromedp.Run(bctx, chromedp.Evaluate[chartGeometry](chartGeometryJS))
		return g, err == nil
	}
	shot := func(sel string) []byte {
		require.NoError(t, chromedp.Do(bctx, chromedp.ScrollIntoView(chromedp.CSS(sel))))
		b, err := chromedp.Run(bctx, chromedp.Screenshot(chromedp.CSS(sel)))
		require.NoError(t, err)
		if dir := os.Getenv("ROAM_WEB_SCREENSHOTS"); dir != "" {
			require.NoError(t, os.WriteFile(filepath.Join(dir, strings.TrimPrefix(sel, "#")+".png"), b, 0o644))
		}
		return b
	}
	testwait.For(t, func() bool {
		nodes := text("#nodes tbody")
		return strings.Contains(nodes, "node-a") && strings.Contains(nodes, "node-b") && strings.Contains(nodes, "node-c")
	}, "the page lists the three nodes")

	for i := range actors {
		_, err := a.Relocate(ctx, roam.ActorRef(fmt.Sprintf("chart-%d", i)), []string{"node-b", "node-c"}[i%2])
		require.NoError(t, err)
	}
	var g chartGeometry
	testwait.For(t, func() bool {
		var ok bool
		g, ok = geometry()
		return ok && g.Bars > 0 && g.P50 > 0 && g.P99 > 0 && g.LoadLines == 3 && g.LoadLegend == 3 &&
			strings.Count(text("#moves"), "pause") == actors
	}, "the charts draw the moves, their pauses and the three nodes' load")
	t.Logf("charts: %+v", g)
	for _, sel := range []string{"#chart-moves", "#chart-pauses", "#chart-load"} {
		require.Greater(t, colored(t, shot(sel)), 20, "%s is drawn, not blank", sel)
	}
	banner := func() bool {
		shown, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`!document.getElementById("banner").hidden`))
		return err == nil && shown
	}
	require.False(t, banner(), "no banner while the store answers")

	cut.Partition(true)
	testwait.For(t, func() bool {
		return banner() && strings.Contains(text("#banner"), "The Location Store does not answer")
	},
		"the banner says the store does not answer")
	t.Logf("banner: %s", text("#banner"))
	require.Contains(t, text("#banner"), "showing the last state read")
	require.Greater(t, colored(t, shot("#banner")), 1000, "the banner is shown, in colour")
	nodes := text("#nodes tbody")
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		require.Contains(t, nodes, n, "the last state stays on screen")
	}
	require.Equal(t, actors, strings.Count(text("#moves"), "pause"))
	still, ok := geometry()
	require.True(t, ok)
	require.Equal(t, g.LoadLines, still.LoadLines)
	require.Positive(t, still.Bars)
	for _, sel := range []string{"#chart-moves", "#chart-pauses", "#chart-load"} {
		require.Greater(t, colored(t, shot(sel)), 20, "%s still drawn while the store is cut off", sel)
	}

	if dir := os.Getenv("ROAM_WEB_SCREENSHOTS"); dir != "" {
		b, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "page.png"), b, 0o644))
	}

	cut.Partition(false)
	testwait.For(t, func() bool { return !banner() }, "the banner goes once the store answers")
}
