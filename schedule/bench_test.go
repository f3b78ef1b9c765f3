package schedule

import (
	"fmt"
	"io"
	"testing"
)

var benchShapes = []struct {
	kind    Kind
	p, m, v int
}{
	{OneFOneB, 8, 64, 1},
	{ZBH1, 8, 64, 1},
	{Interleaved, 8, 64, 2},
	{GPipe, 8, 64, 1},
	{OneFOneB, 64, 512, 1},
	{Interleaved, 64, 512, 4},
}

func benchName(kind Kind, p, m, v int) string { return fmt.Sprintf("%s/p%d_m%d_v%d", kind, p, m, v) }

// BenchmarkBuildSimulate is what the planner's --auto search pays per
// candidate shape: Build, then Simulate.
func BenchmarkBuildSimulate(b *testing.B) {
	c := Costs{F: 1, B: 1, W: 1, Comm: 0.1}
	for _, sh := range benchShapes {
		b.Run(benchName(sh.kind, sh.p, sh.m, sh.v), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				s, err := Build(sh.kind, sh.p, sh.m, sh.v)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := Simulate(s, c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSimulate re-simulates a built schedule, as the planner does when
// it varies costs for one shape.
func BenchmarkSimulate(b *testing.B) {
	c := Costs{F: 1, B: 1, W: 1, Comm: 0.1}
	for _, sh := range benchShapes {
		s, err := Build(sh.kind, sh.p, sh.m, sh.v)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(benchName(sh.kind, sh.p, sh.m, sh.v), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Simulate(s, c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkValidate is what an executor pays to check op lists before a run.
func BenchmarkValidate(b *testing.B) {
	for _, sh := range benchShapes {
		s, err := Build(sh.kind, sh.p, sh.m, sh.v)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(benchName(sh.kind, sh.p, sh.m, sh.v), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := s.Validate(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRenderSVG renders the timeline of a mid-size schedule.
func BenchmarkRenderSVG(b *testing.B) {
	res := mustSimulate(b, Interleaved, 8, 64, 2, Costs{F: 1, B: 2})
	b.ReportAllocs()
	for b.Loop() {
		if err := res.RenderSVG(io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}
