package collectives

import (
	"context"
	"fmt"
	"math/bits"
)

// AllReduce implements Communicator. Buffers of at most DirectBytes take one
// round of all-to-all exchange, those of at most SmallBytes use recursive
// doubling (log2 n rounds), larger ones a pipelined ring
// reduce-scatter followed by a ring all-gather, in which each rank sends
// 2(n-1)/n of the buffer. Either way every rank ends with the same bits.
func (c *Comm) AllReduce(ctx context.Context, buf Buffer, op Op) error {
	if err := c.begin(); err != nil {
		return err
	}
	if err := checkBuf(buf); err != nil {
		return c.fail(ctx, KindAllReduce, err)
	}
	if !validOp(op) {
		return c.fail(ctx, KindAllReduce, fmt.Errorf("%w: reduction %d", ErrInvalid, op))
	}
	if len(c.world) == 1 {
		return nil
	}
	h := c.header(KindAllReduce, buf, op)
	var err error
	switch {
	case len(buf.data) <= c.cfg.DirectBytes:
		err = c.directAllReduce(ctx, h, buf.data)
	case len(buf.data) <= c.cfg.SmallBytes:
		err = c.doublingAllReduce(ctx, h, buf.data)
	default:
		err = c.ringAllReduce(ctx, h, buf.data, buf.dtype.Size())
	}
	if err != nil {
		return c.fail(ctx, KindAllReduce, err)
	}
	return nil
}

