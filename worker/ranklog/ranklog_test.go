package ranklog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func newStore(t *testing.T, lim Limits) (*Store, *Client, string) {
	t.Helper()
	s := New(t.TempDir(), "n1", lim, slog.New(slog.DiscardHandler))
	mux := http.NewServeMux()
	s.Handle(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c := NewClient(nil)
	t.Cleanup(c.Close)
	return s, c, strings.TrimPrefix(srv.URL, "http://")
}

// follower follows in the background and collects what it reads.
type follower struct {
	mu    sync.Mutex
	lines []string
	done  chan error
}

func follow(ctx context.Context, c *Client, addr, job string, gen int64, rank int) *follower {
	f := &follower{done: make(chan error, 1)}
	go func() {
		f.done <- c.Follow(ctx, "n1", addr, job, gen, rank, func(b []byte) {
			f.mu.Lock()
			f.lines = append(f.lines, string(b))
			f.mu.Unlock()
		})
	}()
	return f
}

func (f *follower) wait(t *testing.T) []string {
	t.Helper()
	select {
	case err := <-f.done:
		if err != nil {
			t.Fatalf("follow: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("follow did not end after its generation ended")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lines
}

func tagged(rank int, text string) []byte { return fmt.Appendf(nil, "[n1 r%d] %s\n", rank, text) }

// TestFollow: a follower gets its generation's lines (all ranks', or one
// rank's) whether they came before or after it asked, none of another
// generation, and ends once the generation has ended on the node.
func TestFollow(t *testing.T) {
	s, c, addr := newStore(t, DefaultLimits)
	all := follow(t.Context(), c, addr, "j", 2, -1) // before the node heard of the job
	s.Line("j", 1, 0, tagged(0, "gen 1"))
	s.End("j", 1)
	s.Line("j", 2, 0, tagged(0, "a"))
	s.Line("j", 2, 1, tagged(1, "b"))
	one := follow(t.Context(), c, addr, "j", 2, 1) // after its first lines
	s.Line("j", 2, 1, tagged(1, "c"))
	s.Line("j", 2, 0, tagged(0, "d"))
	s.End("j", 2)
	s.Line("j", 3, 0, tagged(0, "gen 3"))
	if got, want := strings.Join(all.wait(t), ""), "[n1 r0] a\n[n1 r1] b\n[n1 r1] c\n[n1 r0] d\n"; got != want {
		t.Errorf("all ranks of generation 2: %q, want %q", got, want)
	}
	if got, want := strings.Join(one.wait(t), ""), "[n1 r1] b\n[n1 r1] c\n"; got != want {
		t.Errorf("rank 1 of generation 2: %q, want %q", got, want)
	}
	// A generation that ended is read whole and at once.
	if got := strings.Join(follow(t.Context(), c, addr, "j", 1, -1).wait(t), ""); got != "[n1 r0] gen 1\n" {
		t.Errorf("generation 1, after it ended: %q", got)
	}
	// A job that ended everywhere ends its followers; one that asks after
	// it ended (it lasted a moment) still reads its lines.
	f := follow(t.Context(), c, addr, "j", 4, -1)
	s.Keep(nil)
	if got := f.wait(t); len(got) != 0 {
		t.Errorf("generation 4, which never ran here: %q", got)
	}
	if got := strings.Join(follow(t.Context(), c, addr, "j", 3, -1).wait(t), ""); got != "[n1 r0] gen 3\n" {
		t.Errorf("generation 3, after the job ended: %q", got)
	}
	// Bad requests.
	for _, q := range []string{"/v1/jobs/j/output", "/v1/jobs/j/output?generation=x", "/v1/jobs/.x/logs", "/v1/jobs/j/logs?rank=-1"} {
		resp, err := http.Get("http://" + addr + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("GET %s: %s, want 400", q, resp.Status)
		}
	}
}

// TestFollowBehind: a follower that starts after the ring dropped the
// generation's first lines is told how many it missed.
func TestFollowBehind(t *testing.T) {
	lim := DefaultLimits
	lim.RingBytes = 100
	s, c, addr := newStore(t, lim)
	for i := range 20 {
		s.Line("j", 1, 0, tagged(0, fmt.Sprintf("line %02d", i))) // 16 bytes each: 6 fit
	}
	s.End("j", 1)
	lines := follow(t.Context(), c, addr, "j", 1, -1).wait(t)
	if len(lines) != 7 || lines[0] != "[n1] 14 lines of job j on n1 are not shown: the reader fell behind (gpucoord logs j has them)\n" || lines[1] != "[n1 r0] line 14\n" {
		t.Errorf("got %q", lines)
	}
}

// TestLogs: each rank's log keeps its latest lines within the bound, in
// order; a node without the job's log says so.
func TestLogs(t *testing.T) {
	lim := DefaultLimits
	lim.RankBytes, lim.LineBytes = 400, 40
	s, c, addr := newStore(t, lim)
	var want []string
	for i := range 100 {
		l := tagged(1, fmt.Sprintf("line %03d", i)) // 17 bytes
		want = append(want, string(l))
		s.Line("j", 1+int64(i/50), 1, l)
	}
	s.Line("j", 2, 0, tagged(0, strings.Repeat("x", 100)))
	var b strings.Builder
	if err := c.Logs(t.Context(), "n1", addr, "j", 1, &b); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	if len(got) > 400+17 || !strings.HasSuffix(strings.Join(want, ""), got) || len(got) < 200 {
		t.Errorf("rank 1's log: %d bytes, not the latest lines within 400:\n%s", len(got), got)
	}
	b.Reset()
	if err := c.Logs(t.Context(), "n1", addr, "j", -1, &b); err != nil {
		t.Fatal(err)
	}
	if long := "[n1 r0] " + strings.Repeat("x", 28) + "…\n"; !strings.HasPrefix(b.String(), long) || !strings.HasSuffix(b.String(), got) {
		t.Errorf("every rank's log: rank 0's cut line and then rank 1's, got:\n%s", b.String())
	}
	for _, q := range []struct {
		job  string
		rank int
	}{{"k", -1}, {"j", 7}} {
		if err := c.Logs(t.Context(), "n1", addr, q.job, q.rank, &b); !errors.Is(err, ErrNone) {
			t.Errorf("logs of job %s rank %d: %v, want ErrNone", q.job, q.rank, err)
		}
	}
}

// TestKeepJobs: the log files of the most recently written jobs stay, and
// of a live job always.
func TestKeepJobs(t *testing.T) {
	lim := DefaultLimits
	lim.Jobs = 2
	s, _, _ := newStore(t, lim)
	old := time.Now().Add(-time.Hour)
	for i, job := range []string{"a", "b", "c", "d"} {
		s.Line(job, 1, 0, tagged(0, "x"))
		s.End(job, 1)
		at := old.Add(time.Duration(i) * time.Minute)
		os.Chtimes(s.rankPath(job, 0), at, at)
		os.Chtimes(filepath.Dir(s.rankPath(job, 0)), at, at)
	}
	s.Keep([]string{"a"})
	entries, _ := os.ReadDir(s.dir)
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if strings.Join(left, ",") != "a,c,d" {
		t.Errorf("kept %v, want a (live), c and d (newest)", left)
	}
}
