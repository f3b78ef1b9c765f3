package engine

import (
	"math"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
)

// gemm sets c = op(a)·op(b) + beta·c for row-major matrices, where op(a) is
// m x k, op(b) is k x n and c is m x n; transA and transB say that a or b is
// stored transposed. It is the only matrix multiply of the engine.
func gemm(transA, transB bool, m, n, k int, a, b []float32, beta float32, c []float32) {
	if m == 0 || n == 0 {
		return
	}
	ta, tb := blas.NoTrans, blas.NoTrans
	ga := blas32.General{Rows: m, Cols: k, Stride: k, Data: a}
	if transA {
		ta = blas.Trans
		ga = blas32.General{Rows: k, Cols: m, Stride: m, Data: a}
	}
	gb := blas32.General{Rows: k, Cols: n, Stride: n, Data: b}
	if transB {
		tb = blas.Trans
		gb = blas32.General{Rows: n, Cols: k, Stride: k, Data: b}
	}
	blas32.Gemm(ta, tb, 1, ga, gb, beta, blas32.General{Rows: m, Cols: n, Stride: n, Data: c})
}

// addRowVec adds the vector v (length cols) to every row of x.
func addRowVec(x []float32, cols int, v []float32) {
	for i := 0; i < len(x); i += cols {
		row := x[i : i+cols]
		for j, b := range v {
			row[j] += b
		}
	}
}

// accColSum adds the column sums of x (rows of length cols) to dst.
func accColSum(dst []float32, x []float32, cols int) {
	for i := 0; i < len(x); i += cols {
		row := x[i : i+cols]
		for j, g := range row {
			dst[j] += g
		}
	}
}

// geluC is sqrt(2/pi), the constant of the tanh approximation of GeLU.
const geluC = 0.7978845608028654

// activate sets a = act(z) element-wise.
func activate(kind string, z, a []float32) {
	if kind == ActTanh {
		for i, v := range z {
			a[i] = float32(math.Tanh(float64(v)))
		}
		return
	}
	for i, v := range z {
		x := float64(v)
		a[i] = float32(0.5 * x * (1 + math.Tanh(geluC*(x+0.044715*x*x*x))))
	}
}

// activateGrad multiplies dz in place by act'(z).
func activateGrad(kind string, z, dz []float32) {
	if kind == ActTanh {
		for i, v := range z {
			t := math.Tanh(float64(v))
			dz[i] *= float32(1 - t*t)
		}
		return
	}
	for i, v := range z {
		x := float64(v)
		t := math.Tanh(geluC * (x + 0.044715*x*x*x))
		d := 0.5*(1+t) + 0.5*x*(1-t*t)*geluC*(1+3*0.044715*x*x)
		dz[i] *= float32(d)
	}
}
