package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/tracing"
	"github.com/chromedp/chromedp"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// TestWebPageReplay profiles the dashboard's page in Chromium against the
// hub alone (no etcd, no agents): the cache of webCache (2,048 nodes,
// 16,384 ranks, a curve of 3,000 steps) served by the dashboard's own
// handler, and changes applied to the cache one at a time, each rebuilt
// and sent: in the job's view, ten generations each a node smaller; in
// the pool's, eight bursts of eight nodes disconnecting. It logs each
// update as the page measured it (script: from its last bytes through
// the DOM; frame: the style, layout and paint of the frame that shows
// it), each part an update left for a later task as an update of its
// own, named; with GPUCOORD_WEB_PARTS=1 each update's parts (ms), and
// with GPUCOORD_WEB_TRACE=1 the page thread's time by trace event over
// the updates (Layout, Paint, Commit...) and its longest tasks. A profile in
// seconds where TestWebLoad takes minutes; it runs only with
// GPUCOORD_BENCH_WEB_PAGE=1 and fails only when it cannot measure.
func TestWebPageReplay(t *testing.T) {
	if os.Getenv("GPUCOORD_BENCH_WEB_PAGE") == "" {
		t.Skip("a profile: set GPUCOORD_BENCH_WEB_PAGE=1")
	}
	for _, view := range []string{"job", "pool"} {
		t.Run(view, func(t *testing.T) { webPageReplay(t, view) })
	}
}

func webPageReplay(t *testing.T, view string) {
	c, k := webCache(t, 2048)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	h := newWebHub(c, "c", func() bool { return true }, log)
	h.rebuild(time.Now())
	hist := h.jobs["j"]
	for s := 1; s <= 3000; s++ {
		hist.points = append(hist.points, webPoint{float64(s), 3 / (1 + float64(s)/50), 0.1 + 0.01*float64(s%7), 1})
	}
	hist.sent = len(hist.points)
	// Rank 0's step is the curve's last point: no generation's rebuild
	// appends one.
	rev := c.rev + 1
	c.apply(rev, []*clientv3.Event{{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: []byte(k.progress("j")),
		Value: []byte(encode(&pb.Step{Step: 3000, Loss: 3 / (1 + 3000.0/50), Seconds: 0.1 + 0.01*float64(3000%7), Generation: 1})), ModRevision: rev}}})
	h.rebuild(time.Now())
	srv := httptest.NewServer((&web{hub: h, log: log, cancelOpen: true}).handler())
	t.Cleanup(srv.Close)

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath("/usr/bin/chromium"), chromedp.NoSandbox,
		chromedp.WindowSize(1400, 1000), chromedp.Flag("hide-scrollbars", true), chromedp.Flag("force-device-scale-factor", "1"))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	eval := func(expr string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		return v
	}
	wait := func(expr string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			if v, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr)); err == nil && v {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the page does not show %s", expr)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	url, loaded := srv.URL+"/#/jobs/j", `!!document.querySelector('#grid canvas')`
	if view == "pool" {
		url, loaded = srv.URL+"/#/", `document.querySelectorAll('.node').length === 2048`
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	wait(loaded + ` && window.gpucoordStats.loadedMs !== null`)
	t.Logf("%s page loaded: %s ms", view, eval(`window.gpucoordStats.loadedMs.toFixed(0)`))

	trace := newPageTrace(t, ctx)
	put := func(key string, v proto.Message) *clientv3.Event {
		return &clientv3.Event{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: []byte(key), Value: []byte(encode(v)), ModRevision: rev}}
	}
	g, _ := c.generation("j")
	var rows []string
	// GPUCOORD_WEB_PARTS=1: each update's parts (ms) beside it.
	if os.Getenv("GPUCOORD_WEB_PARTS") != "" {
		eval(`window.showParts = true, ''`)
	}
	for i := 1; i <= 10; i++ {
		if i == 3 {
			trace.start() // the first two warm the page up
		}
		from := eval(`String(window.gpucoordStats.applies.length)`)
		rev++
		var shown string
		if view == "job" {
			next := proto.Clone(g).(*pb.Generation)
			next.Number, next.Members = g.Number+1, next.Members[:len(next.Members)-1]
			next.World, next.Dp = int32(8*len(next.Members)), int32(len(next.Members))
			c.apply(rev, []*clientv3.Event{put(k.generation("j"), next)})
			g, shown = next, fmt.Sprintf(`+document.querySelector('#grid').dataset.generation === %d`, next.Number)
		} else {
			var evs []*clientv3.Event
			for j := range 8 {
				evs = append(evs, &clientv3.Event{Type: clientv3.EventTypeDelete, Kv: &mvccpb.KeyValue{Key: []byte(k.conn(fmt.Sprintf("n%04d", 2047-8*i-j))), ModRevision: rev}})
			}
			c.apply(rev, evs)
			shown = fmt.Sprintf(`document.querySelectorAll('.node.disconnected').length === %d`, 8*i)
		}
		h.rebuild(time.Now())
		wait(shown)
		// The update and the parts it left for later (app.js's later),
		// each with its frame.
		wait(fmt.Sprintf(`window.gpucoordStats.idle() && window.gpucoordStats.applies.slice(%s).every(a => a.frame > 0)`, from))
		rows = append(rows, eval(fmt.Sprintf(`window.gpucoordStats.applies.slice(%s).map(a => a.script.toFixed(1) + ' + ' + a.frame.toFixed(1) + ' ms (' +
			(a.later ? a.later : a.bytes + ' bytes') + ')' + (window.showParts ? ' ' + JSON.stringify(a.parts) : '')).join(', ')`, from)))
	}
	t.Logf("%s view, each update's script + frame: %s", view, strings.Join(rows, "; "))
	trace.stop()
}

