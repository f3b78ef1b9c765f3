// Package ranklog keeps what a node's ranks print, for the commands that
// show it: a ring of each job's recent lines that launch follows while a
// generation runs, and a bounded log file per rank that gpucoord logs
// reads after. An agent serves both over its node server (Handle); Client
// reads them.
package ranklog

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// Limits bound what a Store keeps.
type Limits struct {
	// RingBytes bounds the recent lines of one job kept in memory for
	// followers (a follower that falls further behind is told how many
	// lines it missed).
	RingBytes int
	// RankBytes bounds the log file of one rank: at half of it the file
	// is rotated once (rank-R.log.1), so that at most about RankBytes
	// stays on disk.
	RankBytes int64
	// Jobs bounds the jobs whose log files are kept after they end; the
	// least recently written go first.
	Jobs int
	// LineBytes bounds one line; a longer one is cut, and ends "…".
	LineBytes int
}

// DefaultLimits are an agent's limits: 4 MiB of recent lines per job,
// 2 MiB of log per rank, the logs of the last 32 jobs.
var DefaultLimits = Limits{RingBytes: 4 << 20, RankBytes: 2 << 20, Jobs: 32, LineBytes: 64 << 10}

// Store keeps the output of a node's ranks. Its methods are safe for
// concurrent use.
type Store struct {
	dir  string
	lim  Limits
	log  *slog.Logger
	node string

	mu   sync.Mutex
	jobs map[string]*jobLog
	// added is closed and replaced when a job is first recorded, for the
	// followers of jobs not heard of yet.
	added chan struct{}
	// over lists the jobs that ended, oldest first: their lines stay for
	// the followers that come late (a job that ends within a second of
	// starting), up to keepOver jobs.
	over []string
}

// keepOver bounds the ended jobs whose recent lines a Store keeps.
const keepOver = 8

// jobLog is one job's output on this node.
type jobLog struct {
	lines []line // recent lines, oldest first
	first int64  // seq of lines[0]; the next line gets first+len(lines)
	bytes int
	// started is the seq of the first line of each generation; stopped
	// holds the generations whose ranks on this node have all stopped.
	started map[int64]int64
	stopped map[int64]bool
	// wake is closed and replaced at each change, for followers.
	wake  chan struct{}
	files map[int]*os.File // open rank logs
	sizes map[int]int64
	// ended says the job ended everywhere: no line is to come.
	ended bool
}

type line struct {
	gen  int64
	rank int
	text []byte // as printed, tag and newline included
}

// New returns a Store keeping its log files under dir (one directory per
// job), for the node named node.
func New(dir, node string, lim Limits, log *slog.Logger) *Store {
	return &Store{dir: dir, node: node, lim: lim, log: log, jobs: map[string]*jobLog{}, added: make(chan struct{})}
}

// job returns job's output, created empty when new. s.mu is held.
func (s *Store) job(job string) *jobLog {
	j := s.jobs[job]
	if j == nil {
		j = &jobLog{first: 1, started: map[int64]int64{}, stopped: map[int64]bool{}, wake: make(chan struct{}),
			files: map[int]*os.File{}, sizes: map[int]int64{}}
		s.jobs[job] = j
		close(s.added)
		s.added = make(chan struct{})
	}
	return j
}

func (j *jobLog) changed() {
	close(j.wake)
	j.wake = make(chan struct{})
}

// Line records a line rank printed in generation gen of job: text is the
// line as shown, its tag and newline included. The Store keeps text: the
// caller must not change it after.
func (s *Store) Line(job string, gen int64, rank int, text []byte) {
	if s.lim.LineBytes > 0 && len(text) > s.lim.LineBytes {
		text = append(slices.Clip(text[:s.lim.LineBytes-4]), "…\n"...)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.job(job)
	if _, ok := j.started[gen]; !ok {
		j.started[gen] = j.first + int64(len(j.lines))
	}
	j.lines = append(j.lines, line{gen: gen, rank: rank, text: text})
	j.bytes += len(text)
	drop := 0
	for j.bytes > s.lim.RingBytes && drop < len(j.lines)-1 {
		j.bytes -= len(j.lines[drop].text)
		drop++
	}
	if drop > 0 {
		clear(j.lines[:drop])
		j.lines = j.lines[drop:]
		j.first += int64(drop)
	}
	j.changed()
	s.append(job, j, rank, text)
}

// append writes text to rank's log file, rotating it at half the bound.
// s.mu is held.
func (s *Store) append(job string, j *jobLog, rank int, text []byte) {
	f := j.files[rank]
	path := s.rankPath(job, rank)
	if f != nil && j.sizes[rank] >= s.lim.RankBytes/2 {
		f.Close()
		f = nil
		if err := os.Rename(path, path+".1"); err != nil {
			s.log.Warn("rotating a rank's log", "path", path, "err", err)
		}
	}
	if f == nil {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			s.log.Warn("a rank's log", "err", err)
			return
		}
		var err error
		if f, err = os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
			s.log.Warn("a rank's log", "err", err)
			return
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return
		}
		j.files[rank], j.sizes[rank] = f, fi.Size()
	}
	n, err := f.Write(text)
	j.sizes[rank] += int64(n)
	if err != nil {
		s.log.Warn("a rank's log", "path", path, "err", err)
	}
}

func (s *Store) rankPath(job string, rank int) string {
	return filepath.Join(s.dir, job, "rank-"+strconv.Itoa(rank)+".log")
}

// End says that generation gen of job has stopped on this node, every line
// of its ranks recorded: its followers end once they have read them.
func (s *Store) End(job string, gen int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.job(job)
	j.stopped[gen] = true
	j.closeFiles()
	j.changed()
}

