//go:build !amd64

package collectives

func sumF32Arch(d, x, y []float32) { sumF32Go(d, x, y) }

// sumF32Go is the portable loop, unrolled by 8.
func sumF32Go(d, x, y []float32) {
	n := len(d)
	x, y = x[:n], y[:n]
	i := 0
	for ; i+8 <= n; i += 8 {
		dd, xx, yy := d[i:i+8:i+8], x[i:i+8:i+8], y[i:i+8:i+8]
		dd[0] = xx[0] + yy[0]
		dd[1] = xx[1] + yy[1]
		dd[2] = xx[2] + yy[2]
		dd[3] = xx[3] + yy[3]
		dd[4] = xx[4] + yy[4]
		dd[5] = xx[5] + yy[5]
		dd[6] = xx[6] + yy[6]
		dd[7] = xx[7] + yy[7]
	}
	for ; i < n; i++ {
		d[i] = x[i] + y[i]
	}
}
