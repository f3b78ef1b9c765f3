package bench

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// MaxMemoryFraction is the share of the available memory a run may need
// before Config.CheckMemory refuses it; the rest is left for the Go
// runtime, the transports and everything else on the machine.
const MaxMemoryFraction = 0.8

// MemoryNeeded returns about how many bytes a run of c holds at its peak,
// over all ranks together. Each rank allocates, for the size it is timing,
// the operation's buffer and a shard of 1/NP of it (measure), and the
// collectives keep a scratch buffer that only grows: as large as the buffer
// for a reduce-scatter, NP buffers for a one-round all-reduce (DirectBytes)
// and one for recursive doubling (SmallBytes). A rank's peak is its largest
// buffers plus its largest scratch; socket buffers, shared-memory rings and
// the runtime's own overhead are small beside them and left out. With nccl
// the host holds the same buffers, to set the data up and check it, and no
// scratch: the operation runs in device memory, which is not counted.
func (c *Config) MemoryNeeded() int64 {
	n := c.NP
	if n < 1 {
		return 0
	}
	cc := c.collectives()
	var bufs, scratch int64
	for _, size := range c.Sizes {
		count := elements(c.Op, n, size)
		b := 4 * int64(count)
		bufs = max(bufs, b+4*int64(count/n))
		if n == 1 || c.Backend == "nccl" {
			continue
		}
		switch {
		case c.Op == "reducescatter":
			scratch = max(scratch, b)
		case c.Op == "allreduce" && b <= int64(cc.DirectBytes):
			scratch = max(scratch, int64(n)*b)
		case c.Op == "allreduce" && b <= int64(cc.SmallBytes):
			scratch = max(scratch, b)
		}
	}
	return int64(n) * (bufs + scratch)
}

// CheckMemory returns an error wrapping ErrMemory, naming what the run
// needs and what is available, when MemoryNeeded is more than
// MaxMemoryFraction of available bytes. Callers get available from
// MemAvailable and skip the check when it cannot be read.
func (c *Config) CheckMemory(available int64) error {
	need := c.MemoryNeeded()
	if float64(need) <= MaxMemoryFraction*float64(available) {
		return nil
	}
	largest := 0
	if len(c.Sizes) > 0 {
		largest = slices.Max(c.Sizes)
	}
	return fmt.Errorf("%w: sizes up to %s on %d ranks need about %s, more than %.0f%% of the %s available",
		ErrMemory, sizeString(int64(largest)), c.NP, gib(need), 100*MaxMemoryFraction, gib(available))
}

// MemAvailable returns the kernel's estimate of the memory available to new
// work without swapping (MemAvailable in /proc/meminfo), in bytes. It fails
// where /proc/meminfo cannot be read or has no such line (not Linux, or a
// kernel before 3.14).
func MemAvailable() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	defer f.Close()
	return parseMemAvailable(f)
}

// parseMemAvailable reads the MemAvailable line ("MemAvailable: 123 kB")
// of a /proc/meminfo listing.
func parseMemAvailable(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("bench: /proc/meminfo: unexpected line %q", sc.Text())
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 {
			return 0, fmt.Errorf("bench: /proc/meminfo: unexpected line %q", sc.Text())
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("bench: /proc/meminfo: %w", err)
	}
	return 0, fmt.Errorf("bench: /proc/meminfo has no MemAvailable line")
}

// sizeString writes a byte count in the largest binary unit that holds it
// whole ("4 GiB", "1536 KiB"), as --sizes accepts it.
func sizeString(b int64) string {
	for _, u := range []struct {
		name  string
		shift uint
	}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}} {
		if b >= 1<<u.shift && b%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d %s", b>>u.shift, u.name)
		}
	}
	return fmt.Sprintf("%d B", b)
}

// gib writes a byte count in GiB with one decimal.
func gib(b int64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }
