package engine

import "fmt"

// opKind is what one entry of a pipeline rank's op list does.
type opKind int

const (
	opForward  opKind = iota + 1 // forward of (mb, chunk)
	opBackward                   // input-gradient pass; with full set, the weight gradient too
	opWeight                     // weight-gradient pass of a split backward (zero-bubble)
	opSendAct                    // send the forward output of (mb, chunk) to peer
	opRecvAct                    // receive the forward input of (mb, chunk) from peer
	opSendGrad                   // send the input gradient of (mb, chunk) to peer
	opRecvGrad                   // receive the output gradient of (mb, chunk) from peer
	opStep                       // reduce gradients across DP and step the optimizer
)

// op is one executable operation. chunk is the local (virtual) chunk index
// on the rank, peer a pipeline rank.
type op struct {
	kind  opKind
	mb    int
	chunk int
	peer  int
	full  bool // opBackward also computes the weight gradient
}

// buildSchedule returns the op list of every pipeline rank.
// TODO(engine): replace with gpucoord/schedule.Build once it lands; until
// then only a single stage is supported.
func buildSchedule(kind string, stages, microbatches, virtual int) ([][]op, error) {
	if stages != 1 || virtual != 1 {
		return nil, fmt.Errorf("pipeline schedules are not available yet (pp %d, virtual %d)", stages, virtual)
	}
	var ops []op
	for mb := range microbatches {
		ops = append(ops, op{kind: opForward, mb: mb})
	}
	for mb := range microbatches {
		ops = append(ops, op{kind: opBackward, mb: mb, full: true})
	}
	return [][]op{append(ops, op{kind: opStep})}, nil
}
