//go:build !amd64

package collectives

func sumF32Arch(d, x, y []float32) { sumF32Go(d, x, y) }