// ringAllReduce: in reduce-scatter step s (0..n-2) rank r sends block r-s
// and receives block r-s-1, reducing it into its own; after n-1 steps it
// holds the final block r+1. In all-gather step s it sends block r+1-s and
// receives block r-s. Every receive is posted up front (each lands in a
// block region written exactly once, after the data it replaces has been
// sent), so the transport fills and reduces pieces as they arrive while this
// goroutine forwards finished pieces to the right.
func (c *Comm) ringAllReduce(ctx context.Context, h Header, buf []byte, w int) error {
	n, r := len(c.world), c.rank
	left, right := (r+n-1)%n, (r+1)%n
	elems, chunk := len(buf)/w, c.chunk(w)
	block := func(i int) []byte {
		i = ((i % n) + n) % n
		return buf[i*elems/n*w : (i+1)*elems/n*w]
	}
	recvBlock := func(s int) []byte {
		if s < n-1 {
			return block(r - s - 1)
		}
		return block(r - (s - (n - 1)))
	}
	steps := 2 * (n - 1)
	first, posted := uint64(0), false
	for s := range steps {
		b := recvBlock(s)
		for off := 0; off < len(b); off += chunk {
			p := piece(b, off, chunk)
			var acc []byte
			if s < n-1 {
				acc = p
			}
			t, err := c.post(left, h, p, acc)
			if err != nil {
				return err
			}
			if !posted {
				first, posted = t, true
			}
		}
	}
	own := block(r)
	for off := 0; off < len(own); off += chunk {
		if err := c.send(ctx, right, h, piece(own, off, chunk)); err != nil {
			return err
		}
	}
	t := first
	for s := range steps {
		b := recvBlock(s)
		for off := 0; off < len(b); off += chunk {
			if err := c.wait(ctx, h.Kind, left, t); err != nil {
				return err
			}
			t++
			if s < steps-1 {
				if err := c.send(ctx, right, h, piece(b, off, chunk)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// directAllReduce sends buf to every other member, receives theirs, and
// reduces all n in rank order, x0 op x1 op ... : one round, and the same
// bits as a naive left-to-right reduction on every rank.
func (c *Comm) directAllReduce(ctx context.Context, h Header, buf []byte) error {
	n, r, l := len(c.world), c.rank, len(buf)
	sc := c.scratch(n * l)
	for p := range n {
		if p == r {
			continue
		}
		t, err := c.post(p, h, sc[p*l:(p+1)*l], nil)
		if err != nil {
			return err
		}
		c.tix[p] = t
	}
	for k := 1; k < n; k++ {
		if err := c.send(ctx, (r+k)%n, h, buf); err != nil {
			return err
		}
	}
	copy(sc[r*l:(r+1)*l], buf)
	for k := 1; k < n; k++ {
		p := (r + n - k) % n
		if err := c.wait(ctx, h.Kind, p, c.tix[p]); err != nil {
			return err
		}
	}
	copy(buf, sc[:l])
	for p := 1; p < n; p++ {
		Reduce(h.DType, h.Op, buf, buf, sc[p*l:(p+1)*l])
	}
	return nil
}

// doublingAllReduce is recursive doubling. With p the largest power of two
// not above n, ranks p.. first fold their data into ranks 0..n-p-1 and get
// the result back at the end. Partners combine as (lower rank's value) op
// (higher rank's value), so both compute the same bits and every rank ends
// with the result of one fixed reduction tree.
func (c *Comm) doublingAllReduce(ctx context.Context, h Header, buf []byte) error {
	n, r := len(c.world), c.rank
	p := 1 << (bits.Len(uint(n)) - 1)
	if r >= p {
		t, err := c.post(r-p, h, buf, nil)
		if err != nil {
			return err
		}
		if err := c.send(ctx, r-p, h, buf); err != nil {
			return err
		}
		return c.wait(ctx, h.Kind, r-p, t)
	}
	sc := c.scratch(len(buf))
	exchange := func(peer int) error {
		t, err := c.post(peer, h, sc, nil)
		if err == nil {
			err = c.send(ctx, peer, h, buf)
		}
		if err == nil {
			err = c.wait(ctx, h.Kind, peer, t)
		}
		return err
	}
	if r < n-p {
		t, err := c.post(r+p, h, sc, nil)
		if err != nil {
			return err
		}
		if err := c.wait(ctx, h.Kind, r+p, t); err != nil {
			return err
		}
		Reduce(h.DType, h.Op, buf, buf, sc)
	}
	for mask := 1; mask < p; mask <<= 1 {
		peer := r ^ mask
		if err := exchange(peer); err != nil {
			return err
		}
		if peer < r {
			Reduce(h.DType, h.Op, buf, sc, buf)
		} else {
			Reduce(h.DType, h.Op, buf, buf, sc)
		}
	}
	if r < n-p {
		return c.send(ctx, r+p, h, buf)
	}
	return nil
}

// ReduceScatter implements Communicator with a pipelined ring: in step s
// rank r sends its partial of block r-s-1 and receives the partial of block
// r-s-2, reduced on arrival with its own data into scratch (into recv at the
// last step). recv may be send's block Rank() (in place).
func (c *Comm) ReduceScatter(ctx context.Context, send, recv Buffer, op Op) error {
	if err := c.begin(); err != nil {
		return err
	}
	n, r := len(c.world), c.rank
	if err := c.checkPair(send, recv, n*recv.Len(), send.Len(), "send"); err != nil {
		return c.fail(ctx, KindReduceScatter, err)
	}
	if !validOp(op) {
		return c.fail(ctx, KindReduceScatter, fmt.Errorf("%w: reduction %d", ErrInvalid, op))
	}
	m := len(recv.data)
	blk := func(b []byte, i int) []byte {
		i = ((i % n) + n) % n
		return b[i*m : (i+1)*m]
	}
	if n == 1 {
		copy(recv.data, send.data)
		return nil
	}
	h := c.header(KindReduceScatter, send, op)
	left, right := (r+n-1)%n, (r+1)%n
	chunk := c.chunk(send.dtype.Size())
	sc := c.scratch(len(send.data))
	dst := func(s int) []byte {
		if s == n-2 {
			return recv.data
		}
		return blk(sc, r-s-2)
	}
	err := func() error {
		first, posted := uint64(0), false
		for s := range n - 1 {
			d, a := dst(s), blk(send.data, r-s-2)
			for off := 0; off < m; off += chunk {
				t, err := c.post(left, h, piece(d, off, chunk), piece(a, off, chunk))
				if err != nil {
					return err
				}
				if !posted {
					first, posted = t, true
				}
			}
		}
		own := blk(send.data, r-1)
		for off := 0; off < m; off += chunk {
			if err := c.send(ctx, right, h, piece(own, off, chunk)); err != nil {
				return err
			}
		}
		t := first
		for s := range n - 1 {
			d := dst(s)
			for off := 0; off < m; off += chunk {
				if err := c.wait(ctx, h.Kind, left, t); err != nil {
					return err
				}
				t++
				if s < n-2 {
					if err := c.send(ctx, right, h, piece(d, off, chunk)); err != nil {
						return err
					}
				}
			}
		}
		return nil
	}()
	if err != nil {
		return c.fail(ctx, KindReduceScatter, err)
	}
	return nil
}

// AllGather implements Communicator with a pipelined ring: in step s rank r
// forwards block r-s and receives block r-s-1 straight into recv. send may
// be recv's block Rank() (in place).
func (c *Comm) AllGather(ctx context.Context, send, recv Buffer) error {
	if err := c.begin(); err != nil {
		return err
	}
	n, r := len(c.world), c.rank
	if err := c.checkPair(recv, send, n*send.Len(), recv.Len(), "recv"); err != nil {
		return c.fail(ctx, KindAllGather, err)
	}
	m := len(send.data)
	blk := func(i int) []byte {
		i = ((i % n) + n) % n
		return recv.data[i*m : (i+1)*m]
	}
	copy(blk(r), send.data)
	if n == 1 {
		return nil
	}
	h := c.header(KindAllGather, recv, 0)
	left, right := (r+n-1)%n, (r+1)%n
	chunk := c.chunk(send.dtype.Size())
	err := func() error {
		first, posted := uint64(0), false
		for s := range n - 1 {
			b := blk(r - s - 1)
			for off := 0; off < m; off += chunk {
				t, err := c.post(left, h, piece(b, off, chunk), nil)
				if err != nil {
					return err
				}
				if !posted {
					first, posted = t, true
				}
			}
		}
		own := blk(r)
		for off := 0; off < m; off += chunk {
			if err := c.send(ctx, right, h, piece(own, off, chunk)); err != nil {
				return err
			}
		}
		t := first
		for s := range n - 1 {
			b := blk(r - s - 1)
			for off := 0; off < m; off += chunk {
				if err := c.wait(ctx, h.Kind, left, t); err != nil {
					return err
				}
				t++
				if s < n-2 {
					if err := c.send(ctx, right, h, piece(b, off, chunk)); err != nil {
						return err
					}
				}
			}
		}
		return nil
	}()
	if err != nil {
		return c.fail(ctx, KindAllGather, err)
	}
	return nil
}

// checkPair checks that big (n times small's length) and small share a type.
func (c *Comm) checkPair(big, small Buffer, wantBig, gotBig int, name string) error {
	if err := checkBuf(big); err != nil {
		return err
	}
	if err := checkBuf(small); err != nil {
		return err
	}
	if big.dtype != small.dtype {
		return fmt.Errorf("%w: element types %s and %s differ", ErrInvalid, big.dtype, small.dtype)
	}
	if big.Len() != wantBig {
		return fmt.Errorf("%w: %s has %d elements, want %d (group size %d times %d)",
			ErrInvalid, name, gotBig, wantBig, len(c.world), small.Len())
	}
	return nil
}

// Broadcast implements Communicator: a binomial tree for buffers of at most
// SmallBytes, otherwise a pipelined chain root, root+1, ... in pieces.
func (c *Comm) Broadcast(ctx context.Context, buf Buffer, root int) error {
	if err := c.begin(); err != nil {
		return err
	}
	n, r := len(c.world), c.rank
	if err := checkBuf(buf); err != nil {
		return c.fail(ctx, KindBroadcast, err)
	}
	if root < 0 || root >= n {
		return c.fail(ctx, KindBroadcast, fmt.Errorf("%w: broadcast root %d outside group of %d", ErrInvalid, root, n))
	}
	if n == 1 {
		return nil
	}
	h := c.header(KindBroadcast, buf, 0)
	h.Arg = uint32(root)
	v := (r - root + n) % n // rank relative to root
	var err error
	if len(buf.data) <= c.cfg.SmallBytes {
		err = c.treeBroadcast(ctx, h, buf.data, v)
	} else {
		err = c.chainBroadcast(ctx, h, buf.data, v, c.chunk(buf.dtype.Size()))
	}
	if err != nil {
		return c.fail(ctx, KindBroadcast, err)
	}
	return nil
}

func (c *Comm) treeBroadcast(ctx context.Context, h Header, buf []byte, v int) error {
	n, r := len(c.world), c.rank
	mask := 1
	for ; mask < n; mask <<= 1 {
		if v&mask != 0 {
			src := (r - mask + n) % n
			t, err := c.post(src, h, buf, nil)
			if err != nil {
				return err
			}
			if err := c.wait(ctx, h.Kind, src, t); err != nil {
				return err
			}
			break
		}
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		if v+mask < n {
			if err := c.send(ctx, (r+mask)%n, h, buf); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *Comm) chainBroadcast(ctx context.Context, h Header, buf []byte, v, chunk int) error {
	n, r := len(c.world), c.rank
	left, right := (r+n-1)%n, (r+1)%n
	if v == 0 {
		for off := 0; off < len(buf); off += chunk {
			if err := c.send(ctx, right, h, piece(buf, off, chunk)); err != nil {
				return err
			}
		}
		return nil
	}
	first, posted := uint64(0), false
	for off := 0; off < len(buf); off += chunk {
		t, err := c.post(left, h, piece(buf, off, chunk), nil)
		if err != nil {
			return err
		}
		if !posted {
			first, posted = t, true
		}
	}
	t := first
	for off := 0; off < len(buf); off += chunk {
		if err := c.wait(ctx, h.Kind, left, t); err != nil {
			return err
		}
		t++
		if v < n-1 {
			if err := c.send(ctx, right, h, piece(buf, off, chunk)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Barrier implements Communicator with the dissemination algorithm:
// ceil(log2 n) rounds of empty frames.
func (c *Comm) Barrier(ctx context.Context) error {
	if err := c.begin(); err != nil {
		return err
	}
	n, r := len(c.world), c.rank
	if n == 1 {
		return nil
	}
	h := c.header(KindBarrier, Buffer{}, 0)
	for k := 1; k < n; k <<= 1 {
		from := (r - k + n) % n
		t, err := c.post(from, h, nil, nil)
		if err == nil {
			err = c.send(ctx, (r+k)%n, h, nil)
		}
		if err == nil {
			err = c.wait(ctx, h.Kind, from, t)
		}
		if err != nil {
			return c.fail(ctx, KindBarrier, err)
		}
	}
	return nil
}

// Send implements Communicator. It returns once buf may be reused, which
// may be before the peer has called Recv: frames that arrive early wait in
// the peer's mailbox.
func (c *Comm) Send(ctx context.Context, buf Buffer, peer int) error {
	if err := c.begin(); err != nil {
		return err
	}
	if err := checkBuf(buf); err != nil {
		return c.fail(ctx, KindSend, err)
	}
	if err := c.checkPeer(peer); err != nil {
		return c.fail(ctx, KindSend, err)
	}
	c.sseq[peer]++
	h := Header{Tag: c.tag, Seq: c.sseq[peer], Total: uint64(len(buf.data)), Kind: KindSend, DType: buf.dtype}
	chunk := c.chunk(buf.dtype.Size())
	for off := 0; off == 0 || off < len(buf.data); off += chunk {
		if err := c.send(ctx, peer, h, piece(buf.data, off, chunk)); err != nil {
			return c.fail(ctx, KindSend, err)
		}
	}
	return nil
}

// Recv implements Communicator. A Send of a different length or type is
// reported as ErrMismatch.
func (c *Comm) Recv(ctx context.Context, buf Buffer, peer int) error {
	if err := c.begin(); err != nil {
		return err
	}
	if err := checkBuf(buf); err != nil {
		return c.fail(ctx, KindSend, err)
	}
	if err := c.checkPeer(peer); err != nil {
		return c.fail(ctx, KindSend, err)
	}
	c.rseq[peer]++
	h := Header{Tag: c.tag, Seq: c.rseq[peer], Total: uint64(len(buf.data)), Kind: KindSend, DType: buf.dtype}
	chunk := c.chunk(buf.dtype.Size())
	first, posted := uint64(0), false
	count := 0
	for off := 0; off == 0 || off < len(buf.data); off += chunk {
		t, err := c.post(peer, h, piece(buf.data, off, chunk), nil)
		if err != nil {
			return c.fail(ctx, KindSend, err)
		}
		if !posted {
			first, posted = t, true
		}
		count++
	}
	for i := range count {
		if err := c.wait(ctx, KindSend, peer, first+uint64(i)); err != nil {
			return c.fail(ctx, KindSend, err)
		}
	}
	return nil
}
