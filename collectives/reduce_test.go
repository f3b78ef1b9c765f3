package collectives_test

import (
	"math"
	"testing"
	"unsafe"

	"github.com/gpucoord/gpucoord/collectives"
)

func bytesOf[T any](s []T) []byte {
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

func TestF32ToBF16(t *testing.T) {
	tests := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80},
		{-2, 0xc000},
		{1 + 1.0/256, 0x3f80},           // exactly half way: ties to even (down)
		{1 + 3.0/256, 0x3f82},           // half way above an odd mantissa: up to even
		{1 + 1.0/256 + 1.0/512, 0x3f81}, // above half way: up
		{float32(math.Inf(1)), 0x7f80},  // infinity stays
		{math.MaxFloat32, 0x7f80},       // rounds up to infinity
		{float32(math.Copysign(0, -1)), 0x8000},
	}
	for _, tc := range tests {
		if got := collectives.F32ToBF16(tc.in); got != tc.want {
			t.Errorf("F32ToBF16(%v) = %#04x, want %#04x", tc.in, got, tc.want)
		}
	}
	if nan := collectives.F32ToBF16(float32(math.NaN())); collectives.BF16ToF32(nan) == collectives.BF16ToF32(nan) {
		t.Errorf("NaN became %#04x, not a NaN", nan)
	}
}

func TestReduceKernels(t *testing.T) {
	nan := float32(math.NaN())
	a := []float32{1, -3, nan, 2, 5, 0, 7, 8, 9, 10, 11}
	b := []float32{2, 4, 1, nan, -5, 0, 1, 1, 1, 1, 1}
	tests := []struct {
		op   collectives.Op
		want []float32
	}{
		{collectives.Sum, []float32{3, 1, nan, nan, 0, 0, 8, 9, 10, 11, 12}},
		{collectives.Max, []float32{2, 4, nan, nan, 5, 0, 7, 8, 9, 10, 11}},
		{collectives.Min, []float32{1, -3, nan, nan, -5, 0, 1, 1, 1, 1, 1}},
	}
	same := func(x, y float32) bool { return x == y || (x != x && y != y) }
	for _, tc := range tests {
		for _, order := range []bool{false, true} { // a op b and b op a agree, NaN included
			x, y := a, b
			if order {
				x, y = b, a
			}
			dst := make([]float32, len(a))
			collectives.Reduce(collectives.Float32, tc.op, bytesOf(dst), bytesOf(x), bytesOf(y))
			for i := range dst {
				if !same(dst[i], tc.want[i]) {
					t.Errorf("%s swapped=%v [%d] = %v, want %v", tc.op, order, i, dst[i], tc.want[i])
				}
			}
		}
	}
	// float64 and bfloat16 in place: dst aliases a.
	d := []float64{1.5, -2, 1e308}
	collectives.Reduce(collectives.Float64, collectives.Sum, bytesOf(d), bytesOf(d), bytesOf([]float64{0.25, 2, 1e308}))
	if d[0] != 1.75 || d[1] != 0 || !math.IsInf(d[2], 1) {
		t.Errorf("float64 sum = %v", d)
	}
	h := []uint16{collectives.F32ToBF16(1), collectives.F32ToBF16(256)}
	collectives.Reduce(collectives.BFloat16, collectives.Sum, bytesOf(h), bytesOf(h), bytesOf([]uint16{collectives.F32ToBF16(1.0 / 256), collectives.F32ToBF16(1)}))
	// 1 + 1/256 ties to 1 (even); 256 + 1 = 257 is not representable in 8 bits of mantissa: ties to 256.
	if got := []float32{collectives.BF16ToF32(h[0]), collectives.BF16ToF32(h[1])}; got[0] != 1 || got[1] != 256 {
		t.Errorf("bfloat16 sum = %v, want [1 256]", got)
	}
}

// FuzzHeaderParse: Parse never panics, and whatever it accepts encodes back
// to the same bytes.
func FuzzHeaderParse(f *testing.F) {
	var b [collectives.HeaderSize]byte
	h := collectives.Header{Tag: 7, Seq: 3, Len: 16, Total: 64, Kind: collectives.KindAllReduce, DType: collectives.Float32, Op: collectives.Sum}
	h.Put(b[:])
	f.Add(b[:])
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, in []byte) {
		var h collectives.Header
		if h.Parse(in) != nil {
			return
		}
		var out [collectives.HeaderSize]byte
		h.Put(out[:])
		if string(out[:]) != string(in[:collectives.HeaderSize]) {
			t.Fatalf("round trip %x -> %+v -> %x", in[:collectives.HeaderSize], h, out)
		}
	})
}

// TestSumF32MatchesPortable: the SSE loop gives the portable loop's bits
// for every length around its 16- and 4-element steps, aliased or not,
// including NaN, infinities, signed zeros and subnormals.
func TestSumF32MatchesPortable(t *testing.T) {
	special := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
		math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32, math.MaxFloat32, 1e-40, 3.1415927}
	for n := range 70 {
		x, y := make([]float32, n), make([]float32, n)
		for i := range n {
			x[i] = special[(i*7)%len(special)] + float32(i)*0.1
			y[i] = special[(i*3+1)%len(special)] - float32(i)*0.3
		}
		want := make([]float32, n)
		for i := range n {
			want[i] = x[i] + y[i]
		}
		got := make([]float32, n)
		collectives.Reduce(collectives.Float32, collectives.Sum, bytesOf(got), bytesOf(x), bytesOf(y))
		collectives.Reduce(collectives.Float32, collectives.Sum, bytesOf(x), bytesOf(x), bytesOf(y)) // in place
		for i := range n {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) || math.Float32bits(x[i]) != math.Float32bits(want[i]) {
				t.Fatalf("n=%d [%d]: got %v, in place %v, want %v", n, i, got[i], x[i], want[i])
			}
		}
	}
}

func BenchmarkSumF32(b *testing.B) {
	x, y := make([]float32, 1<<16), make([]float32, 1<<16)
	b.SetBytes(int64(len(x) * 4))
	for b.Loop() {
		collectives.Reduce(collectives.Float32, collectives.Sum, bytesOf(x), bytesOf(x), bytesOf(y))
	}
}
