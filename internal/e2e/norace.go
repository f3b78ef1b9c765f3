//go:build !race

package e2e

// Race says whether the tests run with the race detector.
const Race = false
