package engine

import (
	"context"
	"fmt"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/gpucoord/gpucoord/collectives"
)

// Result is the outcome of an in-process run.
type Result struct {
	// Losses holds the loss of every step, in order.
	Losses []float64
	// Params is the final model, reassembled from every rank's pieces.
	Params Params
	// Ranks holds every rank by global rank, for memory and timelines.
	Ranks []*Rank
}

// RunInProc runs the job with one goroutine per rank over an in-memory
// network, calling report (if not nil) with global rank 0's step results.
// It returns once every rank has finished or one has failed.
func RunInProc(ctx context.Context, cfg *Config, report func(StepResult) error) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	_, worlds, err := collectives.NewInmemWorld(cfg.World(), collectives.DefaultConfig())
	if err != nil {
		return nil, err
	}
	res := &Result{Params: Params{}, Ranks: make([]*Rank, cfg.World())}
	var mu sync.Mutex
	g, ctx := errgroup.WithContext(ctx)
	for i, w := range worlds {
		g.Go(func() error {
			defer w.Close()
			rep := func(s StepResult) error {
				if i != 0 {
					return nil
				}
				res.Losses = append(res.Losses, s.Loss)
				if report != nil {
					return report(s)
				}
				return nil
			}
			r, err := Train(ctx, cfg, w, rep)
			if err != nil {
				return err
			}
			defer r.Close()
			res.Ranks[i] = r
			pieces, err := r.pieces(ctx)
			if err != nil {
				return fmt.Errorf("rank %d: parameters: %w", i, err)
			}
			if r.coord.DP == 0 {
				mu.Lock()
				res.Params.assemble(pieces)
				mu.Unlock()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return res, nil
}
