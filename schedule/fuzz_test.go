package schedule

import (
	"errors"
	"testing"
)

// FuzzBuild builds schedules of arbitrary small shapes: Build either refuses
// with ErrBadShape or returns op lists that validate and simulate, with the
// bubble and peak counts inside their bounds.
func FuzzBuild(f *testing.F) {
	f.Add(uint8(0), uint8(4), uint8(8), uint8(1))
	f.Add(uint8(1), uint8(3), uint8(2), uint8(1))
	f.Add(uint8(2), uint8(4), uint8(8), uint8(3))
	f.Add(uint8(3), uint8(5), uint8(3), uint8(1))
	f.Add(uint8(2), uint8(3), uint8(4), uint8(2))
	f.Fuzz(func(t *testing.T, k, p, m, v uint8) {
		kind := Kinds()[int(k)%len(Kinds())]
		// Keep shapes small so that each input runs in microseconds.
		P, M, Vv := int(p%17), int(m%33), int(v%5)
		s, err := Build(kind, P, M, Vv)
		if err != nil {
			if !errors.Is(err, ErrBadShape) {
				t.Fatalf("Build(%s, %d, %d, %d): %v, want ErrBadShape", kind, P, M, Vv, err)
			}
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("Build(%s, %d, %d, %d) does not validate: %v", kind, P, M, Vv, err)
		}
		res, err := Simulate(s, Costs{F: 1, B: 2, W: 1, Comm: 0.25})
		if err != nil {
			t.Fatal(err)
		}
		if res.BubbleFraction < 0 || res.Makespan < res.Ideal {
			t.Fatalf("makespan %v below ideal %v", res.Makespan, res.Ideal)
		}
		for r, n := range res.PeakInFlight {
			if n < 1 || n > M*Vv {
				t.Fatalf("rank %d peak in-flight %d outside [1, m*v=%d]", r, n, M*Vv)
			}
		}
	})
}