// pageTrace gathers the page thread's trace events (GPUCOORD_WEB_TRACE).
type pageTrace struct {
	t    *testing.T
	ctx  context.Context
	on   bool
	mu   sync.Mutex
	evs  [][]byte
	done chan struct{}
}

func newPageTrace(t *testing.T, ctx context.Context) *pageTrace {
	p := &pageTrace{t: t, ctx: ctx, on: os.Getenv("GPUCOORD_WEB_TRACE") != "", done: make(chan struct{})}
	return p
}

func (p *pageTrace) start() {
	if !p.on {
		return
	}
	chromedp.Listen(p.ctx, func(ev any) {
		switch e := ev.(type) {
		case *tracing.EventDataCollected:
			p.mu.Lock()
			for _, v := range e.Value {
				p.evs = append(p.evs, []byte(v))
			}
			p.mu.Unlock()
		case *tracing.EventTracingComplete:
			close(p.done)
		}
	})
	if _, err := chromedp.Call(p.ctx, tracing.Start, tracing.StartParams{TraceConfig: &tracing.TraceConfig{
		IncludedCategories: []string{"devtools.timeline", "disabled-by-default-devtools.timeline", "v8", "blink"}}}); err != nil {
		p.t.Fatal(err)
	}
}

// stop ends the trace and logs the page thread's time by event name.
func (p *pageTrace) stop() {
	if !p.on {
		return
	}
	if _, err := chromedp.Call(p.ctx, tracing.End, cdp.Empty{}); err != nil {
		p.t.Fatal(err)
	}
	<-p.done
	type event struct {
		Name string         `json:"name"`
		Ph   string         `json:"ph"`
		Dur  float64        `json:"dur"`
		Ts   float64        `json:"ts"`
		Tid  int64          `json:"tid"`
		Pid  int64          `json:"pid"`
		Args map[string]any `json:"args"`
	}
	var evs []event
	main := map[[2]int64]bool{}
	for _, b := range p.evs {
		var e event
		json.Unmarshal(b, &e)
		if e.Ph == "M" && e.Name == "thread_name" && e.Args["name"] == "CrRendererMain" {
			main[[2]int64{e.Pid, e.Tid}] = true
		}
		evs = append(evs, e)
	}
	total, count := map[string]float64{}, map[string]int{}
	for _, e := range evs {
		if e.Ph == "X" && main[[2]int64{e.Pid, e.Tid}] {
			total[e.Name] += e.Dur
			count[e.Name]++
		}
	}
	names := make([]string, 0, len(total))
	for n := range total {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return int(total[b] - total[a]) })
	var lines []string
	for _, n := range names[:min(25, len(names))] {
		lines = append(lines, fmt.Sprintf("%8.1f ms %5d  %s", total[n]/1000, count[n], n))
	}
	p.t.Logf("the page thread over the traced updates, by event (nested events overlap):\n%s", strings.Join(lines, "\n"))
	// The longest tasks, each with the longest events inside it.
	var tasks, inner []event
	for _, e := range evs {
		if e.Ph == "X" && main[[2]int64{e.Pid, e.Tid}] {
			if e.Name == "RunTask" {
				tasks = append(tasks, e)
			} else if e.Dur >= 500 {
				inner = append(inner, e)
			}
		}
	}
	slices.SortFunc(tasks, func(a, b event) int { return int(b.Dur - a.Dur) })
	lines = lines[:0]
	for _, task := range tasks[:min(8, len(tasks))] {
		var in []string
		for _, e := range inner {
			if e.Ts >= task.Ts && e.Ts+e.Dur <= task.Ts+task.Dur {
				in = append(in, fmt.Sprintf("%s %.1f", e.Name, e.Dur/1000))
			}
		}
		lines = append(lines, fmt.Sprintf("%6.1f ms: %s", task.Dur/1000, strings.Join(in[:min(14, len(in))], ", ")))
	}
	p.t.Logf("the longest tasks of the page thread, with the events of 0.5 ms or more inside each, outermost first:\n%s", strings.Join(lines, "\n"))
}
