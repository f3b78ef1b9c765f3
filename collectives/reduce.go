package collectives

import (
	"fmt"
	"math"
	"unsafe"
)

// String returns the type's name.
func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	case BFloat16:
		return "bfloat16"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// String returns the operator's name.
func (o Op) String() string {
	switch o {
	case Sum:
		return "sum"
	case Max:
		return "max"
	case Min:
		return "min"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

func validOp(o Op) bool { return o >= Sum && o <= Min }

// Reduce sets dst[i] = a[i] op b[i] element-wise over raw little-endian
// memory of type dt. dst may alias a or b exactly. All three slices must have
// the same length, a multiple of dt.Size(), and be aligned to it (slices of
// a Buffer are). The result is a pure function of (a, b): transports call it
// while receiving, and every rank gets the same bits.
//
// Max and Min propagate NaN. BFloat16 is reduced in float32 and rounded to
// nearest even.
func Reduce(dt DType, op Op, dst, a, b []byte) {
	if len(dst) == 0 {
		return
	}
	switch dt {
	case Float32:
		d, x, y := f32s(dst), f32s(a), f32s(b)
		if op == Sum {
			sumF32(d, x, y)
		} else {
			extremes(op, d, x, y)
		}
	case Float64:
		d, x, y := f64s(dst), f64s(a), f64s(b)
		x, y = x[:len(d)], y[:len(d)]
		if op == Sum {
			for i := range d {
				d[i] = x[i] + y[i]
			}
		} else {
			extremes(op, d, x, y)
		}
	case BFloat16:
		d, x, y := u16s(dst), u16s(a), u16s(b)
		x, y = x[:len(d)], y[:len(d)]
		for i := range d {
			p, q := bf16ToF32(x[i]), bf16ToF32(y[i])
			var r float32
			switch op {
			case Sum:
				r = p + q
			case Max:
				r = maxNaN(p, q)
			case Min:
				r = minNaN(p, q)
			}
			d[i] = F32ToBF16(r)
		}
	}
}

// sumF32 is the hot loop of a float32 all-reduce: d = x + y.
func sumF32(d, x, y []float32) {
	n := len(d)
	if n == 0 {
		return
	}
	x, y = x[:n], y[:n]
	sumF32Arch(d, x, y)
}

// extremes sets d to the element-wise Max or Min of x and y.
func extremes[T float32 | float64](op Op, d, x, y []T) {
	x, y = x[:len(d)], y[:len(d)]
	switch op {
	case Max:
		for i := range d {
			d[i] = maxNaN(x[i], y[i])
		}
	case Min:
		for i := range d {
			d[i] = minNaN(x[i], y[i])
		}
	}
}

// maxNaN returns the larger of a and b, or a NaN if either is one (a's
// first), like MPI and NCCL implementations that propagate NaN.
func maxNaN[T float32 | float64](a, b T) T {
	switch {
	case a != a:
		return a
	case b != b, b > a:
		return b
	}
	return a
}

// minNaN returns the smaller of a and b, NaN-propagating as maxNaN.
func minNaN[T float32 | float64](a, b T) T {
	switch {
	case a != a:
		return a
	case b != b, b < a:
		return b
	}
	return a
}

func bf16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// BF16ToF32 widens a bfloat16 to float32 exactly.
func BF16ToF32(h uint16) float32 { return bf16ToF32(h) }

// F32ToBF16 rounds f to the nearest bfloat16, ties to even; NaN stays NaN.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep it quiet and non-zero
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

func f32s(b []byte) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

func f64s(b []byte) []float64 {
	return unsafe.Slice((*float64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
}

func u16s(b []byte) []uint16 {
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/2)
}
