package shm

import (
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Ring layout: a page of control words, then the data. Each side's words
// sit on their own cache line.
const (
	offTail      = 0   // uint64: bytes written (producer)
	offTailSeq   = 64  // uint32 futex: bumped when the producer wakes the consumer
	offConsWait  = 68  // uint32: 1 while the consumer sleeps
	offProdDone  = 72  // uint32: 1 once the producer closed
	offHead      = 128 // uint64: bytes consumed (consumer)
	offHeadSeq   = 192 // uint32 futex: bumped when the consumer wakes the producer
	offProdWait  = 196 // uint32: 1 while the producer sleeps
	offConsDone  = 200 // uint32: 1 once the consumer closed
	ctrlSize     = 4096
	spinChecks   = 200
	yieldChecks  = 100
	futexWait    = 0
	futexWake    = 1
	futexTimeout = 20 * time.Millisecond
)

// ring is one direction of one pair, mapped in this process.
type ring struct {
	path     string
	mem      []byte
	data     []byte
	mask     uint64
	tail     *atomic.Uint64
	tailSeq  *atomic.Uint32
	consWait *atomic.Uint32
	prodDone *atomic.Uint32
	head     *atomic.Uint64
	headSeq  *atomic.Uint32
	prodWait *atomic.Uint32
	consDone *atomic.Uint32
	ts       syscall.Timespec
}

func newRing(mem []byte, path string) *ring {
	p := unsafe.Pointer(unsafe.SliceData(mem))
	at := func(off uintptr) unsafe.Pointer { return unsafe.Add(p, off) }
	return &ring{
		path: path, mem: mem, data: mem[ctrlSize:], mask: uint64(len(mem) - ctrlSize - 1),
		tail: (*atomic.Uint64)(at(offTail)), tailSeq: (*atomic.Uint32)(at(offTailSeq)),
		consWait: (*atomic.Uint32)(at(offConsWait)), prodDone: (*atomic.Uint32)(at(offProdDone)),
		head: (*atomic.Uint64)(at(offHead)), headSeq: (*atomic.Uint32)(at(offHeadSeq)),
		prodWait: (*atomic.Uint32)(at(offProdWait)), consDone: (*atomic.Uint32)(at(offConsDone)),
		ts: syscall.NsecToTimespec(int64(futexTimeout)),
	}
}

// waitFor blocks until ready() holds, spinning, then yielding, then
// sleeping on the futex word seq with the flag waiting raised. stop is
// checked between sleeps (at least every futexTimeout); a non-nil result
// ends the wait with that error.
func (r *ring) waitFor(ready func() bool, seq, waiting *atomic.Uint32, stop func() error) error {
	for range spinChecks {
		if ready() {
			return nil
		}
	}
	// Then poll while letting other processes run, as OpenMPI's shared
	// memory transport does; sleeping on the futex costs a wake-up that,
	// with more ranks than cores, is the dominant latency.
	for range yieldChecks {
		runtime.Gosched()
		syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
		if ready() {
			return nil
		}
	}
	for {
		s := seq.Load()
		waiting.Store(1)
		if ready() {
			waiting.Store(0)
			return nil
		}
		futex(seq, futexWait, s, &r.ts)
		waiting.Store(0)
		if ready() {
			return nil
		}
		if err := stop(); err != nil {
			return err
		}
	}
}

// wake bumps seq and wakes a sleeper if the flag says one is there.
func wake(seq, waiting *atomic.Uint32) {
	if waiting.Load() != 0 {
		waiting.Store(0)
		seq.Add(1)
		futex(seq, futexWake, 1, nil)
	}
}

func futex(addr *atomic.Uint32, op int, val uint32, ts *syscall.Timespec) {
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), uintptr(op), uintptr(val),
		uintptr(unsafe.Pointer(ts)), 0, 0)
}

// write copies p into the ring (producer side), waiting for room.
func (r *ring) write(p []byte, stop func() error) error {
	size := uint64(len(r.data))
	for len(p) > 0 {
		tail := r.tail.Load()
		free := size - (tail - r.head.Load())
		if free == 0 {
			if err := r.waitFor(func() bool { return size-(tail-r.head.Load()) > 0 }, r.headSeq, r.prodWait, stop); err != nil {
				return err
			}
			continue
		}
		off := tail & r.mask
		n := min(free, uint64(len(p)), size-off)
		copy(r.data[off:off+n], p[:n])
		r.tail.Store(tail + n)
		wake(r.tailSeq, r.consWait)
		p = p[n:]
	}
	return nil
}

// read copies at least one byte into p (consumer side), waiting for data.
func (r *ring) read(p []byte, stop func() error) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	size := uint64(len(r.data))
	head := r.head.Load()
	avail := r.tail.Load() - head
	if avail == 0 {
		if err := r.waitFor(func() bool { return r.tail.Load() != head }, r.tailSeq, r.consWait, stop); err != nil {
			return 0, err
		}
		avail = r.tail.Load() - head
	}
	off := head & r.mask
	n := min(avail, uint64(len(p)), size-off)
	copy(p[:n], r.data[off:off+n])
	r.head.Store(head + n)
	wake(r.headSeq, r.prodWait)
	return int(n), nil
}
