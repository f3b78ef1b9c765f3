package sharding

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// Checkpoint layout and format constants.
const (
	// ManifestFile is the manifest's name inside a step directory. It is
	// written last: a step directory without it is incomplete.
	ManifestFile = "manifest.json"
	// ChunkBytes is the size of the pieces of a shard file that the manifest
	// checksums one by one, so a reader that needs only part of a file reads
	// and verifies only the chunks it touches. It is a multiple of 4, so no
	// float32 straddles two chunks.
	ChunkBytes = 1 << 20

	manifestFormat = "gpucoord-sharded-checkpoint"
	formatVersion  = 1
	shardMagic     = "GCSHARD\x01"
	stepPrefix     = "step-"
)

// Manifest describes a complete sharded checkpoint: what was sharded, how,
// and a checksum of every shard file.
type Manifest struct {
	// Format is always "gpucoord-sharded-checkpoint".
	Format string `json:"format"`
	// Version is the format version, 1.
	Version int `json:"version"`
	// Step is the training step the state belongs to.
	Step int64 `json:"step"`
	// Degree is the data-parallel degree the checkpoint was written at.
	Degree int `json:"degree"`
	// Align is the partition's alignment in elements.
	Align int `json:"align"`
	// Len is the flat length: the total number of tensor elements.
	Len int `json:"len"`
	// PaddedLen is Degree times ShardLen.
	PaddedLen int `json:"padded_len"`
	// ShardLen is every shard's number of elements per vector.
	ShardLen int `json:"shard_len"`
	// Tensors are the tensors, in flat-buffer order.
	Tensors []Tensor `json:"tensors"`
	// Vectors are the names of the state vectors, sorted; each shard file
	// holds them in this order.
	Vectors []string `json:"vectors"`
	// ChunkBytes is the chunk size of the per-chunk checksums.
	ChunkBytes int `json:"chunk_bytes"`
	// Shards describes each shard file, in rank order.
	Shards []ShardInfo `json:"shards"`
}

// ShardInfo describes one written shard file.
type ShardInfo struct {
	// Rank is the data-parallel rank the shard belongs to.
	Rank int `json:"rank"`
	// Range is the shard's block of the padded flat buffer.
	Range Range `json:"range"`
	// File is the file name inside the step directory.
	File string `json:"file"`
	// Size is the file size in bytes.
	Size int64 `json:"size"`
	// DataOffset is where the first vector starts in the file; the header
	// comes before it.
	DataOffset int64 `json:"data_offset"`
	// SHA256 is the file's checksum: the hex SHA-256 of its chunk digests
	// (the raw 32-byte SHA-256 of each chunk, in order), which hashes the
	// whole file in the same pass as the chunk checksums.
	SHA256 string `json:"sha256"`
	// Chunks holds the hex SHA-256 of each ChunkBytes piece of the file,
	// the last one possibly shorter.
	Chunks []string `json:"chunks"`
}

// StepDir returns the directory of step's checkpoint under root:
// <root>/step-<step>. A model split by tensor or pipeline parallelism has one
// flat buffer per (tp, pp) position, so each position uses its own root.
func StepDir(root string, step int64) string {
	return filepath.Join(root, stepPrefix+strconv.FormatInt(step, 10))
}

// ShardFile returns the name of rank r's shard file at degree d:
// shard-<r>-of-<d>.bin.
func ShardFile(r, d int) string { return fmt.Sprintf("shard-%d-of-%d.bin", r, d) }

