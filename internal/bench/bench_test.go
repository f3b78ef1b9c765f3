package bench

import (
	"slices"
	"testing"
)

func TestParseSizes(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		wantErr bool
	}{
		{in: "4K:64K", want: []int{4096, 8192, 16384, 32768, 65536}},
		{in: "1M,16MiB", want: []int{1 << 20, 16 << 20}},
		{in: "4096", want: []int{4096}},
		{in: "1G", want: []int{1 << 30}},
		{in: "1MB,2KB,1GB", want: []int{1 << 20, 2 << 10, 1 << 30}},
		{in: "512B", want: []int{512}},
		{in: "3K:8K", want: []int{3072, 6144}},
		{in: "64K:4K", wantErr: true},
		{in: "", wantErr: true},
		{in: "-4K", wantErr: true},
		{in: "4X", wantErr: true},
	}
	for _, tc := range tests {
		got, err := ParseSizes(tc.in)
		if (err != nil) != tc.wantErr || !slices.Equal(got, tc.want) {
			t.Errorf("ParseSizes(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestBusFactor(t *testing.T) {
	// nccl-tests' definitions (doc/PERFORMANCE.md there).
	for _, tc := range []struct {
		op   string
		n    int
		want float64
	}{{"allreduce", 4, 1.5}, {"allreduce", 2, 1}, {"reducescatter", 4, 0.75}, {"allgather", 8, 0.875}, {"broadcast", 8, 1}} {
		if got := busFactor(tc.op, tc.n); got != tc.want {
			t.Errorf("busFactor(%s, %d) = %v, want %v", tc.op, tc.n, got, tc.want)
		}
	}
}
