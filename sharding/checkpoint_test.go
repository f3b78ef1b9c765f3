package sharding

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
)

// writeCheckpoint writes every rank's shard of full concurrently, as the
// ranks of a job would, then commits.
func writeCheckpoint(t testing.TB, root string, step int64, p *Partition, full map[string][]float32) []ShardInfo {
	t.Helper()
	ctx := context.Background()
	infos := make([]ShardInfo, p.Degree())
	var g errgroup.Group
	for r := range infos {
		g.Go(func() error {
			s, err := ShardOf(p, r, full)
			if err != nil {
				return err
			}
			infos[r], err = WriteShard(ctx, root, step, p, s)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := Commit(ctx, root, step, p, infos); err != nil {
		t.Fatal(err)
	}
	return infos
}

// ckptTensors has odd sizes so no boundary falls anywhere round.
func ckptTensors() []Tensor {
	return []Tensor{
		{Name: "embed", Shape: []int{4001, 97}},
		{Name: "fc1.weight", Shape: []int{333, 301}},
		{Name: "fc1.bias", Shape: []int{333}},
		{Name: "norm.scale", Shape: nil},
		{Name: "fc2.weight", Shape: []int{17, 333}},
	}
}

func TestCheckpointReadAtAnyDegree(t *testing.T) {
	root := t.TempDir()
	p, err := NewPartition(ckptTensors(), 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	full := randomState(3, p.Len())
	infos := writeCheckpoint(t, root, 40, p, full)

	step, err := LatestComplete(t.Context(), root)
	if err != nil || step != 40 {
		t.Fatalf("LatestComplete = %d, %v; want 40", step, err)
	}
	if err := Verify(t.Context(), root, 40); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	for r, want := range infos {
		got, err := InspectShard(t.Context(), root, 40, p, r)
		if err != nil {
			t.Fatal(err)
		}
		if got.SHA256 != want.SHA256 || got.Size != want.Size || !slices.Equal(got.Chunks, want.Chunks) || got.DataOffset != want.DataOffset {
			t.Fatalf("InspectShard(%d) = %+v, WriteShard said %+v", r, got, want)
		}
		if len(want.Chunks) < 2 {
			t.Fatalf("shard %d has %d chunks; the test needs files of several chunks", r, len(want.Chunks))
		}
	}
	for _, d := range []int{1, 2, 3, 4, 7} {
		t.Run(fmt.Sprintf("read at %d", d), func(t *testing.T) {
			p2, err := NewPartition(ckptTensors(), d, &Config{Align: 8})
			if err != nil {
				t.Fatal(err)
			}
			for r := range d {
				s, err := ReadShard(t.Context(), root, 40, p2, r)
				if err != nil {
					t.Fatal(err)
				}
				checkShardBits(t, p2, r, s, full)
			}
		})
	}
	m, err := ReadManifest(t.Context(), root, 40)
	if err != nil {
		t.Fatal(err)
	}
	if m.Step != 40 || m.Degree != 3 || m.Len != p.Len() || !slices.Equal(m.Vectors, stateNames) || len(m.Tensors) != 5 || m.Tensors[0].Name != "embed" {
		t.Fatalf("manifest = step %d degree %d len %d vectors %v tensors %v", m.Step, m.Degree, m.Len, m.Vectors, m.Tensors)
	}
}

// TestReadShardTouchesOnlyItsChunks damages one chunk of an old shard file:
// the new ranks that do not need it still load, the one that does is told.
func TestReadShardTouchesOnlyItsChunks(t *testing.T) {
	root := t.TempDir()
	p, _ := NewPartition(vecTensors(1_000_000), 2, nil) // blocks of 500000
	full := randomState(9, p.Len())
	infos := writeCheckpoint(t, root, 1, p, full)
	// Vectors are m, param, v, 2,000,000 bytes each. Element 400000 of v in
	// shard 1 (flat 900000) is at data offset + 5,600,000: chunk 5. At
	// degree 4 (blocks of 250000) only new rank 3 reads chunk 5 of shard 1;
	// rank 2 reads shard 1 bytes up to offset + 5,000,000, chunk 4.
	off := infos[1].DataOffset + 2*2_000_000 + 400_000*4
	if c := off / ChunkBytes; c != 5 {
		t.Fatalf("damaged byte in chunk %d, the test is laid out for chunk 5", c)
	}
	flipByte(t, filepath.Join(StepDir(root, 1), infos[1].File), off)

	p4, _ := NewPartition(vecTensors(1_000_000), 4, nil)
	for r := range 4 {
		s, err := ReadShard(t.Context(), root, 1, p4, r)
		if r == 3 {
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "chunk 5") {
				t.Fatalf("rank 3: err = %v, want ErrCorrupt naming chunk 5", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		checkShardBits(t, p4, r, s, full)
	}
	if err := Verify(t.Context(), root, 1); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Verify: err = %v, want ErrCorrupt", err)
	}
}

func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func TestCheckpointDamage(t *testing.T) {
	shard0 := func(root string) string { return filepath.Join(StepDir(root, 2), ShardFile(0, 2)) }
	manifest := func(root string) string { return filepath.Join(StepDir(root, 2), ManifestFile) }
	editManifest := func(t *testing.T, root string, edit func(m map[string]any)) {
		data, err := os.ReadFile(manifest(root))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		edit(m)
		if data, err = json.Marshal(m); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(manifest(root), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name       string
		damage     func(t *testing.T, root string)
		wantErr    error
		wantLatest int64 // step-2 damage that LatestComplete sees falls back to 1
	}{
		{"flip a data byte", func(t *testing.T, root string) { flipByte(t, shard0(root), 5000) }, ErrCorrupt, 2},
		{"flip a header byte", func(t *testing.T, root string) { flipByte(t, shard0(root), 20) }, ErrCorrupt, 2},
		{"truncate a shard", func(t *testing.T, root string) {
			if err := os.Truncate(shard0(root), 1000); err != nil {
				t.Fatal(err)
			}
		}, ErrCorrupt, 1},
		{"delete a shard", func(t *testing.T, root string) {
			if err := os.Remove(shard0(root)); err != nil {
				t.Fatal(err)
			}
		}, ErrCorrupt, 1},
		{"delete the manifest", func(t *testing.T, root string) {
			if err := os.Remove(manifest(root)); err != nil {
				t.Fatal(err)
			}
		}, ErrIncomplete, 1},
		{"manifest cut short", func(t *testing.T, root string) {
			if err := os.Truncate(manifest(root), 100); err != nil {
				t.Fatal(err)
			}
		}, ErrCorrupt, 1},
		{"manifest with an unknown field", func(t *testing.T, root string) {
			editManifest(t, root, func(m map[string]any) { m["extra"] = 1 })
		}, ErrCorrupt, 1},
		{"manifest names another step", func(t *testing.T, root string) {
			editManifest(t, root, func(m map[string]any) { m["step"] = 3 })
		}, ErrCorrupt, 1},
		{"manifest checksum not hex", func(t *testing.T, root string) {
			editManifest(t, root, func(m map[string]any) { m["shards"].([]any)[1].(map[string]any)["sha256"] = "zz" })
		}, ErrCorrupt, 1},
		{"manifest lies about the length", func(t *testing.T, root string) {
			editManifest(t, root, func(m map[string]any) { m["len"] = 12 })
		}, ErrCorrupt, 1},
		{"manifest points at another file", func(t *testing.T, root string) {
			editManifest(t, root, func(m map[string]any) { m["shards"].([]any)[0].(map[string]any)["file"] = "../../etc/passwd" })
		}, ErrCorrupt, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			p, _ := NewPartition(vecTensors(30_000, 7, 20_001), 2, nil)
			writeCheckpoint(t, root, 1, p, randomState(1, p.Len()))
			writeCheckpoint(t, root, 2, p, randomState(2, p.Len()))
			tc.damage(t, root)
			// Rank 0 of degree 2 reads shard 0 whole.
			if _, err := ReadShard(t.Context(), root, 2, p, 0); !errors.Is(err, tc.wantErr) {
				t.Fatalf("ReadShard: err = %v, want %v", err, tc.wantErr)
			}
			if err := Verify(t.Context(), root, 2); !errors.Is(err, tc.wantErr) {
				t.Fatalf("Verify: err = %v, want %v", err, tc.wantErr)
			}
			latest, err := LatestComplete(t.Context(), root)
			if err != nil || latest != tc.wantLatest {
				t.Fatalf("LatestComplete = %d, %v; want %d", latest, err, tc.wantLatest)
			}
			// The older checkpoint is untouched.
			s, err := ReadShard(t.Context(), root, 1, p, 0)
			if err != nil {
				t.Fatal(err)
			}
			checkShardBits(t, p, 0, s, randomState(1, p.Len()))
		})
	}
	t.Run("other tensors", func(t *testing.T) {
		root := t.TempDir()
		p, _ := NewPartition(ckptTensors(), 2, nil)
		writeCheckpoint(t, root, 1, p, randomState(1, p.Len()))
		renamed := ckptTensors()
		renamed[2].Name = "fc1.b"
		other, _ := NewPartition(renamed, 2, nil)
		if _, err := ReadShard(t.Context(), root, 1, other, 0); !errors.Is(err, ErrMismatch) {
			t.Fatalf("err = %v, want ErrMismatch", err)
		}
	})
}

func TestLatestComplete(t *testing.T) {
	if _, err := LatestComplete(t.Context(), filepath.Join(t.TempDir(), "absent")); !errors.Is(err, ErrNoCheckpoint) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing root: err = %v, want ErrNoCheckpoint and fs.ErrNotExist", err)
	}
	root := t.TempDir()
	if _, err := LatestComplete(t.Context(), root); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("empty root: err = %v, want ErrNoCheckpoint", err)
	}
	p, _ := NewPartition(vecTensors(100), 2, nil)
	writeCheckpoint(t, root, 9, p, randomState(9, 100))
	writeCheckpoint(t, root, 10, p, randomState(10, 100))
	// Step 12: shards written, no commit (a crash before the manifest).
	for r := range 2 {
		s, _ := ShardOf(p, r, randomState(12, 100))
		if _, err := WriteShard(t.Context(), root, 12, p, s); err != nil {
			t.Fatal(err)
		}
	}
	for _, junk := range []string{"step-011x", "step-0100", "step--1", "notes"} {
		if err := os.Mkdir(filepath.Join(root, junk), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "step-99"), []byte("a file"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := LatestComplete(t.Context(), root)
	if err != nil || got != 10 {
		t.Fatalf("LatestComplete = %d, %v; want 10", got, err)
	}
	if _, err := ReadShard(t.Context(), root, 12, p, 0); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("reading uncommitted step 12: err = %v, want ErrIncomplete", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := LatestComplete(ctx, root); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: err = %v, want context.Canceled", err)
	}
}

func TestWriteShardUncommitsStep(t *testing.T) {
	root := t.TempDir()
	p, _ := NewPartition(vecTensors(100), 2, nil)
	writeCheckpoint(t, root, 1, p, randomState(1, 100))
	writeCheckpoint(t, root, 2, p, randomState(2, 100))
	s, _ := ShardOf(p, 1, randomState(3, 100))
	if _, err := WriteShard(t.Context(), root, 2, p, s); err != nil {
		t.Fatal(err)
	}
	if got, err := LatestComplete(t.Context(), root); err != nil || got != 1 {
		t.Fatalf("LatestComplete = %d, %v; want 1 once step 2 is being rewritten", got, err)
	}
	// Rewritten at degree 3 after a crash that left a temporary file: the
	// commit keeps only the degree-3 files and the manifest.
	dir := StepDir(root, 2)
	if err := os.WriteFile(filepath.Join(dir, ".shard-0-of-3.bin.tmp-123"), []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	p3, _ := NewPartition(vecTensors(100), 3, nil)
	writeCheckpoint(t, root, 2, p3, randomState(4, 100))
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{ManifestFile, ShardFile(0, 3), ShardFile(1, 3), ShardFile(2, 3)}; !slices.Equal(names, want) {
		t.Fatalf("step directory holds %q, want %q", names, want)
	}
	if got, err := LatestComplete(t.Context(), root); err != nil || got != 2 {
		t.Fatalf("LatestComplete = %d, %v; want 2", got, err)
	}
}

func TestCommitErrors(t *testing.T) {
	root := t.TempDir()
	p, _ := NewPartition(vecTensors(100), 3, nil)
	full := randomState(1, 100)
	infos := writeCheckpoint(t, root, 5, p, full)
	other, _ := NewPartition(vecTensors(60, 40), 3, nil)
	tests := []struct {
		name    string
		step    int64
		p       *Partition
		infos   func() []ShardInfo
		wantErr error
	}{
		{"a rank missing", 5, p, func() []ShardInfo { return infos[:2] }, ErrIncomplete},
		{"a rank twice", 5, p, func() []ShardInfo { return []ShardInfo{infos[0], infos[1], infos[1]} }, ErrIncomplete},
		{"infos of another step", 6, p, func() []ShardInfo { return infos }, ErrIncomplete},
		{"another partition", 5, other, func() []ShardInfo { return infos }, ErrMismatch},
		{"wrong size", 5, p, func() []ShardInfo {
			c := slices.Clone(infos)
			c[2].Size++
			return c
		}, ErrMismatch},
		{"file outside the step", 5, p, func() []ShardInfo {
			c := slices.Clone(infos)
			c[1].File = "../step-4/" + c[1].File
			return c
		}, ErrMismatch},
		{"negative step", -1, p, func() []ShardInfo { return infos }, ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := Commit(t.Context(), root, tc.step, tc.p, tc.infos()); !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
		})
	}
	// Infos in any order commit the same manifest.
	if err := Commit(t.Context(), root, 5, p, []ShardInfo{infos[2], infos[0], infos[1]}); err != nil {
		t.Fatal(err)
	}
	if err := Verify(t.Context(), root, 5); err != nil {
		t.Fatal(err)
	}
	empty := &Shard{Rank: 0, Range: Range{0, p.ShardLen()}, Vectors: map[string][]float32{}}
	if _, err := WriteShard(t.Context(), root, 7, p, empty); !errors.Is(err, ErrInvalid) {
		t.Fatalf("shard without vectors: err = %v, want ErrInvalid", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	s, _ := ShardOf(p, 0, full)
	if _, err := WriteShard(ctx, root, 7, p, s); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled write: err = %v, want context.Canceled", err)
	}
	if left, _ := filepath.Glob(filepath.Join(StepDir(root, 7), "*")); len(left) != 0 {
		t.Fatalf("a cancelled write left %v", left)
	}
}

const (
	childEnv  = "GPUCOORD_SHARDING_KILLED_WRITER_ROOT"
	killAtEnv = "GPUCOORD_SHARDING_KILLED_WRITER_AT"
	// killStep is the step during (or after) which the writer is killed.
	killStep = 3
	// pausedLine is what the writer prints when it reaches its kill point.
	pausedLine = "killed-writer: paused"
)

// killedTensors is the model the killed-writer child checkpoints: 3.6 MB
// per step, each vector of a shard (600 KB) written in one piece.
func killedTensors() []Tensor { return vecTensors(200_001, 100_000) }

// TestCheckpointKilledWriter runs a real writer process that checkpoints
// steps 1, 2, ... and kills it with SIGKILL at a chosen point of step
// killStep, which the writer reports when it reaches it: in the middle of a
// shard file, with every shard written but no manifest, and just after the
// commit. The latest complete step must then load bit-exactly and verify,
// every step with a manifest must verify, and the step directory must hold
// what was written up to the kill.
func TestCheckpointKilledWriter(t *testing.T) {
	if root := os.Getenv(childEnv); root != "" {
		killedWriterChild(t, root, os.Getenv(killAtEnv))
		return
	}
	if testing.Short() {
		t.Skip("spawns a writer process")
	}
	tests := []struct {
		at         string
		wantLatest int64
		// wantFiles are the patterns that must match in step killStep's
		// directory, noFiles those that must not.
		wantFiles, noFiles []string
	}{
		{at: "mid-file", wantLatest: killStep - 1,
			wantFiles: []string{ShardFile(0, 2), "." + ShardFile(1, 2) + ".tmp-*"},
			noFiles:   []string{ShardFile(1, 2), ManifestFile}},
		{at: "uncommitted", wantLatest: killStep - 1,
			wantFiles: []string{ShardFile(0, 2), ShardFile(1, 2)},
			noFiles:   []string{".*.tmp-*", ManifestFile}},
		{at: "committed", wantLatest: killStep,
			wantFiles: []string{ShardFile(0, 2), ShardFile(1, 2), ManifestFile},
			noFiles:   []string{".*.tmp-*"}},
	}
	for _, tc := range tests {
		t.Run(tc.at, func(t *testing.T) {
			root := t.TempDir()
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCheckpointKilledWriter$")
			cmd.Env = append(os.Environ(), childEnv+"="+root, killAtEnv+"="+tc.at)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			stdin, err := cmd.StdinPipe() // held open: the paused writer reads it until killed
			if err != nil {
				t.Fatal(err)
			}
			defer stdin.Close()
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			paused := false
			var out []string
			for sc := bufio.NewScanner(stdout); sc.Scan(); {
				if sc.Text() == pausedLine {
					paused = true
					break
				}
				out = append(out, sc.Text())
			}
			if !paused {
				err := cmd.Wait()
				t.Fatalf("the writer did not reach %s (%v):\n%s\n%s", tc.at, err, strings.Join(out, "\n"), stderr.String())
			}
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()

			latest, err := LatestComplete(t.Context(), root)
			if err != nil {
				t.Fatal(err)
			}
			if latest != tc.wantLatest {
				t.Errorf("latest complete step %d, want %d", latest, tc.wantLatest)
			}
			dir := StepDir(root, killStep)
			for _, pat := range tc.wantFiles {
				if m, _ := filepath.Glob(filepath.Join(dir, pat)); len(m) == 0 {
					t.Errorf("step %d holds no %s after a kill %s", killStep, pat, tc.at)
				}
			}
			if tc.at == "mid-file" {
				// The header and two of three vectors went through the
				// 1 MiB write buffer: at least one buffer's worth is on disk.
				m, _ := filepath.Glob(filepath.Join(dir, ".*.tmp-*"))
				for _, f := range m {
					if fi, err := os.Stat(f); err != nil || fi.Size() == 0 {
						t.Errorf("temporary file %s is empty (%v): the kill was not in the middle of the file", f, err)
					}
				}
			}
			for _, pat := range tc.noFiles {
				if m, _ := filepath.Glob(filepath.Join(dir, pat)); len(m) != 0 {
					t.Errorf("step %d holds %v after a kill %s", killStep, m, tc.at)
				}
			}
			entries, _ := os.ReadDir(root)
			if len(entries) != killStep {
				t.Errorf("%d step directories, want %d", len(entries), killStep)
			}
			p2, _ := NewPartition(killedTensors(), 3, nil)
			want := randomState(uint64(latest), p2.Len())
			for r := range 3 {
				s, err := ReadShard(t.Context(), root, latest, p2, r)
				if err != nil {
					t.Fatal(err)
				}
				checkShardBits(t, p2, r, s, want)
			}
			for _, e := range entries {
				var step int64
				if _, err := fmt.Sscanf(e.Name(), "step-%d", &step); err != nil {
					t.Fatalf("unexpected entry %s", e.Name())
				}
				if _, err := ReadManifest(t.Context(), root, step); errors.Is(err, ErrIncomplete) {
					if step < latest {
						t.Fatalf("step %d before the latest complete %d has no manifest", step, latest)
					}
					continue
				}
				if err := Verify(t.Context(), root, step); err != nil {
					t.Fatalf("committed step %d: %v", step, err)
				}
			}
		})
	}
}

// pauseCtx is a context that calls pause on its at-th call of Err.
// WriteShard checks ctx between the pieces it writes, once per vector for
// killedTensors, so pausing there stops it in the middle of its file.
type pauseCtx struct {
	context.Context
	calls, at int
	pause     func()
}

// Err implements context.Context.
func (c *pauseCtx) Err() error {
	if c.calls++; c.calls == c.at {
		c.pause()
	}
	return c.Context.Err()
}

// killedWriterChild checkpoints steps 1, 2, ... at degree 2, rank after
// rank, and at the point at of step killStep prints pausedLine and waits
// to be killed.
func killedWriterChild(t *testing.T, root, at string) {
	pause := func() {
		fmt.Println(pausedLine)
		io.Copy(io.Discard, os.Stdin) // until killed, or the parent is gone
		os.Exit(1)
	}
	p, err := NewPartition(killedTensors(), 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	for step := int64(1); step <= killStep; step++ {
		full := randomState(uint64(step), p.Len())
		infos := make([]ShardInfo, p.Degree())
		for r := range infos {
			s, err := ShardOf(p, r, full)
			if err != nil {
				t.Fatal(err)
			}
			var ctx context.Context = context.Background()
			if step == killStep && r == 1 && at == "mid-file" {
				// Stop before the last vector: the header and the
				// others are in the temporary file.
				ctx = &pauseCtx{Context: ctx, at: len(stateNames), pause: pause}
			}
			if infos[r], err = WriteShard(ctx, root, step, p, s); err != nil {
				t.Fatal(err)
			}
		}
		if step == killStep && at == "uncommitted" {
			pause()
		}
		if err := Commit(context.Background(), root, step, p, infos); err != nil {
			t.Fatal(err)
		}
	}
	if at == "committed" {
		pause()
	}
	t.Fatalf("unknown kill point %q", at)
}

// TestPrune: the newest keep committed steps stay, older ones go, and so
// do incomplete steps older than the oldest kept; an incomplete step newer
// than that (being written), the floor and every later step, and other
// entries are left alone.
func TestPrune(t *testing.T) {
	p, _ := NewPartition(vecTensors(100), 2, nil)
	uncommitted := func(root string, step int64) {
		for r := range 2 {
			s, _ := ShardOf(p, r, randomState(uint64(step), 100))
			if _, err := WriteShard(t.Context(), root, step, p, s); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		keep        int
		floor       int64 // the commit a coordinator recorded: kept with what follows
		wantRemoved []int64
		wantLeft    []int64
	}{
		{keep: 0, wantLeft: []int64{3, 5, 6, 7, 8, 9}},
		{keep: 2, floor: 6, wantRemoved: []int64{3, 5}, wantLeft: []int64{6, 7, 8, 9}},
		{keep: 2, floor: 5, wantRemoved: []int64{3}, wantLeft: []int64{5, 6, 7, 8, 9}},
		{keep: 2, floor: 8, wantRemoved: []int64{3, 5, 6}, wantLeft: []int64{7, 8, 9}},
		{keep: 2, wantRemoved: []int64{3, 5, 6}, wantLeft: []int64{7, 8, 9}},
		{keep: 3, wantRemoved: []int64{3, 5}, wantLeft: []int64{6, 7, 8, 9}},
		{keep: 4, wantRemoved: []int64{3}, wantLeft: []int64{5, 6, 7, 8, 9}},
		{keep: 9, wantRemoved: []int64{3}, wantLeft: []int64{5, 6, 7, 8, 9}},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("keep %d floor %d", tc.keep, tc.floor), func(t *testing.T) {
			root := t.TempDir()
			uncommitted(root, 3) // a crash's leftover
			for _, s := range []int64{5, 6, 7, 8} {
				writeCheckpoint(t, root, s, p, randomState(uint64(s), 100))
			}
			uncommitted(root, 9) // being written
			os.Mkdir(filepath.Join(root, "notes"), 0o755)
			removed, err := Prune(t.Context(), root, tc.keep, tc.floor)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(removed, tc.wantRemoved) {
				t.Errorf("removed %v, want %v", removed, tc.wantRemoved)
			}
			entries, _ := os.ReadDir(root)
			if left := stepsIn(entries); !slices.Equal(left, tc.wantLeft) {
				t.Errorf("left %v, want %v", left, tc.wantLeft)
			}
			if _, err := os.Stat(filepath.Join(root, "notes")); err != nil {
				t.Errorf("a directory that is no step was removed: %v", err)
			}
			if got, err := LatestComplete(t.Context(), root); err != nil || got != 8 {
				t.Errorf("latest complete after pruning: %d, %v; want 8", got, err)
			}
		})
	}
	if _, err := Prune(t.Context(), t.TempDir(), 1, 0); err == nil {
		t.Error("keep 1 accepted")
	}
}