// WriteShard writes sh, rank sh.Rank's shard of p, to its file in step's
// directory under root, atomically: a temporary file is written and
// fsynced, renamed into place, and the directory fsynced. The returned
// ShardInfo goes to Commit. Writing into a step that already has a manifest
// first removes the manifest, so the step reads as incomplete until Commit
// runs again. Each rank calls WriteShard for its own shard, concurrently if
// it likes.
func WriteShard(ctx context.Context, root string, step int64, p *Partition, sh *Shard) (ShardInfo, error) {
	if step < 0 {
		return ShardInfo{}, fmt.Errorf("%w: step %d is negative", ErrInvalid, step)
	}
	if sh == nil {
		return ShardInfo{}, fmt.Errorf("%w: nil shard", ErrInvalid)
	}
	if err := p.checkRank(sh.Rank); err != nil {
		return ShardInfo{}, err
	}
	slot := make([]*Shard, p.degree)
	slot[sh.Rank] = sh
	names, err := checkShards(p, slot, false)
	if err != nil {
		return ShardInfo{}, err
	}
	if len(names) == 0 {
		return ShardInfo{}, fmt.Errorf("%w: shard %d has no vectors", ErrInvalid, sh.Rank)
	}
	if err := checkVectorNames(names); err != nil {
		return ShardInfo{}, err
	}
	dir := StepDir(root, step)
	if err := makeDir(root); err != nil {
		return ShardInfo{}, err
	}
	if err := makeDir(dir); err != nil {
		return ShardInfo{}, err
	}
	if err := os.Remove(filepath.Join(dir, ManifestFile)); err == nil {
		if err := syncDir(dir); err != nil {
			return ShardInfo{}, err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return ShardInfo{}, fmt.Errorf("sharding: uncommit step %d: %w", step, err)
	}

	header := encodeShardHeader(step, p, sh.Rank, names)
	info := ShardInfo{
		Rank:       sh.Rank,
		Range:      sh.Range,
		File:       ShardFile(sh.Rank, p.degree),
		DataOffset: int64(len(header)),
	}
	var hw *hashWriter
	err = writeAtomic(dir, info.File, func(w io.Writer) error {
		hw = newHashWriter(w)
		if _, err := hw.Write(header); err != nil {
			return err
		}
		buf := make([]byte, 1<<20)
		for _, n := range names {
			if err := encodeFloats(ctx, hw, sh.Vectors[n], buf); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return ShardInfo{}, fmt.Errorf("sharding: write shard %d of step %d: %w", sh.Rank, step, err)
	}
	info.Size, info.SHA256, info.Chunks = hw.finish()
	return info, nil
}

// Commit writes the manifest of step, made of p and the ShardInfo of every
// rank, atomically and last: from then on the step is complete. It checks
// that every shard file is in place with its recorded size and a header that
// matches, reading only the headers, and afterwards removes temporary files
// of interrupted writes and shard files of another degree from the step
// directory. In a job of several processes one rank commits, with the infos
// the others sent it or read back with InspectShard.
func Commit(ctx context.Context, root string, step int64, p *Partition, infos []ShardInfo) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if step < 0 {
		return fmt.Errorf("%w: step %d is negative", ErrInvalid, step)
	}
	if len(infos) != p.degree {
		return fmt.Errorf("%w: %d shard infos for degree %d", ErrIncomplete, len(infos), p.degree)
	}
	infos = slices.Clone(infos)
	sort.Slice(infos, func(i, j int) bool { return infos[i].Rank < infos[j].Rank })
	dir := StepDir(root, step)
	var names []string
	for i, s := range infos {
		if s.Rank != i {
			return fmt.Errorf("%w: no shard info for rank %d", ErrIncomplete, i)
		}
		if s.File != ShardFile(i, p.degree) {
			return fmt.Errorf("%w: shard info %d names file %q, want %q", ErrMismatch, i, s.File, ShardFile(i, p.degree))
		}
		h, err := statShard(dir, s)
		if err != nil {
			return fmt.Errorf("shard %d of step %d: %w", i, step, err)
		}
		if err := h.check(step, p, i); err != nil {
			return fmt.Errorf("shard file %s: %w", s.File, err)
		}
		if i == 0 {
			names = h.vectors
		} else if !slices.Equal(h.vectors, names) {
			return fmt.Errorf("%w: shard %d holds vectors %q, shard 0 holds %q", ErrMismatch, i, h.vectors, names)
		}
	}
	m := &Manifest{
		Format: manifestFormat, Version: formatVersion, Step: step,
		Degree: p.degree, Align: p.align, Len: p.n, PaddedLen: p.PaddedLen(), ShardLen: p.shard,
		Tensors: p.Tensors(), Vectors: names, ChunkBytes: ChunkBytes, Shards: infos,
	}
	if _, err := m.partition(ErrMismatch); err != nil {
		return err
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("sharding: encode manifest: %w", err)
	}
	err = writeAtomic(dir, ManifestFile, func(w io.Writer) error {
		_, err := w.Write(append(data, '\n'))
		return err
	})
	if err != nil {
		return fmt.Errorf("sharding: commit step %d: %w", step, err)
	}
	tidy(dir, m)
	return nil
}

// tidy removes, best effort, what a committed step directory does not need:
// temporary files of interrupted writes and shard files of another degree.
func tidy(dir string, m *Manifest) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		var r, d int
		stray := strings.HasPrefix(name, ".") && strings.Contains(name, ".tmp-")
		if n, err := fmt.Sscanf(name, "shard-%d-of-%d.bin", &r, &d); err == nil && n == 2 && d != m.Degree {
			stray = true
		}
		if stray && e.Type().IsRegular() {
			os.Remove(filepath.Join(dir, name))
		}
	}
}