// closeFiles closes the rank logs open for writing.
func (j *jobLog) closeFiles() {
	for r, f := range j.files {
		f.Close()
		delete(j.files, r)
	}
}

// Keep says that the jobs not in live have ended: their followers end once
// they have read every line, and the recent lines of all but the last
// few such jobs are forgotten. It removes the log files of all but the
// Limits.Jobs most recently written jobs.
func (s *Store) Keep(live []string) {
	s.mu.Lock()
	for name, j := range s.jobs {
		if slices.Contains(live, name) || j.ended {
			continue
		}
		j.ended = true
		j.closeFiles()
		j.changed()
		s.over = append(s.over, name)
	}
	for len(s.over) > keepOver {
		if j := s.jobs[s.over[0]]; j != nil && j.ended {
			delete(s.jobs, s.over[0])
			close(j.wake)
		}
		s.over = s.over[1:]
	}
	s.mu.Unlock()
	entries, err := os.ReadDir(s.dir)
	if err != nil || len(entries) <= s.lim.Jobs {
		return
	}
	type dir struct {
		name string
		mod  time.Time
	}
	var dirs []dir
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && e.IsDir() {
			dirs = append(dirs, dir{e.Name(), newest(filepath.Join(s.dir, e.Name()), fi.ModTime())})
		}
	}
	sort.Slice(dirs, func(a, b int) bool { return dirs[a].mod.After(dirs[b].mod) })
	for _, d := range dirs[min(s.lim.Jobs, len(dirs)):] {
		if slices.Contains(live, d.name) || pb.CheckJobID(d.name) != nil {
			continue // not a job's: nothing of gpucoord's
		}
		if err := os.RemoveAll(filepath.Join(s.dir, d.name)); err != nil {
			s.log.Warn("removing an old job's logs", "job", d.name, "err", err)
		}
	}
}

// newest is the latest modification time of the files in dir, or def.
func newest(dir string, def time.Time) time.Time {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && fi.ModTime().After(def) {
			def = fi.ModTime()
		}
	}
	return def
}

// batch is what a follower reads at once.
type batch struct {
	text    []byte
	next    int64 // the cursor after it
	dropped int64 // lines of the generation gone from the ring unread
	done    bool  // the generation ended and everything of it is read
	wake    <-chan struct{}
	job     *jobLog
}

// read returns the lines of generation gen (of rank, or all ranks when rank
// < 0) after cursor (0: from the generation's first line).
func (s *Store) read(job string, gen int64, rank int, cursor int64) batch {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Asked before the node heard of the job, the follower waits for its
	// first line, with no record of the job made for it.
	j := s.jobs[job]
	if j == nil {
		return batch{wake: s.added}
	}
	b := batch{wake: j.wake, job: j}
	if cursor == 0 {
		if start, ok := j.started[gen]; ok {
			cursor = start
		} else {
			cursor = j.first + int64(len(j.lines)) // nothing of gen yet
		}
	}
	if cursor < j.first {
		b.dropped = j.first - cursor
		cursor = j.first
	}
	end := j.first + int64(len(j.lines))
	for _, l := range j.lines[cursor-j.first:] {
		if l.gen == gen && (rank < 0 || l.rank == rank) {
			b.text = append(b.text, l.text...)
		}
	}
	b.next = end
	b.done = j.stopped[gen] || j.ended
	return b
}

// follow writes generation gen's lines of job (rank's, or all when rank <
// 0) to w as they come, flushing after each batch, until the generation
// has ended on this node and all of its lines are written, the job is
// forgotten, or stop is closed.
func (s *Store) follow(w io.Writer, flush func(), job string, gen int64, rank int, stop <-chan struct{}) error {
	var cursor int64
	for {
		b := s.read(job, gen, rank, cursor)
		cursor = b.next
		if b.dropped > 0 {
			fmt.Fprintf(w, "[%s] %d lines of job %s on %s are not shown: the reader fell behind (gpucoord logs %s has them)\n",
				s.node, b.dropped, job, s.node, job)
		}
		if len(b.text) > 0 {
			if _, err := w.Write(b.text); err != nil {
				return err
			}
		}
		flush()
		if b.done {
			return nil
		}
		select {
		case <-stop:
			return nil
		case <-b.wake:
			if b.job != nil && s.forgotten(job, b.job) {
				// The job was forgotten (Keep): its last lines were read
				// above, or are gone with it.
				return nil
			}
		}
	}
}

// forgotten says whether job's output j was dropped (Keep).
func (s *Store) forgotten(job string, j *jobLog) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.jobs[job] != j
}

// logs writes the log files of job's ranks (rank's, or all this node
// holds when rank < 0) to w, oldest lines first; false when it holds none.
func (s *Store) logs(w io.Writer, job string, rank int) (bool, error) {
	var ranks []int
	if rank >= 0 {
		ranks = []int{rank}
	} else {
		entries, _ := os.ReadDir(filepath.Join(s.dir, job))
		for _, e := range entries {
			n, ok := strings.CutPrefix(e.Name(), "rank-")
			n, ok2 := strings.CutSuffix(n, ".log")
			if r, err := strconv.Atoi(n); ok && ok2 && err == nil {
				ranks = append(ranks, r)
			}
		}
		slices.Sort(ranks)
	}
	found := false
	for _, r := range ranks {
		for _, p := range []string{s.rankPath(job, r) + ".1", s.rankPath(job, r)} {
			f, err := os.Open(p)
			if err != nil {
				continue
			}
			found = true
			_, err = io.Copy(w, f)
			f.Close()
			if err != nil {
				return found, err
			}
		}
	}
	return found, nil
}
