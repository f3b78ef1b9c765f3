package testcluster

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// relay links a host to the bridge through two TAP devices, passing every
// frame on after the delay set: the sch_netem this kernel lacks.
type relay struct {
	host, bridge *os.File // the TAP devices' file descriptors
	delay        atomic.Int64
	wg           sync.WaitGroup
}

// newRelay makes h's eth0 a TAP device in its namespace and h.Name a TAP
// device in the bridge's, and starts copying frames between them.
func newRelay(c *Cluster, h *Host) (*relay, error) {
	// The devices are made here, in the test process's namespace, and then
	// moved: a TAP device's descriptor stays attached wherever it goes.
	tmpHost, tmpBridge := c.id+h.Name+"a", c.id+h.Name+"b"
	if len(tmpHost) > 15 {
		tmpHost, tmpBridge = fmt.Sprintf("gct%d%sa", seq.Add(1), h.Name), fmt.Sprintf("gct%d%sb", seq.Add(1), h.Name)
	}
	hostFile, err := openTAP(tmpHost)
	if err != nil {
		return nil, err
	}
	bridgeFile, err := openTAP(tmpBridge)
	if err != nil {
		hostFile.Close()
		return nil, err
	}
	r := &relay{host: hostFile, bridge: bridgeFile}
	if err := runAll(
		[]string{"ip", "link", "set", tmpHost, "netns", h.ns},
		[]string{"ip", "-n", h.ns, "link", "set", tmpHost, "name", "eth0"},
		[]string{"ip", "link", "set", tmpBridge, "netns", c.bridge},
		[]string{"ip", "-n", c.bridge, "link", "set", tmpBridge, "name", h.Name},
	); err != nil {
		r.close()
		return nil, err
	}
	r.wg.Add(2)
	go r.pass(hostFile, bridgeFile)
	go r.pass(bridgeFile, hostFile)
	return r, nil
}

func (r *relay) setDelay(d time.Duration) { r.delay.Store(int64(d)) }

// frame is one frame in flight and when it may go on.
type frame struct {
	b   []byte
	due time.Time
}

// pass copies frames from one device to the other, each held until its
// due time; order is kept.
func (r *relay) pass(from, to *os.File) {
	defer r.wg.Done()
	queue := make(chan frame, 8192)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for f := range queue {
			if d := time.Until(f.due); d > 0 {
				time.Sleep(d) // the delay being modelled, not a synchronisation
			}
			to.Write(f.b)
		}
	}()
	buf := make([]byte, 65536)
	for {
		n, err := from.Read(buf)
		if err != nil {
			break
		}
		f := frame{b: append([]byte(nil), buf[:n]...), due: time.Now().Add(time.Duration(r.delay.Load()))}
		select {
		case queue <- f:
		default: // a full queue drops, as a congested link does
		}
	}
	close(queue)
	<-done
}

func (r *relay) close() {
	r.host.Close()
	r.bridge.Close()
	r.wg.Wait()
}

// openTAP creates a TAP device named name and returns its descriptor, in
// non-blocking mode so that Close ends a Read.
func openTAP(name string) (*os.File, error) {
	fd, err := syscall.Open("/dev/net/tun", syscall.O_RDWR|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	const (
		tunSetIff = 0x400454ca
		iffTap    = 0x0002
		iffNoPI   = 0x1000
	)
	var req struct {
		name  [16]byte
		flags uint16
		_     [22]byte
	}
	copy(req.name[:], name)
	req.flags = iffTap | iffNoPI
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), tunSetIff, uintptr(unsafe.Pointer(&req))); e != 0 {
		syscall.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF %s: %w", name, e)
	}
	return os.NewFile(uintptr(fd), name), nil
}
