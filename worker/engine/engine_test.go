package engine

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"gpucoord/schedule"
	"gpucoord/topology"
)

// tinyJob is a model small enough for finite differences and the layout
// matrix: 4 blocks so pp*virtual up to 4 divides it, hidden 8 so tp 2 and 4
// divide it.
func tinyJob(loss string) *Job {
	j := &Job{
		Name:      "tiny",
		Model:     ModelSpec{Width: 6, Hidden: 8, Blocks: 4, Outputs: 3, Activation: ActGeLU, Loss: loss},
		Batch:     BatchSpec{Global: 16, Micro: 2},
		Optimizer: AdamSpec{LR: 1e-2},
		Steps:     20,
		Seed:      7,
	}
	j.fillDefaults()
	return j
}

func newSolo(t *testing.T, job *Job, mut func(*Config)) *Rank {
	t.Helper()
	cfg := DefaultConfig(job)
	if mut != nil {
		mut(cfg)
	}
	r, err := NewRank(cfg, topology.Coord{}, Groups{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// lossAndGrads runs every op but the optimizer step and returns the mean loss
// and the accumulated gradients (a copy), then clears them.
func lossAndGrads(t *testing.T, r *Rank) (float64, [][]float32) {
	t.Helper()
	r.loss = 0
	for _, o := range r.ops {
		if o.Kind == schedule.OptimizerStep {
			continue
		}
		if err := r.exec(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	var grads [][]float32
	for _, cs := range r.chunks {
		grads = append(grads, append([]float32(nil), cs.grads...))
		clear(cs.grads)
	}
	return r.loss / float64(r.cfg.Job.Batch.Global), grads
}

// TestGradientCheck compares every analytic gradient element with a central
// finite difference of the loss, for both losses and both activations.
func TestGradientCheck(t *testing.T) {
	tests := []struct {
		name, loss, act string
	}{
		{"cross-entropy gelu", LossCrossEntropy, ActGeLU},
		{"mse gelu", LossMSE, ActGeLU},
		{"cross-entropy tanh", LossCrossEntropy, ActTanh},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			job := tinyJob(tc.loss)
			job.Model.Activation = tc.act
			job.Model.Blocks = 2
			job.Batch = BatchSpec{Global: 4, Micro: 2}
			r := newSolo(t, job, nil)
			_, grads := lossAndGrads(t, r)
			const h = 1e-2
			checked := 0
			for ci, cs := range r.chunks {
				for i := range cs.n {
					orig := cs.params[i]
					cs.params[i] = orig + h
					lp, _ := lossAndGrads(t, r)
					cs.params[i] = orig - h
					lm, _ := lossAndGrads(t, r)
					cs.params[i] = orig
					num := (lp - lm) / (2 * h)
					got := float64(grads[ci][i])
					if math.Abs(num-got) > 1e-4+1e-3*math.Abs(num) {
						t.Errorf("chunk %d element %d: analytic %.6g, finite difference %.6g", ci, i, got, num)
					}
					checked++
				}
			}
			if want := job.Model.Params(); checked != want {
				t.Fatalf("checked %d elements, model has %d", checked, want)
			}
		})
	}
}

// TestTrainingLearns checks that 60 Adam steps cut the loss of both tasks
// well below its starting value.
func TestTrainingLearns(t *testing.T) {
	for _, loss := range []string{LossCrossEntropy, LossMSE} {
		t.Run(loss, func(t *testing.T) {
			job := tinyJob(loss)
			r := newSolo(t, job, nil)
			var first, last float64
			for s := range 60 {
				l, err := r.Step(t.Context(), s)
				if err != nil {
					t.Fatal(err)
				}
				if s == 0 {
					first = l
				}
				last = l
			}
			if !(last < 0.6*first) {
				t.Errorf("loss went from %.4f to %.4f, want below 60%% of the start", first, last)
			}
		})
	}
}

// TestFirstLossIsChance checks the first step's loss against a hand value:
// with 3 classes and a near-uniform initial head, cross-entropy is close to
// ln 3.
func TestFirstLossIsChance(t *testing.T) {
	job := tinyJob(LossCrossEntropy)
	r := newSolo(t, job, nil)
	l, err := r.Step(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(l-math.Log(3)) > 0.5 {
		t.Errorf("first loss %.4f, want near ln 3 = %.4f", l, math.Log(3))
	}
}

func TestParseJob(t *testing.T) {
	const good = `
name: t
model: {width: 4, hidden: 8, blocks: 2, outputs: 3}
batch: {global: 8, micro: 2}
optimizer: {lr: 0.001}
steps: 5
seed: 3
`
	tests := []struct {
		name    string
		yaml    string
		wantErr string
	}{
		{"good", good, ""},
		{"unknown field", good + "epochs: 3\n", "field epochs not found"},
		{"bad activation", strings.Replace(good, "outputs: 3}", "outputs: 3, activation: relu6}", 1), "model.activation"},
		{"global not multiple", strings.Replace(good, "global: 8", "global: 7", 1), "batch.global 7"},
		{"no lr", strings.Replace(good, "lr: 0.001", "lr: 0", 1), "optimizer.lr"},
		{"no steps", strings.Replace(good, "steps: 5", "steps: 0", 1), "steps 0"},
		{"one class", strings.Replace(good, "outputs: 3", "outputs: 1", 1), "at least 2 classes"},
		{"empty", "", "empty job file"},
		{"not yaml", "model: [", "invalid job"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			j, err := ParseJob(strings.NewReader(tc.yaml), nil)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if j.Optimizer.Beta1 != 0.9 || j.Model.Loss != LossCrossEntropy {
					t.Errorf("defaults not filled: %+v", j)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrInvalidJob) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("err = %v, want ErrInvalidJob mentioning %q", err, tc.wantErr)
			}
		})
	}
}

var _ = context.Background
