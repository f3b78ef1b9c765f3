package nccl

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/collectives"
	"github.com/gpucoord/gpucoord/collectives/nccl/nccltest"
)

// The ncclDataType_t and ncclRedOp_t values below are those of nccl.h
// (NVIDIA/nccl src/nccl.h.in): ncclFloat32 = 7, ncclFloat64 = 8,
// ncclBfloat16 = 9, ncclSum = 0, ncclMax = 2, ncclMin = 3.
func TestDataTypeAndOpValues(t *testing.T) {
	dtypes := []struct {
		in      collectives.DType
		want    int32
		wantErr error
	}{
		{collectives.Float32, 7, nil},
		{collectives.Float64, 8, nil},
		{collectives.BFloat16, 9, nil},
		{0, 0, ErrUnsupported},
		{42, 0, ErrUnsupported},
	}
	for _, tc := range dtypes {
		got, err := dataType(tc.in)
		if got != tc.want || !errors.Is(err, tc.wantErr) {
			t.Errorf("dataType(%d) = %d, %v; want %d, %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
	ops := []struct {
		in      collectives.Op
		want    int32
		wantErr error
	}{
		{collectives.Sum, 0, nil},
		{collectives.Max, 2, nil},
		{collectives.Min, 3, nil},
		{0, 0, ErrUnsupported},
		{9, 0, ErrUnsupported},
	}
	for _, tc := range ops {
		got, err := redOp(tc.in)
		if got != tc.want || !errors.Is(err, tc.wantErr) {
			t.Errorf("redOp(%d) = %d, %v; want %d, %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestResultCodes(t *testing.T) {
	tests := []struct {
		code int32
		want error
	}{
		{1, ErrUnhandledCUDA},
		{2, ErrSystem},
		{3, ErrInternal},
		{4, ErrInvalidArgument},
		{5, ErrInvalidUsage},
		{6, ErrRemote},
		{8, ErrTimeout},
		{99, ErrInternal},
	}
	for _, tc := range tests {
		e := &Error{Func: "ncclAllReduce", Code: tc.code, Text: "text", Detail: "detail"}
		if !errors.Is(e, tc.want) {
			t.Errorf("code %d unwraps to %v, want %v", tc.code, errors.Unwrap(e), tc.want)
		}
		if !strings.Contains(e.Error(), "ncclAllReduce") || !strings.Contains(e.Error(), "detail") {
			t.Errorf("code %d: message %q lacks the function or the detail", tc.code, e)
		}
	}
}

func TestVersionString(t *testing.T) {
	for code, want := range map[int]string{2708: "2.7.8", 21400: "2.14.0", 22105: "2.21.5", 22903: "2.29.3"} {
		if got := versionString(code); got != want {
			t.Errorf("versionString(%d) = %q, want %q", code, got, want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	store := collectives.NewMemStore()
	tests := []struct {
		name   string
		tweak  func(*Config)
		errHas string
	}{
		{"default single rank", func(*Config) {}, ""},
		{"group of 4", func(c *Config) { c.Rank, c.Size, c.Store, c.Key = 3, 4, store, "k" }, ""},
		{"rank out of range", func(c *Config) { c.Rank, c.Size, c.Store, c.Key = 4, 4, store, "k" }, "Rank 4"},
		{"size zero", func(c *Config) { c.Size = 0 }, "Size 0"},
		{"no store", func(c *Config) { c.Size, c.Key = 2, "k" }, "Store is nil"},
		{"no key", func(c *Config) { c.Size, c.Store = 2, store }, "Key is empty"},
		{"negative device", func(c *Config) { c.Device = -1 }, "Device -1"},
		{"no library", func(c *Config) { c.NCCLLibrary = "" }, "NCCLLibrary"},
		{"empty cudart entry", func(c *Config) { c.CUDARTLibraries = []string{""} }, "CUDARTLibraries[0]"},
		{"zero poll", func(c *Config) { c.PollInterval = 0 }, "PollInterval"},
		{"negative timeout", func(c *Config) { c.Timeout = -time.Second }, "Timeout"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.tweak(c)
			err := c.Validate()
			if tc.errHas == "" && err != nil || tc.errHas != "" && (err == nil || !strings.Contains(err.Error(), tc.errHas)) {
				t.Fatalf("Validate() = %v, want error containing %q", err, tc.errHas)
			}
		})
	}
}

func TestDefaultConfigEnv(t *testing.T) {
	t.Setenv(EnvNCCLLibrary, "/opt/nccl/libnccl.so.2")
	t.Setenv(EnvCUDARTLibrary, "/a/libcudart.so.12:/b/libcudart.so")
	c := DefaultConfig()
	if c.NCCLLibrary != "/opt/nccl/libnccl.so.2" || len(c.CUDARTLibraries) != 2 || c.CUDARTLibraries[1] != "/b/libcudart.so" {
		t.Fatalf("DefaultConfig with env = %q %q", c.NCCLLibrary, c.CUDARTLibraries)
	}
}

// On this machine (no GPU) the real libraries are absent: New must say so
// plainly, not panic.
func TestUnavailableOnThisMachine(t *testing.T) {
	t.Setenv(EnvNCCLLibrary, "")
	t.Setenv(EnvCUDARTLibrary, "")
	c, err := New(t.Context(), DefaultConfig())
	if err == nil {
		c.Close()
		t.Skip("NCCL and a CUDA device are present here; see TestRealGPU")
	}
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "NCCL is not available") {
		t.Fatalf("New = %v, want ErrUnavailable", err)
	}
	t.Logf("as a user sees it: %v", err)
}

func TestUnavailable(t *testing.T) {
	needFake(t)
	nccl, cudart := fake.NCCL, fake.CUDART
	old := filepath.Join(t.TempDir(), "libnccl-old.so.2")
	copyFile(t, nccl, old)
	tests := []struct {
		name    string
		nccl    string
		cudart  []string
		prep    func()
		wantErr error
		errHas  []string
	}{
		{name: "no NCCL", nccl: "/nonexistent/libnccl.so.2", cudart: []string{cudart},
			wantErr: ErrUnavailable, errHas: []string{"cannot load /nonexistent/libnccl.so.2"}},
		{name: "no CUDA runtime", nccl: nccl, cudart: []string{"/nonexistent/libcudart.so", "libcudart-missing.so.12"},
			wantErr: ErrUnavailable, errHas: []string{"cannot load the CUDA runtime", "/nonexistent/libcudart.so", "libcudart-missing.so.12"}},
		{name: "not NCCL", nccl: cudart, cudart: []string{cudart},
			wantErr: ErrUnavailable, errHas: []string{"has no symbol ncclGetVersion"}},
		{name: "NCCL too old", nccl: old, cudart: []string{cudart}, prep: func() { fake.SetNCCLVersion(21305) },
			wantErr: ErrUnavailable, errHas: []string{"NCCL 2.13.5", "2.14.0 or later"}},
		{name: "no device", nccl: nccl, cudart: []string{cudart}, prep: func() { fake.SetDevices(0) },
			wantErr: ErrUnavailable, errHas: []string{"no CUDA device"}},
		{name: "device out of range", nccl: nccl, cudart: []string{cudart}, prep: func() { fake.SetDevices(2) },
			wantErr: ErrInvalidArgument, errHas: []string{"Device 5", "only 2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fake.Reset()
			if tc.prep != nil {
				tc.prep()
			}
			cfg := fakeConfig(t, 0, 1, nil, "")
			cfg.NCCLLibrary, cfg.CUDARTLibraries = tc.nccl, tc.cudart
			if tc.name == "device out of range" {
				cfg.Device = 5
			}
			c, err := New(t.Context(), cfg)
			if err == nil {
				c.Close()
				t.Fatal("New succeeded")
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("New = %v, want %v", err, tc.wantErr)
			}
			for _, s := range tc.errHas {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q lacks %q", err, s)
				}
			}
		})
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// The unique id travels from rank 0 through the Store and reaches
// ncclCommInitRankConfig by value (128 bytes on the stack on amd64) intact,
// with a non-blocking ncclConfig_t of the 2.14 layout.
func TestInitPassesUniqueIDAndConfig(t *testing.T) {
	needFake(t)
	comms := group(t, 3, func(c *Config) { c.Device = 1 })
	gen := fake.Records("ncclGetUniqueId")
	if len(gen) != 1 {
		t.Fatalf("ncclGetUniqueId called %d times, want once (rank 0)", len(gen))
	}
	inits := fake.Records("ncclCommInitRankConfig")
	if len(inits) != 3 {
		t.Fatalf("%d ncclCommInitRankConfig calls, want 3", len(inits))
	}
	seen := map[int64]bool{}
	for _, r := range inits {
		if r.SendBuf != gen[0].SendBuf {
			t.Errorf("rank %d got unique id hash %x, rank 0 generated %x", r.Rank, r.SendBuf, gen[0].SendBuf)
		}
		if r.Count != 3 || r.Op != 0 || r.Kind != 0xcafebeef || r.Peer != 21400 || r.Bytes != 40 {
			t.Errorf("rank %d: nranks %d blocking %d magic %#x version %d size %d; want 3, 0, 0xcafebeef, 21400, 40",
				r.Rank, r.Count, r.Op, r.Kind, r.Peer, r.Bytes)
		}
		if r.Dev != 1 {
			t.Errorf("rank %d initialised on device %d, want 1", r.Rank, r.Dev)
		}
		seen[r.Rank] = true
	}
	if len(seen) != 3 {
		t.Errorf("ranks initialised: %v", seen)
	}
	for r, c := range comms {
		if c.Rank() != r || c.Size() != 3 || c.Version() != "2.21.5" {
			t.Errorf("comm %d: Rank %d Size %d Version %s", r, c.Rank(), c.Size(), c.Version())
		}
	}
}

// Every dtype and op reaches ncclAllReduce as the nccl.h value, in place on
// the communicator's own non-blocking stream, between a host-to-device and a
// device-to-host copy of the whole buffer; and the results equal a naive
// reference.
func TestAllReduceMapping(t *testing.T) {
	needFake(t)
	const world, n = 3, 37
	comms := group(t, world, func(c *Config) { c.Device = 1 })
	streams := map[int64]bool{}
	for _, r := range fake.Records("cudaStreamCreateWithFlags") {
		if r.Op != 1 {
			t.Errorf("stream created with flags %d, want cudaStreamNonBlocking (1)", r.Op)
		}
		streams[r.Stream] = true
	}
	tests := []struct {
		dtype          collectives.DType
		op             collectives.Op
		wantDT, wantOp int64
	}{
		{collectives.Float32, collectives.Sum, 7, 0},
		{collectives.Float32, collectives.Max, 7, 2},
		{collectives.Float32, collectives.Min, 7, 3},
		{collectives.Float64, collectives.Sum, 8, 0},
		{collectives.Float64, collectives.Min, 8, 3},
		{collectives.BFloat16, collectives.Sum, 9, 0},
		{collectives.BFloat16, collectives.Max, 9, 2},
	}
	for _, tc := range tests {
		fake.Reset()
		in := make([][]float64, world)
		bufs := make([]collectives.Buffer, world)
		for r := range world {
			in[r] = make([]float64, n)
			for i := range n {
				in[r][i] = float64((i*7+r*13)%11 - 5) // small integers: exact in bfloat16
			}
			bufs[r] = makeBuf(tc.dtype, in[r])
		}
		errs := each(comms, func(r int, c *Communicator) error { return c.AllReduce(t.Context(), bufs[r], tc.op) })
		for r, err := range errs {
			if err != nil {
				t.Fatalf("%v/%v rank %d: %v", tc.dtype, tc.op, r, err)
			}
		}
		for i := range n {
			want := in[0][i]
			for r := 1; r < world; r++ {
				want = reduceRef(tc.op, want, in[r][i])
			}
			for r := range world {
				if got := readBuf(bufs[r], i); got != want {
					t.Fatalf("%v/%v rank %d [%d] = %v, want %v", tc.dtype, tc.op, r, i, got, want)
				}
			}
		}
		calls := fake.Records("ncclAllReduce")
		if len(calls) != world {
			t.Fatalf("%d ncclAllReduce calls, want %d", len(calls), world)
		}
		for _, call := range calls {
			if call.DType != tc.wantDT || call.Op != tc.wantOp || call.Count != n {
				t.Errorf("%v/%v: ncclAllReduce(datatype %d, op %d, count %d); want %d, %d, %d",
					tc.dtype, tc.op, call.DType, call.Op, call.Count, tc.wantDT, tc.wantOp, n)
			}
			if !streams[call.Stream] || call.SendBuf != call.RecvBuf || call.Dev != 1 {
				t.Errorf("ncclAllReduce on stream %x (ours: %v), in place %v, device %d",
					call.Stream, streams[call.Stream], call.SendBuf == call.RecvBuf, call.Dev)
			}
		}
		assertStaging(t, fake.Records("cudaMemcpyAsync", "ncclAllReduce"), int64(n*tc.dtype.Size()))
	}
}

// assertStaging checks that, per rank stream, the payload is copied host to
// device, reduced, and copied device to host, in that order.
func assertStaging(t *testing.T, recs []nccltest.Rec, payload int64) {
	t.Helper()
	byStream := map[int64][]string{}
	for _, r := range recs {
		if r.Bytes != payload && r.Name() == "cudaMemcpyAsync" {
			continue // shape-check descriptors
		}
		s := r.Name()
		if s == "cudaMemcpyAsync" {
			s = map[int64]string{1: "H2D", 2: "D2H"}[r.Kind]
		}
		byStream[r.Stream] = append(byStream[r.Stream], s)
	}
	for s, seq := range byStream {
		if strings.Join(seq, ",") != "H2D,ncclAllReduce,D2H" {
			t.Errorf("stream %x saw %v, want H2D, ncclAllReduce, D2H", s, seq)
		}
	}
}

func makeBuf(d collectives.DType, v []float64) collectives.Buffer {
	switch d {
	case collectives.Float32:
		s := make([]float32, len(v))
		for i, x := range v {
			s[i] = float32(x)
		}
		return collectives.Float32s(s)
	case collectives.Float64:
		return collectives.Float64s(append([]float64(nil), v...))
	}
	s := make([]uint16, len(v))
	for i, x := range v {
		s[i] = uint16(math.Float32bits(float32(x)) >> 16) // exact for small integers
	}
	return collectives.BFloat16s(s)
}

func readBuf(b collectives.Buffer, i int) float64 {
	raw := b.Bytes()
	switch b.DType() {
	case collectives.Float32:
		return float64(math.Float32frombits(leU32(raw[4*i:])))
	case collectives.Float64:
		return math.Float64frombits(uint64(leU32(raw[8*i:])) | uint64(leU32(raw[8*i+4:]))<<32)
	}
	return float64(math.Float32frombits(uint32(raw[2*i])<<16 | uint32(raw[2*i+1])<<24))
}

func leU32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func reduceRef(op collectives.Op, a, b float64) float64 {
	switch op {
	case collectives.Max:
		return math.Max(a, b)
	case collectives.Min:
		return math.Min(a, b)
	}
	return a + b
}

// Every other operation against a naive reference, for world sizes 1-4 and
// lengths that do not divide evenly.
func TestCollectivesAgainstReference(t *testing.T) {
	needFake(t)
	for _, world := range []int{1, 2, 3, 4} {
		for _, n := range []int{1, 5, 1000} {
			comms := group(t, world, nil)
			val := func(r, i int) float64 { return float64(r*1000 + i) }

			// ReduceScatter with sum: block r of the result is sum over ranks q of q's block r.
			recv := make([][]float64, world)
			errs := each(comms, func(r int, c *Communicator) error {
				send := make([]float64, world*n)
				for i := range send {
					send[i] = val(r, i)
				}
				recv[r] = make([]float64, n)
				return c.ReduceScatter(t.Context(), collectives.Float64s(send), collectives.Float64s(recv[r]), collectives.Sum)
			})
			mustAll(t, "ReduceScatter", errs)
			for r := range world {
				for i := range n {
					want := 0.0
					for q := range world {
						want += val(q, r*n+i)
					}
					if recv[r][i] != want {
						t.Fatalf("world %d n %d: ReduceScatter rank %d [%d] = %v, want %v", world, n, r, i, recv[r][i], want)
					}
				}
			}

			// AllGather: recv is every rank's send in rank order.
			gathered := make([][]float32, world)
			errs = each(comms, func(r int, c *Communicator) error {
				send := make([]float32, n)
				for i := range send {
					send[i] = float32(val(r, i))
				}
				gathered[r] = make([]float32, world*n)
				return c.AllGather(t.Context(), collectives.Float32s(send), collectives.Float32s(gathered[r]))
			})
			mustAll(t, "AllGather", errs)
			for r := range world {
				for q := range world {
					for i := range n {
						if got, want := gathered[r][q*n+i], float32(val(q, i)); got != want {
							t.Fatalf("world %d n %d: AllGather rank %d block %d [%d] = %v, want %v", world, n, r, q, i, got, want)
						}
					}
				}
			}

			// Broadcast from the last rank.
			root := world - 1
			bc := make([][]float64, world)
			errs = each(comms, func(r int, c *Communicator) error {
				bc[r] = make([]float64, n)
				for i := range bc[r] {
					bc[r][i] = val(r, i)
				}
				return c.Broadcast(t.Context(), collectives.Float64s(bc[r]), root)
			})
			mustAll(t, "Broadcast", errs)
			for r := range world {
				for i := range n {
					if bc[r][i] != val(root, i) {
						t.Fatalf("world %d n %d: Broadcast rank %d [%d] = %v, want %v", world, n, r, i, bc[r][i], val(root, i))
					}
				}
			}

			mustAll(t, "Barrier", each(comms, func(_ int, c *Communicator) error { return c.Barrier(t.Context()) }))
			if world == 1 {
				continue
			}

			checkPipeline(t, comms, n, val)

			// SendRecv between ranks 0 and 1, sizes n and n+1 each way.
			var in0, in1 []float64
			errs = each(comms[:2], func(r int, c *Communicator) error {
				out := make([]float64, n+r)
				for i := range out {
					out[i] = val(r, i)
				}
				in := make([]float64, n+1-r)
				if r == 0 {
					in0 = in
				} else {
					in1 = in
				}
				return c.SendRecv(t.Context(), collectives.Float64s(out), collectives.Float64s(in), 1-r)
			})
			mustAll(t, "SendRecv", errs)
			for i := range n + 1 {
				if in0[i] != val(1, i) {
					t.Fatalf("SendRecv: rank 0 got [%d] = %v, want %v", i, in0[i], val(1, i))
				}
			}
			for i := range n {
				if in1[i] != val(0, i) {
					t.Fatalf("SendRecv: rank 1 got [%d] = %v, want %v", i, in1[i], val(0, i))
				}
			}
		}
	}
	// Point-to-point calls are grouped.
	for _, r := range fake.Records("ncclSend", "ncclRecv") {
		if r.Op < 1 {
			t.Fatalf("%s outside ncclGroupStart/End", r.Name())
		}
	}
}

func mustAll(t testing.TB, what string, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%s rank %d: %v", what, r, err)
		}
	}
}

// Mismatched calls are reported on every rank as ErrMismatch naming the
// other rank, before any payload moves, and the communicator stays usable.
func TestMismatch(t *testing.T) {
	needFake(t)
	comms := group(t, 3, nil)
	tests := []struct {
		name   string
		call   func(r int, c *Communicator) error
		errHas string
	}{
		{"all-reduce lengths", func(r int, c *Communicator) error {
			n := 8
			if r == 2 {
				n = 9
			}
			return c.AllReduce(t.Context(), collectives.Float32s(make([]float32, n)), collectives.Sum)
		}, "rank 2 called AllReduce of 9 float32 elements with sum"},
		{"all-reduce ops", func(r int, c *Communicator) error {
			op := collectives.Sum
			if r == 1 {
				op = collectives.Max
			}
			return c.AllReduce(t.Context(), collectives.Float64s(make([]float64, 4)), op)
		}, "with max"},
		{"broadcast roots", func(r int, c *Communicator) error {
			return c.Broadcast(t.Context(), collectives.Float32s(make([]float32, 4)), r%2)
		}, "from root 1"},
		{"types", func(r int, c *Communicator) error {
			if r == 0 {
				return c.AllGather(t.Context(), collectives.BFloat16s(make([]uint16, 2)), collectives.BFloat16s(make([]uint16, 6)))
			}
			return c.AllGather(t.Context(), collectives.Float32s(make([]float32, 2)), collectives.Float32s(make([]float32, 6)))
		}, "bfloat16"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fake.Reset()
			errs := each(comms, tc.call)
			for r, err := range errs {
				if !errors.Is(err, ErrMismatch) {
					t.Fatalf("rank %d: %v, want ErrMismatch", r, err)
				}
			}
			if !strings.Contains(errs[0].Error(), tc.errHas) {
				t.Errorf("rank 0 error %q lacks %q", errs[0], tc.errHas)
			}
			var pe *collectives.PeerError
			if !errors.As(errs[0], &pe) || pe.Peer == 0 || !errors.Is(errs[0], collectives.ErrMismatch) {
				t.Errorf("rank 0 error %v is not a collectives.PeerError naming another rank", errs[0])
			}
			if n := len(fake.Records("ncclAllReduce", "ncclBroadcast")) + len(fake.Records("ncclAllGather")) - len(comms); n != 0 {
				t.Errorf("%d payload NCCL calls after a mismatch, want 0", n)
			}
		})
	}
	p2p := []struct {
		name   string
		call   func(r int, c *Communicator) error
		errHas string
	}{
		{"send and recv lengths", func(r int, c *Communicator) error {
			if r == 0 {
				return c.Send(t.Context(), collectives.Float32s(make([]float32, 5)), 1)
			}
			return c.Recv(t.Context(), collectives.Float32s(make([]float32, 6)), 0)
		}, "send 5"},
		{"both send", func(r int, c *Communicator) error {
			return c.Send(t.Context(), collectives.Float32s(make([]float32, 5)), 1-r)
		}, "rank 1 called Send"},
	}
	for _, tc := range p2p {
		t.Run(tc.name, func(t *testing.T) {
			errs := each(comms[:2], tc.call)
			for r, err := range errs {
				if !errors.Is(err, ErrMismatch) {
					t.Fatalf("rank %d: %v, want ErrMismatch", r, err)
				}
			}
			if !strings.Contains(errs[0].Error(), tc.errHas) {
				t.Errorf("rank 0 error %q lacks %q", errs[0], tc.errHas)
			}
		})
	}
	// Still usable.
	bufs := [][]float32{{1, 2}, {3, 4}, {5, 6}}
	mustAll(t, "AllReduce after mismatches", each(comms, func(r int, c *Communicator) error {
		return c.AllReduce(t.Context(), collectives.Float32s(bufs[r]), collectives.Sum)
	}))
	if bufs[1][0] != 9 || bufs[1][1] != 12 {
		t.Fatalf("AllReduce after mismatches = %v, want [9 12]", bufs[1])
	}
}

func TestLocalArgumentErrors(t *testing.T) {
	needFake(t)
	c := group(t, 2, nil)[0]
	f := func(n int) collectives.Buffer { return collectives.Float32s(make([]float32, n)) }
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"reduce-scatter length", c.ReduceScatter(t.Context(), f(5), f(2), collectives.Sum), ErrInvalidArgument},
		{"all-gather length", c.AllGather(t.Context(), f(2), f(5)), ErrInvalidArgument},
		{"all-gather types", c.AllGather(t.Context(), f(2), collectives.Float64s(make([]float64, 4))), ErrInvalidArgument},
		{"broadcast root", c.Broadcast(t.Context(), f(2), 2), ErrInvalidArgument},
		{"send to self", c.Send(t.Context(), f(2), 0), ErrInvalidArgument},
		{"recv from nowhere", c.Recv(t.Context(), f(2), -1), ErrInvalidArgument},
		{"bad op", c.AllReduce(t.Context(), f(2), collectives.Op(7)), ErrUnsupported},
		{"bad dtype", c.AllReduce(t.Context(), collectives.Buffer{}, collectives.Sum), ErrUnsupported},
	}
	for _, tc := range tests {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	if n := len(fake.Records("ncclAllReduce", "ncclAllGather", "ncclBroadcast", "ncclReduceScatter", "ncclSend")); n != 0 {
		t.Errorf("%d NCCL calls for rejected arguments, want 0", n)
	}
}

// A cancelled or timed-out context ends a collective whose peer never comes,
// by aborting the communicator; later calls report the abort.
func TestContextEndAbortsHungCollective(t *testing.T) {
	for _, check := range []bool{true, false} {
		t.Run(map[bool]string{true: "hang in shape check", false: "hang in payload"}[check], func(t *testing.T) {
			needFake(t)
			comms := group(t, 2, func(c *Config) { c.CheckShapes = check })
			ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := comms[0].AllReduce(ctx, collectives.Float32s(make([]float32, 16)), collectives.Sum)
			if !errors.Is(err, ErrAborted) || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, collectives.ErrBroken) {
				t.Fatalf("AllReduce = %v, want ErrAborted (collectives.ErrBroken) and DeadlineExceeded", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("abort took %s", d)
			}
			if !strings.Contains(err.Error(), "rank 0 of 2") {
				t.Errorf("error %q does not name the rank", err)
			}
			aborts := fake.Records("ncclCommAbort")
			if len(aborts) != 1 || aborts[0].Rank != 0 {
				t.Fatalf("ncclCommAbort calls %v, want one by rank 0", aborts)
			}
			if err := comms[0].Barrier(t.Context()); !errors.Is(err, ErrAborted) {
				t.Errorf("Barrier after abort = %v, want ErrAborted", err)
			}
			// The peer sees the abort as a remote error.
			err = comms[1].AllReduce(t.Context(), collectives.Float32s(make([]float32, 16)), collectives.Sum)
			if !errors.Is(err, ErrRemote) || !errors.Is(err, ErrAborted) {
				t.Errorf("peer AllReduce = %v, want ErrRemote and ErrAborted", err)
			}
		})
	}
}

func TestConfigTimeoutAbortsInit(t *testing.T) {
	needFake(t)
	cfg := fakeConfig(t, 0, 2, collectives.NewMemStore(), "k")
	cfg.Timeout = 100 * time.Millisecond
	_, err := New(t.Context(), cfg) // rank 1 never joins
	if !errors.Is(err, ErrAborted) || !errors.Is(err, context.DeadlineExceeded) ||
		!errors.Is(err, ErrTimeout) || !errors.Is(err, collectives.ErrTimeout) {
		t.Fatalf("New = %v, want ErrAborted, ErrTimeout (collectives.ErrTimeout) and DeadlineExceeded", err)
	}
	if n := len(fake.Records("ncclCommAbort")); n != 1 {
		t.Errorf("%d ncclCommAbort calls, want 1", n)
	}
}

func TestRankWaitsForUniqueID(t *testing.T) {
	needFake(t)
	store := collectives.NewMemStore()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := New(ctx, fakeConfig(t, 1, 2, store, "never-set"))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `"never-set"`) {
		t.Fatalf("New = %v, want DeadlineExceeded naming the key", err)
	}
	store.Set(t.Context(), "short", []byte("abc"))
	_, err = New(t.Context(), fakeConfig(t, 1, 2, store, "short"))
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "3 bytes, want 128") {
		t.Fatalf("New with a 3-byte id = %v", err)
	}
	if n := len(fake.Records("ncclCommInitRankConfig")); n != 0 {
		t.Errorf("%d ncclCommInitRankConfig calls without a valid id", n)
	}
}

// TestAbortFromAnotherGoroutine: rank 0 broadcasts alone, so its call stays
// in flight (enqueued, the stream never drains); Abort from another
// goroutine, once the fake has recorded the enqueue, ends it.
func TestAbortFromAnotherGoroutine(t *testing.T) {
	needFake(t)
	comms := group(t, 2, nil)
	// With CheckShapes (the default) the first call enqueued is the shape
	// all-gather, then the broadcast itself.
	calls := func() int { return len(fake.Records("ncclAllGather", "ncclBroadcast")) }
	before := calls()
	done := make(chan error, 1)
	go func() { done <- comms[0].Broadcast(t.Context(), collectives.Float32s(make([]float32, 4)), 0) }()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for calls() == before {
		select {
		case err := <-done:
			t.Fatalf("Broadcast returned before it enqueued anything: %v", err)
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			t.Fatal("Broadcast enqueued nothing within 30s")
		}
	}
	comms[0].Abort()
	err := <-done
	if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "Abort called") {
		t.Fatalf("Broadcast = %v, want ErrAborted from Abort", err)
	}
	comms[0].Abort() // idempotent
	if n := len(fake.Records("ncclCommAbort")); n != 1 {
		t.Errorf("%d ncclCommAbort calls, want 1", n)
	}
}

// NCCL and CUDA failures surface as typed errors carrying the libraries' own
// strings.
func TestErrorMapping(t *testing.T) {
	needFake(t)
	comms := group(t, 1, nil)
	c := comms[0]
	buf := collectives.Float32s(make([]float32, 8))

	fake.Inject("ncclAllReduce", resInvalidArgument, 0)
	err := c.AllReduce(t.Context(), buf, collectives.Sum)
	var ne *Error
	if !errors.As(err, &ne) || !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("AllReduce = %v, want *Error wrapping ErrInvalidArgument", err)
	}
	if ne.Func != "ncclAllReduce" || ne.Code != 4 || ne.Text != "fake: invalid argument" ||
		ne.Detail != "fake: injected failure in ncclAllReduce" {
		t.Errorf("Error = %+v", *ne)
	}
	// A synchronous argument error leaves the communicator usable.
	if err := c.AllReduce(t.Context(), buf, collectives.Sum); err != nil {
		t.Fatalf("AllReduce after an argument error: %v", err)
	}

	fake.Inject("cudaMalloc", 2, 0)
	err = c.AllReduce(t.Context(), collectives.Float32s(make([]float32, 1<<12)), collectives.Sum)
	if !errors.Is(err, ErrCUDA) || !strings.Contains(err.Error(), "fake: out of memory") || !strings.Contains(err.Error(), "cudaMalloc") {
		t.Fatalf("AllReduce with cudaMalloc failing = %v", err)
	}

	fake.Inject("asyncError", resRemoteError, 0)
	err = c.AllReduce(t.Context(), buf, collectives.Sum)
	if !errors.Is(err, ErrRemote) || !errors.Is(err, ErrAborted) || !errors.Is(err, collectives.ErrPeerLost) {
		t.Fatalf("AllReduce with an async remote error = %v, want ErrRemote (collectives.ErrPeerLost) and ErrAborted", err)
	}

	c2 := group(t, 1, nil)[0]
	fake.Inject("cudaStreamQuery", 700, 0)
	err = c2.Barrier(t.Context())
	if !errors.Is(err, ErrCUDA) || !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "illegal memory access") {
		t.Fatalf("Barrier with cudaStreamQuery failing = %v, want ErrCUDA and ErrAborted", err)
	}
}

