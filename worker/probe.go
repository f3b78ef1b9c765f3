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
	lines []string
	stack *stackCapture // what the rank prints once asked for its stacks
}

// capture starts collecting everything the rank prints, for the report
// of its hang.
func (t *outputTail) capture() *stackCapture {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stack = &stackCapture{done: make(chan struct{})}
	return t.stack
}

const (
	tailLines   = 12  // lines kept
	tailLineMax = 240 // bytes kept of each
)

func (t *outputTail) add(line []byte) {
	t.mu.Lock()
	stack := t.stack
	t.mu.Unlock()
	if stack != nil {
		stack.line(line)
	}
	l := strings.TrimRight(string(line), "\r\n")
	if len(l) > tailLineMax {
		l = l[:tailLineMax] + "..."
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, l)
	if len(t.lines) > tailLines {
		t.lines = t.lines[len(t.lines)-tailLines:]
	}
}

// String returns the lines kept, oldest first, one per line.
func (t *outputTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "\n")
}
