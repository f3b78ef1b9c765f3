// Package schedule holds micro-batch pipeline schedules as data: for each
// pipeline rank, the ordered list of forward, backward, weight-gradient,
// send, receive and optimizer ops one training step runs. It builds GPipe,
// 1F1B, Megatron-LM's interleaved 1F1B and ZB-H1 (Qi et al. 2023), validates
// op lists (dependencies, matched transfers, no deadlock under blocking
// sends), simulates them for given pass times (makespan, bubble, busy time,
// peak in-flight activations) and renders the timeline as text or SVG.
//
// The planner (topology/estimate) reads bubbles and in-flight counts from
// here and the engine (worker/engine) executes the same op lists, so a dry
// run and a real run never disagree. The package imports nothing of ours and
// does no I/O beyond the writers handed to the renderers.
//
// # Usage
//
//	s, err := schedule.Build(schedule.Interleaved, 4, 16, 2) // p, m, v
//	if err != nil { ... }                                    // ErrBadShape names the rule
//	if err := s.Validate(); err != nil { ... }               // optional: Build's output is valid
//	res, err := schedule.Simulate(s, schedule.Costs{F: 1, B: 2})
//	fmt.Println(res.BubbleFraction, res.PeakInFlight)        // 3/32, [11 9 7 5]
//	res.RenderText(os.Stdout, 100)
//	res.RenderSVG(f)
//
// An executor walks s.Ranks[myRank] in order: Forward and Backward run the
// chunk's passes, SendAct/SendGrad and RecvAct/RecvGrad move tensors to and
// from Op.Peer (whose chunk is Op.PeerChunk), WeightGrad runs the split
// weight-gradient pass, OptimizerStep ends the step. Chunk c of rank r is
// virtual stage c*p + r.
//
// # Conventions
//
// Bubble fraction is bubble time over ideal compute time (Narayanan et al.
// 2021): (makespan - m*v*(F+B+W)) / (m*v*(F+B+W)), which is (p-1)/m for GPipe
// and 1F1B and (p-1)/(v*m) for interleaved 1F1B with F=B, W=0 and no
// communication cost. Peak in-flight activations count (micro-batch, chunk)
// pairs from Forward to Backward; for ZB-H1 the Backward (input gradient)
// frees them and Result.PeakPendingW counts what waits for its WeightGrad.
// docs/SCHEDULES.md has the derivations and the deadlock argument.
//
// # Concurrency
//
// Schedules and Results are plain values; Build, Validate, Simulate and the
// renderers keep no shared state and may run concurrently on different or
// shared (unmodified) inputs.
package schedule
