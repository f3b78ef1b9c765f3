//go:build race

package e2e

// race says whether the tests run with the race detector.
const race = true
