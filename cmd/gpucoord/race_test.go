//go:build race

package main

// raceEnabled: the tests run under the race detector, and so do the
// gpucoord processes they start (the ranks excepted: see buildBinary).
const raceEnabled = true
