package collectives

// sumF32SSE adds n float32s: d[i] = x[i] + y[i], four lanes at a time with
// SSE (part of every amd64 CPU), which rounds exactly as the scalar loop.
//
//go:noescape
func sumF32SSE(d, x, y *float32, n int)

func sumF32Arch(d, x, y []float32) { sumF32SSE(&d[0], &x[0], &y[0], len(d)) }
