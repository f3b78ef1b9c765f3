package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/gpucoord/gpucoord/coordinator"
	"github.com/gpucoord/gpucoord/internal/e2e"
)

// chromium is Debian's Chromium, which scripts/deps.sh installs.
const chromium = "/usr/bin/chromium"

// newBrowser starts a headless Chromium for the test and returns a tab's
// context; the browser ends with the test.
func newBrowser(t *testing.T, width, height int) context.Context {
	t.Helper()
	if _, err := os.Stat(chromium); err != nil {
		t.Fatalf("%s: %v (make deps installs Debian's chromium)", chromium, err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.WindowSize(width, height), chromedp.Flag("hide-scrollbars", true), chromedp.Flag("force-device-scale-factor", "1"))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("starting %s: %v", chromium, err)
	}
	return ctx
}

// evalJS evaluates expr in the page.
func evalJS[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// waitJS polls expr in the page every 25 ms until it is true, and returns
// when it became so; it fails the test after timeout, saying what.
func waitJS(t *testing.T, ctx context.Context, expr string, timeout time.Duration, what string) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		if err == nil && ok {
			return time.Now()
		}
		if time.Now().After(deadline) {
			dump, derr := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify(Object.fromEntries([...window.gpucoordModel].filter(([k]) => !k.startsWith('points/'))))`))
			t.Fatalf("the page does not show %s within %s (last error %v); its model (%v):\n%.20000s", what, timeout, err, derr, dump)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// screenshot writes the page to dir/name as a PNG when dir is set
// (GPUCOORD_WEB_SHOTS, e.g. docs/web): its top 1,800 pixels, or all of a
// shorter page.
func screenshot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	if dir == "" {
		return
	}
	size := evalJS[[]float64](t, ctx, `[document.documentElement.scrollWidth, document.documentElement.scrollHeight]`)
	b, err := chromedp.Call(ctx, page.CaptureScreenshot, page.CaptureScreenshotParams{Format: page.CaptureScreenshotFormatPng,
		Clip: &page.Viewport{Width: size[0], Height: min(size[1], 1800), Scale: 1}, CaptureBeyondViewport: new(true)})
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), b.Data, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%d bytes)", filepath.Join(dir, name), len(b.Data))
}

// dashboardCoordinator starts a coordinator that serves its dashboard on
// loopback and returns it, its gRPC address and the dashboard's URL.
func dashboardCoordinator(t *testing.T, exe string, args ...string) (*proc, string, string) {
	t.Helper()
	p, addr := coordinatorProc(t, exe, append([]string{"--http", "127.0.0.1:0"}, args...)...)
	line := p.waitLine(t, "dashboard on ", 10*time.Second)
	return p, addr, strings.TrimSpace(line[strings.Index(line, "http"):])
}

// sameJSONText reports whether two JSON documents hold the same values.
func sameJSONText(t *testing.T, a, b string) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal([]byte(a), &x); err != nil {
		t.Fatalf("%v: %.200s", err, a)
	}
	if err := json.Unmarshal([]byte(b), &y); err != nil {
		t.Fatalf("%v: %.200s", err, b)
	}
	return reflect.DeepEqual(x, y)
}

// TestWebDashboard drives the dashboard in a real headless Chromium
// against a coordinator and three agents running a native job:
//   - the job's grid shows every rank, running, with its step;
//   - a rank stopped (SIGSTOP) is found hung: the page shows its
//     goroutines' stacks, and the generation that restarts the job;
//   - a host killed: its ranks show lost (in the generation that ended)
//     and the new generation comes on the page (the time from the
//     leader's decision, its log line, is logged);
//   - the plan form shows plan --json's numbers for its flags.
//
// With GPUCOORD_WEB_SHOTS=DIR it writes the screenshots of docs/web there.
func TestWebDashboard(t *testing.T) {
	exe := e2e.Binary(t)
	shots := os.Getenv("GPUCOORD_WEB_SHOTS")
	// Leases of 4 s, not 2: on a loaded machine an agent whose renewal is
	// late stops its ranks at its deadline, and that, not the hang, would
	// make the next generation.
	co, addr, web := dashboardCoordinator(t, exe, "--lease-ttl", "4s")
	workerProc(t, exe, addr, "w0", 2, "--failure-domain", "rack-a")
	w1, _ := workerProc(t, exe, addr, "w1", 2, "--failure-domain", "rack-b")
	const job = "webjob"
	launch := start(t, exe, "launch", "--coordinator", addr, "--job-id", job, "--nodes", "2", "--gpus-per-node", "2", "--tp", "2",
		"--min-nodes", "1", "--max-restarts", "5", "--hang-timeout", "2s", "--checkpoint-every", "20", "--checkpoint-dir", t.TempDir(),
		"--steps", "100000000", "--json", "../../examples/jobs/mlp.yaml")
	launch.waitLine(t, "dashboard: "+web+"#/jobs/"+job, 30*time.Second)
	// The spare, w2, comes once the job runs on w0 and w1 (w1 with ranks
	// 2 and 3): with all three free, the coordinator may take any two.
	launch.waitLine(t, "generation 1: 2 nodes (w0, w1)", time.Minute)
	workerProc(t, exe, addr, "w2", 2, "--failure-domain", "rack-b")
	if out, _, err := runCLI(t, "status", "--coordinator", addr, "--web"); err != nil || out != web+"\n" {
		t.Errorf("status --web printed %q (%v), want %q", out, err, web)
	}
	launch.waitLine(t, `{"step":30,`, time.Minute)

	ctx := newBrowser(t, 1400, 1000)
	if err := chromedp.Do(ctx, chromedp.Navigate(web+"#/jobs/"+job)); err != nil {
		t.Fatal(err)
	}
	// Every rank, running, with its step.
	waitJS(t, ctx, `(() => { const c = [...document.querySelectorAll('#grid g.rank')];
		return c.length === 4 && c.every(g => g.dataset.state === 'running' && /^step \d+$/.test(g.querySelector('.step').textContent)); })()`,
		10*time.Second, "4 ranks running with their steps")
	steps := evalJS[[]string](t, ctx, `[...document.querySelectorAll('#grid g.rank .step')].map(e => e.textContent)`)
	t.Logf("the grid's ranks: %v", steps)
	first, _ := strconv.Atoi(strings.TrimPrefix(steps[0], "step "))
	waitJS(t, ctx, fmt.Sprintf(`+document.querySelector('#grid').dataset.step > %d`, first), 10*time.Second, "the step moving on")

	// A hung rank: rank 3 stopped. Its agent finds it after the hang
	// timeout, asks it for its stacks and the job restarts.
	rank3 := processWithEnv(t, processesWith("TORCHELASTIC_RUN_ID="+job), "RANK=3")
	if err := syscall.Kill(rank3, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	// Rank 3 is shown hung, its process stopped, and the stacks the
	// agents captured: its own, or (when it printed its peers' failure
	// instead, having been let go to print) those of its peers, hung
	// waiting for it.
	waitJS(t, ctx, `(() => { const h = document.querySelector('#hangs .hang[data-rank="3"]');
		return !!h && /process stopped/.test(h.textContent) &&
			[...document.querySelectorAll('#hangs .hang pre')].some(p => p.textContent.includes('goroutine ') && p.textContent.includes('RunNativeRank')); })()`,
		30*time.Second, "rank 3 hung and the ranks' stacks")
	withStacks := evalJS[string](t, ctx, `[...document.querySelectorAll('#hangs .hang')].filter(h => /RunNativeRank/.test(h.querySelector('pre').textContent)).map(h => h.dataset.rank).join()`)
	t.Logf("rank 3 hung on the page %s after its SIGSTOP (hang timeout 2s), with the stacks of ranks %s", time.Since(stopped).Round(time.Millisecond), withStacks)
	waitJS(t, ctx, `[...document.querySelectorAll('#gens li .cause')].some(c => /rank 3 on w1 hung/.test(c.textContent))`, 30*time.Second,
		"a generation caused by rank 3 hung")
	waitJS(t, ctx, `+document.querySelector('#grid').dataset.generation >= 2 && [...document.querySelectorAll('#grid g.rank')].every(g => g.dataset.state === 'running')`,
		30*time.Second, "the next generation running")
	gen := evalJS[int](t, ctx, `+document.querySelector('#grid').dataset.generation`)

	// A host killed: w1 (it runs ranks 2-3). The next generation takes the
	// spare, w2.
	killed := time.Now()
	w1.cmd.Process.Kill()
	lost := waitJS(t, ctx, `(() => { const lost = g => [...document.querySelectorAll(g + ' g.rank')].filter(c => c.dataset.state === 'lost').map(c => +c.dataset.rank);
		const p = document.querySelector('#prev-grid'); return lost('#grid').length === 2 || (p && +p.dataset.generation === `+strconv.Itoa(gen)+` && lost('#prev-grid').join() === '2,3'); })()`,
		30*time.Second, "w1's ranks lost")
	next := gen + 1
	shown := waitJS(t, ctx, fmt.Sprintf(`+document.querySelector('#grid').dataset.generation === %d`, next), 30*time.Second, fmt.Sprintf("generation %d", next))
	var line string
	for !strings.Contains(line, `msg="new generation"`) {
		line = co.waitLine(t, fmt.Sprintf(`job=%s generation=%d `, job, next), 10*time.Second)
	}
	decided := logTime(t, line, "time")
	lag := shown.Sub(decided)
	t.Logf("w1 killed: its ranks lost on the page after %s; generation %d decided %s after the kill, on the page %s after the decision",
		lost.Sub(killed).Round(time.Millisecond), next, decided.Sub(killed).Round(time.Millisecond), lag.Round(time.Millisecond))
	// How soon is the dashboard benchmark's (docs/BENCHMARKS.md), not a
	// bound on make test's two shared cores: the page shows the
	// generation from its event stream, without a reload.
	// The ended generation is drawn in a task after the new one's.
	waitJS(t, ctx, fmt.Sprintf(`document.querySelector('#prev-grid').dataset.drawn === '%d'`, gen), 10*time.Second, "the ended generation drawn")
	if got := evalJS[string](t, ctx, `[...document.querySelectorAll('#prev-grid g.rank')].filter(c => c.dataset.state === 'lost').map(c => c.dataset.rank).join()`); got != "2,3" {
		t.Errorf("the ended generation's lost ranks on the page: %q, want 2,3", got)
	}
	waitJS(t, ctx, `[...document.querySelectorAll('#grid g.rank')].length === 4 && [...document.querySelectorAll('#grid g.rank')].every(g => g.dataset.state === 'running')`,
		30*time.Second, "the new generation running")
	waitJS(t, ctx, `document.querySelectorAll('#chart-loss path.line').length >= 1`, 5*time.Second, "the loss curve")
	// The curve holds the steps since before the page opened, through
	// every generation.
	waitJS(t, ctx, fmt.Sprintf(`(() => { const p = window.gpucoordModel.get('points/%s') || []; return p.length >= 3 && p[p.length - 1][3] === %d; })()`, job, next),
		20*time.Second, fmt.Sprintf("the curve reaching generation %d", next))
	if pts := evalJS[[][4]float64](t, ctx, `window.gpucoordModel.get('points/`+job+`')`); pts[0][0] > float64(first) {
		t.Errorf("the page's curve: %d points, from %v to %v; want it from before step %d (the page opened)", len(pts), pts[0], pts[len(pts)-1], first)
	}
	// A rank's output: rank 0's log, from its agent (it holds the lines
	// rank 0 printed when its peers vanished), as the page shows it when
	// the rank is clicked.
	evalJS[bool](t, ctx, `(() => { document.querySelector('#grid g.rank[data-rank="0"]').dispatchEvent(new MouseEvent('click'));
		[...document.querySelectorAll('#rank-detail button')].find(b => /output/.test(b.textContent)).click(); return true; })()`)
	waitJS(t, ctx, `(() => { const o = document.querySelector('#output'); return !document.querySelector('#output-card').hidden && o.textContent.length > 20 && o.textContent !== 'loading…'; })()`,
		10*time.Second, "rank 0's output")
	// The rank's details name its node, as the generation's members say.
	if d := evalJS[string](t, ctx, `document.querySelector('#rank-detail').textContent`); !regexp.MustCompile(`nodew[02] \(alive\)`).MatchString(d) {
		t.Errorf("rank 0's details: %q, want its node, w0 or w2, alive", d)
	}
	if out := evalJS[string](t, ctx, `document.querySelector('#output').textContent`); !strings.Contains(out, "collectives") {
		t.Errorf("rank 0's output on the page: %q, want its lines about the peers it lost", out)
	}

	screenshot(t, ctx, shots, "job.png")

	// The pool: w1 lost in rack-b, w0 and w2 running the job.
	if err := chromedp.Do(ctx, chromedp.Navigate(web+"#/")); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, `(() => { const h = n => document.querySelector('.node[data-node="' + n + '"]')?.dataset.health;
		return h('w0') === 'registered' && h('w2') === 'registered' && h('w1') === 'lost'; })()`, 10*time.Second, "the pool with w1 lost")
	if d := evalJS[string](t, ctx, `document.querySelector('.node[data-node="w1"]').closest('.domain').dataset.domain`); d != "rack-b" {
		t.Errorf("w1 is shown in failure domain %q, want rack-b", d)
	}
	// A live node's last lease renewal (this coordinator holds its stream
	// and renews it) and its gossip state: its domain's pool, alone in it.
	evalJS[bool](t, ctx, `document.querySelector('.node[data-node="w0"]').click(), true`)
	waitJS(t, ctx, `(() => { const d = document.querySelector('#node-detail'); return !d.hidden &&
		/^last renewed \d\d:\d\d:\d\d \([\d.]+ m?s ago\) by this coordinator, TTL 4\.00 s$/.test(d.querySelector('.renewal').textContent) &&
		/^pool of rack-a, 1 member registered; no member reported it dead$/.test(d.querySelector('.gossip').textContent); })()`,
		10*time.Second, "w0's last renewal and gossip pool")
	t.Logf("w0 on the page: %s", evalJS[string](t, ctx, `document.querySelector('#node-detail .renewal').textContent + ' | ' + document.querySelector('#node-detail .gossip').textContent`))
	evalJS[bool](t, ctx, `document.querySelector('.node[data-node="w1"]').click(), true`)
	t.Logf("w1, killed, on the page: %s", evalJS[string](t, ctx, `document.querySelector('#node-detail .renewal').textContent + ' | ' + document.querySelector('#node-detail .gossip').textContent`))
	evalJS[bool](t, ctx, `document.querySelector('.node[data-node="w0"]').click(), true`)
	screenshot(t, ctx, shots, "pool.png")

	// The plan form: the numbers plan --json prints.
	if err := chromedp.Do(ctx, chromedp.Navigate(web+"#/plan")); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, `document.querySelectorAll('#plan-model option').length > 3`, 10*time.Second, "the plan form")
	evalJS[bool](t, ctx, `(() => { const f = document.querySelector('#plan-form');
		f.cluster.value = 'dgx-h100'; f.nodes.value = '4'; f.model.value = 'gpt-13b'; f.tp.value = '8'; f.pp.value = '2'; f.zero.value = '1';
		f.requestSubmit(); return true; })()`)
	waitJS(t, ctx, `!!document.querySelector('#plan-summary')`, 30*time.Second, "the plan")
	want, _, err := runCLI(t, "plan", "--cluster", "dgx-h100", "--nodes", "4", "--model", "gpt-13b", "--tp", "8", "--pp", "2", "--zero", "1",
		"--micro-batch", "1", "--schedule", "1f1b", "--recompute", "none", "--json")
	if err != nil {
		t.Fatal(err)
	}
	got := evalJS[string](t, ctx, `JSON.stringify(JSON.parse(document.querySelector('#plan-result details pre').textContent))`)
	if !sameJSONText(t, got, want) {
		t.Errorf("the page's plan differs from plan --json's:\npage: %.400s\ncli:  %.400s", got, want)
	}
	screenshot(t, ctx, shots, "plan.png")
	launch.cmd.Process.Signal(syscall.SIGINT)
}

// TestWebPlan: the dashboard's plan form gives plan --json's document and
// plan --svg's picture; a job file's replan section names the model; a
// file on the coordinator's machine, and flags of plan's other modes, are
// refused with the reason.
func TestWebPlan(t *testing.T) {
	args := []string{"--cluster", "dgx-h100", "--nodes", "2", "--tp", "8"}
	refusal := func(a *coordinator.PlanAnswer) string {
		if a == nil {
			return "no answer"
		}
		return a.Error
	}
	ans, err := webPlan(t.Context(), append(args, "--model", "gpt-1.7b"), nil)
	if err != nil || ans.Error != "" {
		t.Fatalf("webPlan: %v %q", err, refusal(ans))
	}
	want, _, err := runCLI(t, append([]string{"plan", "--json", "--model", "gpt-1.7b"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	if !ans.Fits || !sameJSONText(t, string(ans.Plan), want) || !strings.HasPrefix(ans.SVG, "<svg") {
		t.Errorf("webPlan: fits %v, svg %.20q, plan %.200s\nwant %.200s", ans.Fits, ans.SVG, ans.Plan, want)
	}
	if ans.Command != "gpucoord plan --cluster dgx-h100 --nodes 2 --tp 8 --model gpt-1.7b" {
		t.Errorf("command %q", ans.Command)
	}
	job, err := os.ReadFile("../../examples/jobs/mlp.yaml")
	if err != nil {
		t.Fatal(err)
	}
	withModel := append(slices.Clone(job), "replan:\n  model: gpt-1.7b\n"...)
	if ans, err := webPlan(t.Context(), args, withModel); err != nil || ans.Error != "" || !sameJSONText(t, string(ans.Plan), want) {
		t.Errorf("webPlan with a job file: %v %q", err, refusal(ans))
	}
	tests := []struct {
		args []string
		job  string
		want string
	}{
		{[]string{"--cluster", "/etc/passwd", "--model", "gpt-1.7b"}, "", "presets only"},
		{[]string{"--model", "../../examples/models/x.yaml"}, "", "presets only"},
		{[]string{"--model", "gpt-1.7b", "--auto"}, "", "--auto is not for the dashboard"},
		{[]string{"--model", "gpt-1.7b", "--svg", "/tmp/x.svg"}, "", "--svg is not for the dashboard"},
		{[]string{"--nodes", "2"}, string(job), "names no model"},
		{[]string{"--model", "gpt-1.7b", "--tp", "3"}, "", "tp"},
		{[]string{"--bogus"}, "", "unknown flag"},
	}
	for _, tc := range tests {
		ans, err := webPlan(t.Context(), tc.args, []byte(tc.job))
		if err != nil || !strings.Contains(ans.Error, tc.want) {
			t.Errorf("webPlan(%q): %v, error %q; want one with %q", tc.args, err, refusal(ans), tc.want)
		}
	}
}
