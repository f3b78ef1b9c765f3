package bench

import (
	"errors"
	"strings"
	"testing"
)

func TestMemoryNeeded(t *testing.T) {
	const (
		KiB = int64(1) << 10
		MiB = int64(1) << 20
		GiB = int64(1) << 30
	)
	tests := []struct {
		name  string
		op    string
		np    int
		sizes []int
		mod   func(*Config)
		want  int64 // by hand: ranks x (buffer + shard + scratch)
	}{
		// 4 x (4 GiB buffer + 1 GiB shard); the ring uses no scratch.
		{name: "allreduce 4G on 4", op: "allreduce", np: 4, sizes: []int{4 << 30}, want: 4 * (4*GiB + GiB)},
		// Largest buffers at 64 MiB (64 + 16 MiB); the largest scratch is
		// recursive doubling's at 64 KiB, the default SmallBytes.
		{name: "default sweep", op: "allreduce", np: 4, want: 4 * (64*MiB + 16*MiB + 64*KiB)},
		// Reduce-scatter keeps a scratch as large as its input.
		{name: "reducescatter 4G on 4", op: "reducescatter", np: 4, sizes: []int{4 << 30}, want: 4 * (4*GiB + GiB + 4*GiB)},
		// 1024 elements round down to 1023 (a multiple of 3): 4092 bytes and
		// a 341-element shard of 1364 bytes.
		{name: "allgather rounds to whole blocks", op: "allgather", np: 3, sizes: []int{4096}, want: 3 * (4092 + 1364)},
		// 256 elements, an 85-element shard (340 bytes); the one-round
		// all-reduce holds all 3 buffers.
		{name: "direct allreduce", op: "allreduce", np: 3, sizes: []int{1024}, mod: func(c *Config) { c.DirectBytes = 1024 },
			want: 3 * (1024 + 340 + 3*1024)},
		{name: "one rank has no scratch", op: "allreduce", np: 1, sizes: []int{4 << 20}, want: 4*MiB + 4*MiB},
		{name: "broadcast", op: "broadcast", np: 2, sizes: []int{1 << 20}, want: 2 * (MiB + MiB/2)},
		{name: "no ranks", op: "allreduce", np: 0, sizes: []int{1 << 20}, want: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Op, cfg.NP = tc.op, tc.np
			if tc.sizes != nil {
				cfg.Sizes = tc.sizes
			}
			if tc.mod != nil {
				tc.mod(cfg)
			}
			if got := cfg.MemoryNeeded(); got != tc.want {
				t.Errorf("MemoryNeeded = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestCheckMemory(t *testing.T) {
	cfg := DefaultConfig()
	cfg.NP, cfg.Sizes = 4, []int{4 << 30} // needs 20 GiB
	gib := func(x float64) int64 { return int64(x * (1 << 30)) }

	err := cfg.CheckMemory(gib(21.3))
	if !errors.Is(err, ErrMemory) {
		t.Fatalf("CheckMemory(21.3 GiB) = %v, want ErrMemory", err)
	}
	const want = "bench: not enough memory: sizes up to 4 GiB on 4 ranks need about 20.0 GiB, more than 80% of the 21.3 GiB available"
	if err.Error() != want {
		t.Errorf("error = %q, want %q", err, want)
	}
	// 80% of 25 GiB is exactly the 20 GiB needed.
	if err := cfg.CheckMemory(gib(25)); err != nil {
		t.Errorf("CheckMemory(25 GiB) = %v, want nil", err)
	}
}

func TestParseMemAvailable(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    int64
		wantErr bool
	}{
		{name: "linux", in: "MemTotal:       24146048 kB\nMemFree:         1234567 kB\nMemAvailable:   22334455 kB\nBuffers:           12345 kB\n",
			want: 22334455 << 10},
		{name: "no line", in: "MemTotal:       24146048 kB\nMemFree:         1234567 kB\n", wantErr: true},
		{name: "odd unit", in: "MemAvailable:   22334455 MB\n", wantErr: true},
		{name: "not a number", in: "MemAvailable:   lots kB\n", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMemAvailable(strings.NewReader(tc.in))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseMemAvailable = %d, %v; want %d, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestSizeString(t *testing.T) {
	for _, tc := range []struct {
		in   int64
		want string
	}{{4 << 30, "4 GiB"}, {3 << 10, "3 KiB"}, {1536 << 10, "1536 KiB"}, {4092, "4092 B"}, {1 << 40, "1 TiB"}} {
		if got := sizeString(tc.in); got != tc.want {
			t.Errorf("sizeString(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
