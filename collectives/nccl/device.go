package nccl

import (
	"context"
	"fmt"

	"github.com/gpucoord/gpucoord/collectives"
)

// DeviceBuffer is memory on a Communicator's GPU, allocated with cudaMalloc
// by Alloc. The *Device collectives read and write it in place: no staging
// copy and no copy to the host. CopyFrom and CopyTo move data between it and
// host memory, to set it up or to check a result.
//
// Free releases it. Close and an abort of the Communicator release every
// DeviceBuffer still allocated; Free is then a no-op, and any other use
// returns the Communicator's ErrClosed or ErrAborted. A DeviceBuffer follows
// its Communicator's rule: no call on either may run concurrently with
// another call on that Communicator.
type DeviceBuffer struct {
	c     *Communicator
	dtype collectives.DType
	n     int
	ptr   uintptr // device address; 0 for n == 0
	freed bool    // guarded by c.mu
}

// DType returns the element type.
func (b *DeviceBuffer) DType() collectives.DType { return b.dtype }

// Len returns the number of elements.
func (b *DeviceBuffer) Len() int { return b.n }

// Alloc allocates n elements of type dt on this communicator's device. The
// contents are undefined until written by CopyFrom or a collective.
func (c *Communicator) Alloc(ctx context.Context, dt collectives.DType, n int) (*DeviceBuffer, error) {
	if _, err := dataType(dt); err != nil {
		return nil, c.wrap(err)
	}
	if n < 0 {
		return nil, c.wrap(fmt.Errorf("%w: Alloc of %d elements", ErrInvalidArgument, n))
	}
	b := &DeviceBuffer{c: c, dtype: dt, n: n}
	err := c.exclusive(ctx, func(context.Context) error {
		if n > 0 {
			p, err := c.malloc(n * dt.Size())
			if err != nil {
				return err
			}
			b.ptr = p
		}
		c.bufs[b] = struct{}{}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Free releases the buffer's device memory (cudaFree). A second Free, or a
// Free after the Communicator was closed or aborted, returns nil.
func (b *DeviceBuffer) Free() error {
	c := b.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if b.freed || c.state != nil {
		return nil
	}
	if err := c.onDevice(func() error { return c.free(b) }); err != nil {
		return c.wrap(err)
	}
	return nil
}

// free releases b; the caller holds c.mu on a thread whose device is c's.
func (c *Communicator) free(b *DeviceBuffer) error {
	delete(c.bufs, b)
	b.freed = true
	if b.ptr == 0 {
		return nil
	}
	p := b.ptr
	b.ptr = 0
	if r := call(c.lib.cudaFree, p); r != cudaSuccess {
		return c.lib.cudaError("cudaFree", r)
	}
	return nil
}

// CopyFrom copies src, host memory of the same type and length, into the
// buffer (cudaMemcpyAsync host to device) and returns once it is there.
func (b *DeviceBuffer) CopyFrom(ctx context.Context, src collectives.Buffer) error {
	return b.transfer(ctx, src, true)
}

// CopyTo copies the buffer into dst, host memory of the same type and
// length (cudaMemcpyAsync device to host), and returns once it is there.
func (b *DeviceBuffer) CopyTo(ctx context.Context, dst collectives.Buffer) error {
	return b.transfer(ctx, dst, false)
}

func (b *DeviceBuffer) transfer(ctx context.Context, host collectives.Buffer, toDevice bool) error {
	c := b.c
	if host.DType() != b.dtype || host.Len() != b.n {
		return c.wrap(fmt.Errorf("%w: copying %d elements of type %d between a DeviceBuffer of %d elements of type %d",
			ErrInvalidArgument, host.Len(), host.DType(), b.n, b.dtype))
	}
	h := host.Bytes()
	name := "cudaMemcpyAsync(device to host)"
	if toDevice {
		name = "cudaMemcpyAsync(host to device)"
	}
	// The stream is idle when a call starts, so a copy to pageable host
	// memory cannot wait behind a hung NCCL operation.
	return c.run(ctx, task{name: name, empty: len(h) == 0, host: [][]byte{h}, dev: []*DeviceBuffer{b},
		in: func() error {
			if toDevice {
				return c.h2d(b.ptr, h)
			}
			return c.d2h(h, b.ptr)
		}})
}

// AllReduceDevice is AllReduce on device memory, in place: ncclAllReduce
// reads and writes buf.
func (c *Communicator) AllReduceDevice(ctx context.Context, buf *DeviceBuffer, op collectives.Op) error {
	if err := c.owns(buf); err != nil {
		return c.wrap(err)
	}
	d, err := c.allReduceDesc(buf, op)
	return c.direct(ctx, d, err, buf, buf)
}

// ReduceScatterDevice is ReduceScatter on device memory: ncclReduceScatter
// reads send (Size()*recv.Len() elements) and writes recv.
func (c *Communicator) ReduceScatterDevice(ctx context.Context, send, recv *DeviceBuffer, op collectives.Op) error {
	if err := c.owns(send, recv); err != nil {
		return c.wrap(err)
	}
	d, err := c.reduceScatterDesc(send, recv, op)
	return c.direct(ctx, d, err, send, recv)
}

// AllGatherDevice is AllGather on device memory: ncclAllGather reads send
// and writes recv (Size()*send.Len() elements).
func (c *Communicator) AllGatherDevice(ctx context.Context, send, recv *DeviceBuffer) error {
	if err := c.owns(send, recv); err != nil {
		return c.wrap(err)
	}
	d, err := c.allGatherDesc(send, recv)
	return c.direct(ctx, d, err, send, recv)
}

// BroadcastDevice is Broadcast on device memory, in place: ncclBroadcast
// reads root's buf and writes buf on every member.
func (c *Communicator) BroadcastDevice(ctx context.Context, buf *DeviceBuffer, root int) error {
	if err := c.owns(buf); err != nil {
		return c.wrap(err)
	}
	d, err := c.broadcastDesc(buf, root)
	return c.direct(ctx, d, err, buf, buf)
}

// owns refuses buffers that are nil or were allocated by another
// Communicator (another device or group).
func (c *Communicator) owns(bufs ...*DeviceBuffer) error {
	for _, b := range bufs {
		if b == nil {
			return fmt.Errorf("%w: nil DeviceBuffer", ErrInvalidArgument)
		}
		if b.c != c {
			return fmt.Errorf("%w: the DeviceBuffer belongs to rank %d of another communicator (device %d)",
				ErrInvalidArgument, b.c.rank, b.c.cfg.Device)
		}
	}
	return nil
}

// direct runs the collective d on device memory in place, after the
// argument check that produced err.
func (c *Communicator) direct(ctx context.Context, d desc, err error, send, recv *DeviceBuffer) error {
	if err != nil {
		return c.wrap(err)
	}
	return c.run(ctx, task{name: d.kind.nccl(), d: d, empty: d.count == 0, dev: []*DeviceBuffer{send, recv},
		in: func() error { return c.launch(d, send.ptr, recv.ptr) }})
}