// InspectShard reads rank r's shard file of step in full, checks its header
// against p and step, and returns its ShardInfo with fresh checksums.
func InspectShard(ctx context.Context, root string, step int64, p *Partition, r int) (ShardInfo, error) {
	if err := p.checkRank(r); err != nil {
		return ShardInfo{}, err
	}
	info, h, err := inspect(ctx, StepDir(root, step), ShardFile(r, p.degree))
	if err != nil {
		return ShardInfo{}, err
	}
	if err := h.check(step, p, r); err != nil {
		return ShardInfo{}, fmt.Errorf("shard file %s: %w", info.File, err)
	}
	if want := info.DataOffset + int64(len(h.vectors))*int64(p.shard)*4; info.Size != want {
		return ShardInfo{}, fmt.Errorf("%w: shard file %s has %d bytes, want %d", ErrCorrupt, info.File, info.Size, want)
	}
	info.Rank, info.Range = r, p.blockOf(r)
	return info, nil
}

// inspect reads a shard file in full and returns its header, size and
// checksums (Rank and Range are left for the caller).
func inspect(ctx context.Context, dir, name string) (ShardInfo, shardHeader, error) {
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		return ShardInfo{}, shardHeader{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	defer f.Close()
	hw := newHashWriter(io.Discard)
	br := bufio.NewReaderSize(io.TeeReader(f, hw), 1<<20)
	h, err := readShardHeader(br)
	if err != nil {
		return ShardInfo{}, shardHeader{}, fmt.Errorf("%w: shard file %s: %w", ErrCorrupt, name, err)
	}
	if err := checkVectorNames(h.vectors); err != nil || len(h.vectors) == 0 || !slices.IsSorted(h.vectors) {
		return ShardInfo{}, shardHeader{}, fmt.Errorf("%w: shard file %s has vector names %q", ErrCorrupt, name, h.vectors)
	}
	buf := make([]byte, 64<<10)
	for {
		if err := ctx.Err(); err != nil {
			return ShardInfo{}, shardHeader{}, err
		}
		_, err := br.Read(buf)
		if err == io.EOF {
			break
		}
		if err != nil {
			return ShardInfo{}, shardHeader{}, fmt.Errorf("sharding: read %s: %w", name, err)
		}
	}
	info := ShardInfo{File: name, DataOffset: int64(h.size)}
	info.Size, info.SHA256, info.Chunks = hw.finish()
	return info, h, nil
}

// ReadManifest reads and checks step's manifest. A step without one is
// incomplete (ErrIncomplete); a manifest that does not parse or contradicts
// itself is ErrCorrupt.
func ReadManifest(ctx context.Context, root string, step int64) (*Manifest, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(StepDir(root, step), ManifestFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: step %d has no manifest: %w", ErrIncomplete, step, err)
	}
	if err != nil {
		return nil, fmt.Errorf("sharding: read manifest of step %d: %w", step, err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	m := new(Manifest)
	if err := dec.Decode(m); err != nil {
		return nil, fmt.Errorf("%w: manifest of step %d: %w", ErrCorrupt, step, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: manifest of step %d has trailing data", ErrCorrupt, step)
	}
	if m.Step != step {
		return nil, fmt.Errorf("%w: manifest in step %d's directory says step %d", ErrCorrupt, step, m.Step)
	}
	if _, err := m.partition(ErrCorrupt); err != nil {
		return nil, err
	}
	return m, nil
}

// partition rebuilds the Partition the manifest was written with and checks
// every field against it, reporting a contradiction as kind.
func (m *Manifest) partition(kind error) (*Partition, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: manifest of step %d: %s", kind, m.Step, fmt.Sprintf(format, args...))
	}
	if m.Format != manifestFormat || m.Version != formatVersion {
		return nil, bad("format %q version %d, want %q version %d", m.Format, m.Version, manifestFormat, formatVersion)
	}
	p, err := NewPartition(m.Tensors, m.Degree, &Config{Align: m.Align})
	if err != nil {
		return nil, bad("%v", err)
	}
	if m.Len != p.n || m.PaddedLen != p.PaddedLen() || m.ShardLen != p.shard {
		return nil, bad("lengths %d/%d/%d, the tensors give %d/%d/%d", m.Len, m.PaddedLen, m.ShardLen, p.n, p.PaddedLen(), p.shard)
	}
	if err := checkVectorNames(m.Vectors); err != nil || len(m.Vectors) == 0 || !slices.IsSorted(m.Vectors) {
		return nil, bad("vector names %q are not sorted, unique and short", m.Vectors)
	}
	if m.ChunkBytes <= 0 || m.ChunkBytes%4 != 0 {
		return nil, bad("chunk size %d is not a positive multiple of 4", m.ChunkBytes)
	}
	if len(m.Shards) != p.degree {
		return nil, bad("%d shards for degree %d", len(m.Shards), p.degree)
	}
	off := int64(headerLen(m.Vectors))
	size := off + int64(len(m.Vectors))*int64(p.shard)*4
	chunks := int((size + int64(m.ChunkBytes) - 1) / int64(m.ChunkBytes))
	for i, s := range m.Shards {
		if s.Rank != i || s.Range != p.blockOf(i) || s.File != ShardFile(i, p.degree) {
			return nil, bad("shard %d is rank %d range %v file %q, want range %v file %q", i, s.Rank, s.Range, s.File, p.blockOf(i), ShardFile(i, p.degree))
		}
		if s.DataOffset != off || s.Size != size || len(s.Chunks) != chunks {
			return nil, bad("shard %d has data offset %d, size %d, %d chunks; want %d, %d, %d", i, s.DataOffset, s.Size, len(s.Chunks), off, size, chunks)
		}
		digests := make([]byte, 0, len(s.Chunks)*sha256.Size)
		for _, h := range s.Chunks {
			b, err := hex.DecodeString(h)
			if err != nil || len(b) != sha256.Size {
				return nil, bad("shard %d has chunk checksum %q, not hex SHA-256", i, h)
			}
			digests = append(digests, b...)
		}
		if fileChecksum(digests) != s.SHA256 {
			return nil, bad("shard %d checksum %q does not match its chunk checksums", i, s.SHA256)
		}
	}
	return p, nil
}

// ReadShard loads rank r's shard of p from step's checkpoint under root,
// whatever data-parallel degree the checkpoint was written at, as long as it
// lays out the same tensors. It reads only the chunks of the old shard files
// that overlap the new shard and verifies each chunk's SHA-256 before using
// it. Errors: ErrIncomplete without a manifest, ErrCorrupt for a checksum
// that does not match or a missing or truncated file, ErrMismatch when p
// lays out other tensors.
func ReadShard(ctx context.Context, root string, step int64, p *Partition, r int) (*Shard, error) {
	if err := p.checkRank(r); err != nil {
		return nil, err
	}
	m, err := ReadManifest(ctx, root, step)
	if err != nil {
		return nil, err
	}
	old, err := m.partition(ErrCorrupt)
	if err != nil {
		return nil, err
	}
	if err := compatible(old, p); err != nil {
		return nil, fmt.Errorf("checkpoint step %d: %w", step, err)
	}
	out, err := NewShard(p, r, m.Vectors...)
	if err != nil {
		return nil, err
	}
	dir := StepDir(root, step)
	buf := make([]byte, m.ChunkBytes)
	for _, t := range transfersTo(old, p, r) {
		if err := readRun(ctx, dir, m, t, out, buf); err != nil {
			return nil, fmt.Errorf("checkpoint step %d: %w", step, err)
		}
	}
	return out, nil
}

// readRun copies transfer t of every vector out of its old shard file into
// out, reading and verifying only the chunks it touches. buf holds one chunk.
func readRun(ctx context.Context, dir string, m *Manifest, t Transfer, out *Shard, buf []byte) error {
	info := m.Shards[t.Src]
	f, err := os.Open(filepath.Join(dir, info.File))
	if err != nil {
		return fmt.Errorf("%w: shard %d: %w", ErrCorrupt, t.Src, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("sharding: stat shard %d: %w", t.Src, err)
	}
	if st.Size() != info.Size {
		return fmt.Errorf("%w: shard file %s has %d bytes, the manifest says %d (truncated or replaced)", ErrCorrupt, info.File, st.Size(), info.Size)
	}
	cb := int64(m.ChunkBytes)
	loaded := int64(-1)
	for vi, name := range m.Vectors {
		lo := info.DataOffset + (int64(vi)*int64(m.ShardLen)+int64(t.SrcOff))*4
		hi := lo + int64(t.Len)*4
		dst := out.Vectors[name][t.DstOff : t.DstOff+t.Len]
		for c := lo / cb; c*cb < hi; c++ {
			if c != loaded {
				if err := ctx.Err(); err != nil {
					return err
				}
				n := min(cb, info.Size-c*cb)
				if _, err := f.ReadAt(buf[:n], c*cb); err != nil {
					return fmt.Errorf("%w: shard file %s chunk %d: %w", ErrCorrupt, info.File, c, err)
				}
				sum := sha256.Sum256(buf[:n])
				if hex.EncodeToString(sum[:]) != info.Chunks[c] {
					return fmt.Errorf("%w: shard file %s chunk %d (bytes %d-%d) fails its SHA-256", ErrCorrupt, info.File, c, c*cb, c*cb+n)
				}
				loaded = c
			}
			a, b := max(lo, c*cb), min(hi, (c+1)*cb)
			decodeFloats(dst[(a-lo)/4:(b-lo)/4], buf[a-c*cb:b-c*cb])
		}
	}
	return nil
}

// Verify reads every shard file of step in full and checks it against the
// manifest's checksums and header.
func Verify(ctx context.Context, root string, step int64) error {
	m, err := ReadManifest(ctx, root, step)
	if err != nil {
		return err
	}
	p, err := m.partition(ErrCorrupt)
	if err != nil {
		return err
	}
	dir := StepDir(root, step)
	for r, want := range m.Shards {
		got, h, err := inspect(ctx, dir, want.File)
		if err != nil {
			return err
		}
		if got.SHA256 != want.SHA256 || got.Size != want.Size {
			return fmt.Errorf("%w: shard file %s fails its SHA-256", ErrCorrupt, want.File)
		}
		// Same bytes as written; the header still has to be what the
		// manifest says, in case the manifest was edited.
		if err := h.check(step, p, r); err != nil || !slices.Equal(h.vectors, m.Vectors) {
			return fmt.Errorf("%w: shard file %s does not match the manifest: %v", ErrCorrupt, want.File, err)
		}
	}
	return nil
}

// LatestComplete returns the highest step under root whose manifest reads
// and whose shard files are all present with their recorded sizes. Steps
// without a manifest (a crash mid-write) are skipped. It does not hash the
// files; ReadShard verifies what it reads, and Verify checks everything.
func LatestComplete(ctx context.Context, root string) (int64, error) {
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("%w under %s: %w", ErrNoCheckpoint, root, err)
	}
	if err != nil {
		return 0, fmt.Errorf("sharding: list %s: %w", root, err)
	}
	steps := stepsIn(entries)
	for _, step := range slices.Backward(steps) {
		m, err := ReadManifest(ctx, root, step)
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if err != nil {
			continue
		}
		complete := true
		for _, s := range m.Shards {
			st, err := os.Stat(filepath.Join(StepDir(root, step), s.File))
			if err != nil || st.Size() != s.Size {
				complete = false
				break
			}
		}
		if complete {
			return step, nil
		}
	}
	return 0, fmt.Errorf("%w under %s", ErrNoCheckpoint, root)
}

// stepsIn returns the steps of the step directories among entries, in
// increasing order.
func stepsIn(entries []fs.DirEntry) []int64 {
	var steps []int64
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), stepPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		if n, err := strconv.ParseInt(rest, 10, 64); err == nil && n >= 0 && strconv.FormatInt(n, 10) == rest {
			steps = append(steps, n)
		}
	}
	slices.Sort(steps)
	return steps
}

// CheckKeep says why keep cannot be the number of committed steps Prune
// keeps, or nil: 0 (every one) or at least 2, since the step a
// coordinator has recorded as committed may be one behind the newest on
// disk.
func CheckKeep(keep int) error {
	if keep < 0 || keep == 1 {
		return errors.New("want 0 (every one) or at least 2 (the step recorded as committed may be one behind the newest)")
	}
	return nil
}

// Prune removes all but the newest keep committed steps under root (those
// with a manifest), and the incomplete step directories older than the
// oldest kept (what a crash mid-write left). Incomplete steps newer than
// that are left alone: they may be being written. Nothing at or after
// floor is removed either (0: no floor): the step a coordinator recorded
// as the job's commit, which a generation that replaces this one may be
// restoring however many steps this one has written since. keep must pass
// CheckKeep; 0 keeps everything. It returns the steps removed.
func Prune(ctx context.Context, root string, keep int, floor int64) ([]int64, error) {
	if err := CheckKeep(keep); err != nil {
		return nil, fmt.Errorf("sharding: keep %d checkpoints: %w", keep, err)
	}
	if keep == 0 {
		return nil, nil
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("sharding: list %s: %w", root, err)
	}
	steps := stepsIn(entries)
	var committed []int64
	for _, step := range steps {
		if _, err := ReadManifest(ctx, root, step); err == nil {
			committed = append(committed, step)
		} else if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	if len(committed) == 0 {
		return nil, nil
	}
	oldest := committed[max(0, len(committed)-keep)]
	if floor > 0 {
		oldest = min(oldest, floor)
	}
	var removed []int64
	for _, step := range steps {
		if step >= oldest {
			break
		}
		if err := os.RemoveAll(StepDir(root, step)); err != nil {
			return removed, fmt.Errorf("sharding: prune step %d: %w", step, err)
		}
		removed = append(removed, step)
	}
	return removed, nil
}

// shardHeader is the decoded header of a shard file.
type shardHeader struct {
	step         int64
	rank, degree int
	lo, hi, len  int
	layout       uint64 // Partition.layout of the tensors
	vectors      []string
	size         int // header bytes, padding included
}

// check reports a header that is not rank r's of p at step.
func (h shardHeader) check(step int64, p *Partition, r int) error {
	blk := p.blockOf(r)
	if h.step != step || h.rank != r || h.degree != p.degree || h.lo != blk.Lo || h.hi != blk.Hi || h.len != p.n || h.layout != p.layout() {
		return fmt.Errorf("%w: header says step %d rank %d of %d range [%d, %d) length %d layout %016x, want step %d rank %d of %d range %v length %d layout %016x",
			ErrMismatch, h.step, h.rank, h.degree, h.lo, h.hi, h.len, h.layout, step, r, p.degree, blk, p.n, p.layout())
	}
	return nil
}

const fixedHeader = 64 // magic 8, version 4, nvec 4, step 8, rank 4, degree 4, lo 8, hi 8, len 8, layout 8

// maxVectors bounds the vector count a header may claim, so a corrupt
// header cannot make a reader allocate without bound.
const maxVectors = 1 << 10

// headerLen returns the header size for the given vector names: the fixed
// part, each name with a 2-byte length, padded to a multiple of 8 so the
// float32 data stays aligned.
func headerLen(names []string) int {
	n := fixedHeader
	for _, s := range names {
		n += 2 + len(s)
	}
	return (n + 7) &^ 7
}

// encodeShardHeader returns the header of rank r's shard file. All
// integers are little-endian; so is the float32 data that follows.
func encodeShardHeader(step int64, p *Partition, r int, names []string) []byte {
	b := make([]byte, 0, headerLen(names))
	b = append(b, shardMagic...)
	b = binary.LittleEndian.AppendUint32(b, formatVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(names)))
	b = binary.LittleEndian.AppendUint64(b, uint64(step))
	b = binary.LittleEndian.AppendUint32(b, uint32(r))
	b = binary.LittleEndian.AppendUint32(b, uint32(p.degree))
	blk := p.blockOf(r)
	b = binary.LittleEndian.AppendUint64(b, uint64(blk.Lo))
	b = binary.LittleEndian.AppendUint64(b, uint64(blk.Hi))
	b = binary.LittleEndian.AppendUint64(b, uint64(p.n))
	b = binary.LittleEndian.AppendUint64(b, p.layout())
	for _, s := range names {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	return b[:headerLen(names)]
}

// readShardHeader decodes a header from the start of r.
func readShardHeader(r io.Reader) (shardHeader, error) {
	fixed := make([]byte, fixedHeader)
	if _, err := io.ReadFull(r, fixed); err != nil {
		return shardHeader{}, fmt.Errorf("header: %w", err)
	}
	if string(fixed[:8]) != shardMagic {
		return shardHeader{}, fmt.Errorf("not a shard file (magic %q)", fixed[:8])
	}
	le := binary.LittleEndian
	if v := le.Uint32(fixed[8:]); v != formatVersion {
		return shardHeader{}, fmt.Errorf("shard format version %d, want %d", v, formatVersion)
	}
	nvec := le.Uint32(fixed[12:])
	if nvec > maxVectors {
		return shardHeader{}, fmt.Errorf("header claims %d vectors", nvec)
	}
	h := shardHeader{
		step:   int64(le.Uint64(fixed[16:])),
		rank:   int(le.Uint32(fixed[24:])),
		degree: int(le.Uint32(fixed[28:])),
		lo:     int(le.Uint64(fixed[32:])),
		hi:     int(le.Uint64(fixed[40:])),
		len:    int(le.Uint64(fixed[48:])),
		layout: le.Uint64(fixed[56:]),
	}
	var l [2]byte
	for range nvec {
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return shardHeader{}, fmt.Errorf("header: %w", err)
		}
		name := make([]byte, le.Uint16(l[:]))
		if _, err := io.ReadFull(r, name); err != nil {
			return shardHeader{}, fmt.Errorf("header: %w", err)
		}
		h.vectors = append(h.vectors, string(name))
	}
	h.size = headerLen(h.vectors)
	pad := h.size - fixedHeader
	for _, s := range h.vectors {
		pad -= 2 + len(s)
	}
	if _, err := io.ReadFull(r, make([]byte, pad)); err != nil {
		return shardHeader{}, fmt.Errorf("header: %w", err)
	}
	return h, nil
}

// statShard checks that a written shard file has the size its info says and
// returns its header.
func statShard(dir string, s ShardInfo) (shardHeader, error) {
	f, err := os.Open(filepath.Join(dir, s.File))
	if err != nil {
		return shardHeader{}, fmt.Errorf("%w: %w", ErrIncomplete, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return shardHeader{}, err
	}
	if st.Size() != s.Size {
		return shardHeader{}, fmt.Errorf("%w: %s has %d bytes, its info says %d", ErrMismatch, s.File, st.Size(), s.Size)
	}
	h, err := readShardHeader(bufio.NewReader(f))
	if err != nil {
		return shardHeader{}, fmt.Errorf("%w: %s: %w", ErrCorrupt, s.File, err)
	}
	return h, nil
}

// checkVectorNames accepts unique, non-empty names that fit the header's
// 2-byte length.
func checkVectorNames(names []string) error {
	if len(names) > maxVectors {
		return fmt.Errorf("%w: %d vectors, at most %d", ErrInvalid, len(names), maxVectors)
	}
	seen := make(map[string]bool, len(names))
	for _, n := range names {
		if n == "" || len(n) > math.MaxUint16 || seen[n] {
			return fmt.Errorf("%w: vector name %q is empty, too long or repeated", ErrInvalid, n)
		}
		seen[n] = true
	}
	return nil
}

// littleEndian is true on hosts whose float32 memory layout is the file's,
// where floats are copied as bytes instead of converted one by one.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// floatBytes views v's memory as bytes.
func floatBytes(v []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
}

// decodeFloats fills dst from little-endian float32 bytes in src
// (len(src) == 4*len(dst)).
func decodeFloats(dst []float32, src []byte) {
	if littleEndian {
		copy(floatBytes(dst), src)
		return
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

// encodeFloats writes v to w as little-endian float32, in pieces of at
// most len(buf) bytes, checking ctx between pieces.
func encodeFloats(ctx context.Context, w io.Writer, v []float32, buf []byte) error {
	for len(v) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		k := min(len(v), len(buf)/4)
		out := floatBytes(v[:k])
		if !littleEndian {
			for i, x := range v[:k] {
				binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
			}
			out = buf[:4*k]
		}
		if _, err := w.Write(out); err != nil {
			return err
		}
		v = v[k:]
	}
	return nil
}

// hashWriter passes writes through to w and keeps the SHA-256 of each
// ChunkBytes piece; the file's checksum is the SHA-256 of those digests, so
// one hashing pass gives both.
type hashWriter struct {
	w       io.Writer
	chunk   hash.Hash
	n       int64
	inChunk int
	digests []byte // raw chunk digests, in order
}

func newHashWriter(w io.Writer) *hashWriter {
	return &hashWriter{w: w, chunk: sha256.New()}
}

// Write implements io.Writer.
func (h *hashWriter) Write(p []byte) (int, error) {
	n, err := h.w.Write(p)
	p = p[:n]
	h.n += int64(n)
	for len(p) > 0 {
		k := min(len(p), ChunkBytes-h.inChunk)
		h.chunk.Write(p[:k])
		h.inChunk += k
		p = p[k:]
		if h.inChunk == ChunkBytes {
			h.endChunk()
		}
	}
	return n, err
}

func (h *hashWriter) endChunk() {
	h.digests = h.chunk.Sum(h.digests)
	h.chunk.Reset()
	h.inChunk = 0
}

// finish returns the byte count, the file checksum and the chunk checksums.
func (h *hashWriter) finish() (int64, string, []string) {
	if h.inChunk > 0 {
		h.endChunk()
	}
	chunks := make([]string, 0, len(h.digests)/sha256.Size)
	for d := range slices.Chunk(h.digests, sha256.Size) {
		chunks = append(chunks, hex.EncodeToString(d))
	}
	return h.n, fileChecksum(h.digests), chunks
}

// fileChecksum returns the hex SHA-256 of the concatenated raw chunk
// digests.
func fileChecksum(digests []byte) string {
	sum := sha256.Sum256(digests)
	return hex.EncodeToString(sum[:])
}

// writeAtomic writes name in dir through a temporary file: write, fsync,
// rename, fsync the directory. On error the temporary file is removed and
// any earlier file of that name is left as it was.
func writeAtomic(dir, name string, write func(io.Writer) error) (err error) {
	f, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	if err = write(bw); err != nil {
		return err
	}
	if err = bw.Flush(); err != nil {
		return err
	}
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	return syncDir(dir)
}

// makeDir creates dir if needed and fsyncs its parent so the new entry is
// durable.
func makeDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("sharding: %w", err)
	}
	return syncDir(filepath.Dir(dir))
}

// syncDir fsyncs a directory, making renames and creations in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sharding: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sharding: fsync %s: %w", dir, err)
	}
	return nil
}

