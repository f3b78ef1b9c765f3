package worker

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// writeProbe writes the probe of asg's generation into the shared
// checkpoint directory dir, in its directory of gpucoord's own (Owned): a
// file whose name is also its content, random, so that no earlier run's
// file passes for it. It returns the name.
func writeProbe(dir string, asg *pb.Assignment) (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	name := fmt.Sprintf(".gpucoord-probe-%s-gen%d-%s", asg.Job, asg.Generation.GetNumber(), hex.EncodeToString(b[:]))
	if err := mkOwned(dir); err != nil {
		return "", fmt.Errorf("checkpoint directory %s: %w", dir, err)
	}
	if err := os.WriteFile(filepath.Join(Owned(dir), name), []byte(name), 0o644); err != nil {
		return "", fmt.Errorf("checkpoint directory %s: %w", dir, err)
	}
	return name, nil
}

// readProbe checks that node reads in dir the probe writer wrote there.
func readProbe(dir, probe, writer, node string) error {
	notShared := func(why string) error {
		return fmt.Errorf("checkpoint directory %s is not shared: node %s %s the probe node %s wrote there; give a directory every node mounts",
			dir, node, why, writer)
	}
	if probe == "" || strings.ContainsAny(probe, "/\\") {
		return fmt.Errorf("checkpoint directory %s: the coordinator sent no valid probe (%q)", dir, probe)
	}
	b, err := os.ReadFile(filepath.Join(Owned(dir), probe))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return notShared("cannot find")
	case err != nil:
		return fmt.Errorf("checkpoint directory %s on node %s: %w", dir, node, err)
	case !bytes.Equal(b, []byte(probe)):
		return notShared("reads another content than")
	}
	return nil
}

// rankNode names the node of asg's generation that runs rank r.
func rankNode(asg *pb.Assignment, r int32) string {
	for _, m := range asg.Generation.GetMembers() {
		if r >= m.FirstRank && r < m.FirstRank+m.Ranks {
			return m.Node
		}
	}
	return "rank " + strconv.Itoa(int(r)) + "'s node"
}

// outputTail keeps the last lines a rank printed, for the report of its
// failure. Safe for concurrent use (a rank's stdout and stderr).
type outputTail struct {
	mu    sync.Mutex
	lines []tailLine
	stack *stackCapture // what the rank prints once asked for its stacks
}

// tailLine is one line kept, and when its agent read it.
type tailLine struct {
	at   time.Time
	text string
}

// capture starts collecting everything the rank prints, for the report
// of its hang, from the lines kept that it printed at or after since (its
// last progress) on: a hung rank's last words before it was asked, such
// as the error of a receive whose peer's agent, finding the peer hung
// too, ended it first.
func (t *outputTail) capture(since time.Time) *stackCapture {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := &stackCapture{done: make(chan struct{})}
	for _, l := range t.lines {
		if !l.at.Before(since) {
			c.append(l.text)
		}
	}
	t.stack = c
	return c
}

const (
	tailLines   = 12  // lines kept
	tailLineMax = 240 // bytes kept of each
)

// add keeps line, which the agent read at at.
func (t *outputTail) add(line []byte, at time.Time) {
	l := strings.TrimRight(string(line), "\r\n")
	if len(l) > tailLineMax {
		l = l[:tailLineMax] + "..."
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stack != nil {
		t.stack.line(line)
	}
	t.lines = append(t.lines, tailLine{at: at, text: l})
	if len(t.lines) > tailLines {
		t.lines = t.lines[len(t.lines)-tailLines:]
	}
}

// String returns the lines kept, oldest first, one per line.
func (t *outputTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	texts := make([]string, len(t.lines))
	for i, l := range t.lines {
		texts[i] = l.text
	}
	return strings.Join(texts, "\n")
}