func TestCloseReleasesEverything(t *testing.T) {
	needFake(t)
	before := fake.LiveAllocs()
	c, err := New(t.Context(), fakeConfig(t, 0, 1, nil, ""))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AllReduce(t.Context(), collectives.Float64s(make([]float64, 100)), collectives.Sum); err != nil {
		t.Fatal(err)
	}
	if got := fake.LiveAllocs() - before; got != 2 {
		t.Errorf("%d device allocations while open, want 2 (descriptors and payload)", got)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if n := len(fake.Records("ncclCommDestroy")); n != 1 {
		t.Errorf("%d ncclCommDestroy calls, want 1", n)
	}
	if err := c.Barrier(t.Context()); !errors.Is(err, ErrClosed) || !errors.Is(err, collectives.ErrClosed) {
		t.Errorf("Barrier after Close = %v, want ErrClosed", err)
	}
}

// The payload scratch grows to the largest buffer and is reused.
func TestScratchReused(t *testing.T) {
	needFake(t)
	c := group(t, 1, nil)[0]
	for _, n := range []int{1000, 10, 1000, 500} {
		if err := c.AllReduce(t.Context(), collectives.Float32s(make([]float32, n)), collectives.Sum); err != nil {
			t.Fatal(err)
		}
	}
	var payload []int64
	for _, r := range fake.Records("cudaMalloc")[1:] { // [0] is the descriptor block
		payload = append(payload, r.Bytes)
	}
	if len(payload) != 1 || payload[0] != 4096 {
		t.Errorf("payload cudaMalloc sizes %v, want one of 4096", payload)
	}
}

// checkPipeline sends val(r, i) for i < n from every rank r to r+1 and
// checks what each rank received.
func checkPipeline(t *testing.T, comms []*Communicator, n int, val func(r, i int) float64) {
	t.Helper()
	world := len(comms)
	got := make([][]float64, world)
	mustAll(t, "Send/Recv", each(comms, func(r int, c *Communicator) error {
		got[r] = make([]float64, n)
		if r > 0 {
			if err := c.Recv(t.Context(), collectives.Float64s(got[r]), r-1); err != nil {
				return err
			}
		}
		if r < world-1 {
			out := make([]float64, n)
			for i := range out {
				out[i] = val(r, i)
			}
			return c.Send(t.Context(), collectives.Float64s(out), r+1)
		}
		return nil
	}))
	for r := 1; r < world; r++ {
		for i := range n {
			if got[r][i] != val(r-1, i) {
				t.Fatalf("world %d n %d: rank %d received [%d] = %v, want %v", world, n, r, i, got[r][i], val(r-1, i))
			}
		}
	}
}
