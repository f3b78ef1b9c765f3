package schedule

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// find returns the index of the first op on rank r matching kind and mb.
func find(t *testing.T, s *Schedule, r int, kind OpKind, mb int) int {
	t.Helper()
	for k, op := range s.Ranks[r] {
		if op.Kind == kind && op.MicroBatch == mb {
			return k
		}
	}
	t.Fatalf("rank %d has no %v of micro-batch %d", r, kind, mb)
	return -1
}

// move moves rank r's op at index from to index to (shifting the others).
func move(s *Schedule, r, from, to int) {
	op := s.Ranks[r][from]
	ops := slices.Delete(s.Ranks[r], from, from+1)
	s.Ranks[r] = slices.Insert(ops, to, op)
}

func TestValidateRejects(t *testing.T) {
	tests := []struct {
		name    string
		kind    Kind
		p, m, v int
		break_  func(t *testing.T, s *Schedule)
		wantErr error
		mention []string
	}{
		{
			name: "missing receive", kind: OneFOneB, p: 2, m: 4, v: 1,
			break_: func(t *testing.T, s *Schedule) {
				k := find(t, s, 1, RecvAct, 1)
				s.Ranks[1] = slices.Delete(s.Ranks[1], k, k+1)
			},
			wantErr: ErrInvalid,
			mention: []string{"rank 1 has no receive of the activation of micro-batch 1 from rank 0 chunk 0"},
		},
		{
			name: "missing send", kind: GPipe, p: 3, m: 2, v: 1,
			break_: func(t *testing.T, s *Schedule) {
				k := find(t, s, 2, SendGrad, 0)
				s.Ranks[2] = slices.Delete(s.Ranks[2], k, k+1)
			},
			wantErr: ErrInvalid,
			mention: []string{"no send of the gradient of micro-batch 0 from rank 2 chunk 0 to rank 1"},
		},
		{
			// The textbook 1F1B deadlock: rank 1 sends gradient 0 before it
			// receives activation 1, while rank 0 sends activation 1 before it
			// receives gradient 0. Both sends block.
			name: "cyclic wait", kind: OneFOneB, p: 2, m: 3, v: 1,
			break_: func(t *testing.T, s *Schedule) {
				recv := find(t, s, 1, RecvAct, 1)
				send := find(t, s, 1, SendGrad, 0)
				move(s, 1, recv, send)
			},
			wantErr: ErrDeadlock,
			mention: []string{"cyclic wait", "rank 0 blocked at op 3 SendAct(mb=1", "rank 1 blocked at op 3 SendGrad(mb=0"},
		},
		{
			name: "backward before forward", kind: OneFOneB, p: 2, m: 2, v: 1,
			break_: func(t *testing.T, s *Schedule) {
				f, b := find(t, s, 1, Forward, 0), find(t, s, 1, Backward, 0)
				s.Ranks[1][f], s.Ranks[1][b] = s.Ranks[1][b], s.Ranks[1][f]
			},
			wantErr: ErrInvalid,
			mention: []string{"rank 1 op 1 B(mb=0,c=0) runs before its Forward"},
		},
		{
			name: "forward before its receive", kind: GPipe, p: 2, m: 2, v: 1,
			break_: func(t *testing.T, s *Schedule) {
				move(s, 1, find(t, s, 1, RecvAct, 0), find(t, s, 1, Forward, 0))
			},
			wantErr: ErrInvalid,
			mention: []string{"F(mb=0,c=0) runs before its input activation"},
		},
		{
			name: "send before its forward", kind: GPipe, p: 2, m: 2, v: 1,
			break_: func(t *testing.T, s *Schedule) {
				move(s, 0, find(t, s, 0, SendAct, 1), find(t, s, 0, Forward, 1))
			},
			wantErr: ErrInvalid,
			mention: []string{"SendAct(mb=1,c=0 -> rank 1 c=0) runs before the Forward"},
		},
		{
			name: "link out of order", kind: GPipe, p: 2, m: 2, v: 1,
			break_: func(t *testing.T, s *Schedule) {
				a, b := find(t, s, 0, SendAct, 0), find(t, s, 0, SendAct, 1)
				s.Ranks[0][a], s.Ranks[0][b] = s.Ranks[0][b], s.Ranks[0][a]
			},
			wantErr: ErrInvalid,
			mention: []string{"link 0->1 out of order", "micro-batch 1", "micro-batch 0"},
		},
		{
			name: "duplicate pass", kind: OneFOneB, p: 2, m: 2, v: 1,
			break_: func(t *testing.T, s *Schedule) {
				k := find(t, s, 0, Forward, 1)
				s.Ranks[0] = slices.Insert(s.Ranks[0], k, s.Ranks[0][k])
			},
			wantErr: ErrInvalid,
			mention: []string{"F(mb=1,c=0): pass appears twice"},
		},
		{
			name: "missing weight gradient", kind: ZBH1, p: 2, m: 2, v: 1,
			break_: func(t *testing.T, s *Schedule) {
				k := find(t, s, 1, WeightGrad, 1)
				s.Ranks[1] = slices.Delete(s.Ranks[1], k, k+1)
			},
			wantErr: ErrInvalid,
			mention: []string{"rank 1 has no W(mb=1,c=0)"},
		},
		{
			name: "weight gradient in 1f1b", kind: OneFOneB, p: 2, m: 2, v: 1,
			break_: func(t *testing.T, s *Schedule) {
				s.Ranks[0] = slices.Insert(s.Ranks[0], 0, compute(WeightGrad, 0, 0))
			},
			wantErr: ErrInvalid,
			mention: []string{"1f1b does not split the backward pass"},
		},
		{
			name: "wrong peer", kind: Interleaved, p: 2, m: 2, v: 2,
			break_: func(t *testing.T, s *Schedule) {
				k := find(t, s, 1, SendAct, 0) // chunk 0 of rank 1 feeds chunk 1 of rank 0
				s.Ranks[1][k].PeerChunk = 0
			},
			wantErr: ErrInvalid,
			mention: []string{"peer must be rank 0 chunk 1 (virtual stage 2)"},
		},
		{
			name: "send to self", kind: Interleaved, p: 1, m: 1, v: 2,
			break_: func(t *testing.T, s *Schedule) {
				s.Ranks[0] = slices.Insert(s.Ranks[0], 1, Op{Kind: SendAct, MicroBatch: 0, Chunk: 0, Peer: 0, PeerChunk: 1})
			},
			wantErr: ErrInvalid,
			mention: []string{"on the same rank"},
		},
		{
			name: "micro-batch out of range", kind: GPipe, p: 1, m: 2, v: 1,
			break_: func(t *testing.T, s *Schedule) {
				s.Ranks[0][0].MicroBatch = 2
			},
			wantErr: ErrInvalid,
			mention: []string{"micro-batch 2 out of range [0,2)"},
		},
		{
			name: "unknown op kind", kind: GPipe, p: 1, m: 2, v: 1,
			break_: func(t *testing.T, s *Schedule) {
				s.Ranks[0][0].Kind = 42
			},
			wantErr: ErrInvalid,
			mention: []string{"unknown op kind"},
		},
		{
			name: "optimizer step not last", kind: OneFOneB, p: 2, m: 2, v: 1,
			break_: func(t *testing.T, s *Schedule) {
				s.Ranks[1] = slices.Insert(s.Ranks[1], 0, s.Ranks[1][len(s.Ranks[1])-1])
			},
			wantErr: ErrInvalid,
			mention: []string{"OptimizerStep must be the last op"},
		},
		{
			name: "optimizer step missing", kind: OneFOneB, p: 2, m: 2, v: 1,
			break_: func(t *testing.T, s *Schedule) {
				s.Ranks[0] = s.Ranks[0][:len(s.Ranks[0])-1]
			},
			wantErr: ErrInvalid,
			mention: []string{"rank 0: last op must be OptimizerStep"},
		},
		{
			name: "rank missing", kind: OneFOneB, p: 2, m: 2, v: 1,
			break_: func(t *testing.T, s *Schedule) {
				s.Ranks = s.Ranks[:1]
			},
			wantErr: ErrInvalid,
			mention: []string{"1 op lists for 2 stages"},
		},
		{
			name: "bad shape", kind: Interleaved, p: 2, m: 2, v: 2,
			break_: func(t *testing.T, s *Schedule) {
				s.MicroBatches = 3
			},
			wantErr: ErrBadShape,
			mention: []string{"microbatches 3, stages 2"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Build(tc.kind, tc.p, tc.m, tc.v)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Validate(); err != nil {
				t.Fatalf("unbroken schedule: %v", err)
			}
			tc.break_(t, s)
			err = s.Validate()
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Validate err = %v, want %v", err, tc.wantErr)
			}
			for _, m := range tc.mention {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
		})
	}
}

// TestValidateBufferedAcceptsCyclicWait shows the two semantics apart: the
// order that deadlocks with blocking sends runs with buffered ones.
func TestValidateBufferedAcceptsCyclicWait(t *testing.T) {
	s, err := Build(OneFOneB, 2, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	move(s, 1, find(t, s, 1, RecvAct, 1), find(t, s, 1, SendGrad, 0))
	x, err := newValidator(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.execute(true); !errors.Is(err, ErrDeadlock) {
		t.Errorf("rendezvous: err = %v, want ErrDeadlock", err)
	}
	if err := x.execute(false); err != nil {
		t.Errorf("buffered: err = %v, want nil", err)
	}
}

func TestValidateNil(t *testing.T) {
	var s *Schedule
	if err := s.Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("nil schedule: err = %v, want ErrInvalid", err)
	}
}
