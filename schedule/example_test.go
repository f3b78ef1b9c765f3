package schedule_test

import (
	"fmt"
	"os"

	"github.com/gpucoord/gpucoord/schedule"
)

// Build a schedule, check it, and read the bubble and the activations each
// rank holds at its peak.
func ExampleBuild() {
	s, err := schedule.Build(schedule.OneFOneB, 4, 8, 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := s.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	res, err := schedule.Simulate(s, schedule.Costs{F: 1, B: 2})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("makespan %g, bubble %.3f = (p-1)/m, peak in-flight %v\n", res.Makespan, res.BubbleFraction, res.PeakInFlight)
	// Output: makespan 33, bubble 0.375 = (p-1)/m, peak in-flight [4 3 2 1]
}

// Interleaving v chunks per rank divides the bubble by v at the price of
// more activations in flight.
func ExampleBuild_interleaved() {
	s, err := schedule.Build(schedule.Interleaved, 4, 8, 2)
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := schedule.Simulate(s, schedule.Costs{F: 1, B: 2})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("bubble %.4f = (p-1)/(v*m), peak in-flight %v\n", res.BubbleFraction, res.PeakInFlight)
	// Output: bubble 0.1875 = (p-1)/(v*m), peak in-flight [11 9 7 5]
}

// The executor's view: rank 1's op list of a two-stage 1F1B step.
func Example_executor() {
	s, err := schedule.Build(schedule.OneFOneB, 2, 2, 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, op := range s.Ranks[1] {
		fmt.Println(op)
	}
	// Output:
	// RecvAct(mb=0,c=0 <- rank 0 c=0)
	// F(mb=0,c=0)
	// RecvAct(mb=1,c=0 <- rank 0 c=0)
	// B(mb=0,c=0)
	// SendGrad(mb=0,c=0 -> rank 0 c=0)
	// F(mb=1,c=0)
	// B(mb=1,c=0)
	// SendGrad(mb=1,c=0 -> rank 0 c=0)
	// OptimizerStep
}

// ZB-H1 splits the backward pass; with equal F, B and W its bubble is a third
// of 1F1B's at the same peak in-flight activations.
func ExampleResult_RenderText() {
	s, err := schedule.Build(schedule.ZBH1, 3, 3, 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := schedule.Simulate(s, schedule.Costs{F: 1, B: 1, W: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := res.RenderText(os.Stdout, 22); err != nil {
		fmt.Println(err)
	}
	// Output:
	// zb-h1 p=3 m=3 v=1  F=1 B=1 W=1 comm=0  makespan 11  bubble 22.22%
	// rank 0 |F0F1F2....B0W0B1W1B2W2| peak 3
	// rank 1 |..F0F1..B0F2B1W0B2W1W2| peak 2
	// rank 2 |....F0B0F1B1F2B2W0W1W2| peak 1
}