// Seal commits step under root from the shard files alone, when the ranks
// that wrote them could not read each other's files (each wrote on its own
// node, and the files were gathered here afterwards): it finds the degree
// from the files' names, checks every shard file of it in full against its
// header and commits the manifest (Commit). A step that has a manifest is
// left as it is. Several processes may seal the same step at once: they
// take turns (a lock file in the step's directory).
func Seal(ctx context.Context, root string, step int64, tensors []Tensor, cfg *Config) error {
	dir := StepDir(root, step)
	lock, err := os.OpenFile(filepath.Join(dir, ".seal.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("%w: step %d: %v", ErrIncomplete, step, err)
	}
	defer lock.Close() // releases the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("sharding: seal step %d: %w", step, err)
	}
	if _, err := os.Stat(filepath.Join(dir, ManifestFile)); err == nil {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("%w: step %d: %v", ErrIncomplete, step, err)
	}
	degree := 0
	for _, e := range entries {
		var r, d int
		if n, err := fmt.Sscanf(e.Name(), "shard-%d-of-%d.bin", &r, &d); err == nil && n == 2 && e.Name() == ShardFile(r, d) {
			if degree != 0 && d != degree {
				return fmt.Errorf("%w: step %d holds shards of degrees %d and %d", ErrMismatch, step, degree, d)
			}
			degree = d
		}
	}
	if degree == 0 {
		return fmt.Errorf("%w: step %d has no shard files in %s", ErrIncomplete, step, dir)
	}
	p, err := NewPartition(tensors, degree, cfg)
	if err != nil {
		return err
	}
	infos := make([]ShardInfo, degree)
	for r := range degree {
		if infos[r], err = InspectShard(ctx, root, step, p, r); err != nil {
			return err
		}
	}
	return Commit(ctx, root, step, p, infos)
}
