// Package slurmtest runs gpucoord on a Slurm cluster in a box: slurmctld
// on a login host and slurmd on compute hosts, each a network namespace
// (root). Its tests are a package of their own so that go test runs them
// beside cmd/gpucoord's, not in its parallel slots: a box at a time, each
// test mostly waiting on Slurm's own timers, they held up to all four of
// that package's slots while the machine sat half idle.
package slurmtest

import (
	"testing"

	"github.com/gpucoord/gpucoord/internal/e2e"
)

func TestMain(m *testing.M) { e2e.Main(m) }
