package engine

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/gpucoord/gpucoord/schedule"
	"github.com/gpucoord/gpucoord/topology"
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

// referenceLoss computes the mean loss of step 0 over the global batch
// independently of the engine's matrix code: the same initial weights and
// samples (initLocal and the teacher define them), run through the residual
// MLP with plain float64 loops.
func referenceLoss(job *Job) float64 {
	m := job.Model
	full := func(ti tensorInfo) []float64 {
		buf := make([]float32, ti.rows*ti.cols)
		initLocal(ti, job.Seed, 0, 1, buf)
		out := make([]float64, len(buf))
		for i, v := range buf {
			out[i] = float64(v)
		}
		return out
	}
	act := func(z float64) float64 {
		if m.Activation == ActTanh {
			return math.Tanh(z)
		}
		return 0.5 * z * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(z+0.044715*z*z*z)))
	}
	teach := newTeacher(m, job.Seed)
	xs, labels, ys := make([]float32, m.Width), make([]int32, 1), make([]float32, m.Outputs)
	var sum float64
	for i := range job.Batch.Global {
		teach.batch(job.Seed, 0, i, 1, xs, labels, ys)
		x := make([]float64, m.Width)
		for k, v := range xs {
			x[k] = float64(v)
		}
		for b := range m.Blocks {
			ts := blockTensors(m, b)
			w1, b1, w2, b2 := full(ts[0]), full(ts[1]), full(ts[2]), full(ts[3])
			a := make([]float64, m.Hidden)
			for j := range a {
				z := b1[j]
				for k := range x {
					z += x[k] * w1[k*m.Hidden+j]
				}
				a[j] = act(z)
			}
			out := make([]float64, m.Width)
			for k := range out {
				out[k] = x[k] + b2[k]
				for j := range a {
					out[k] += a[j] * w2[j*m.Width+k]
				}
			}
			x = out
		}
		ht := headTensors(m)
		hw, hb := full(ht[0]), full(ht[1])
		logits := make([]float64, m.Outputs)
		for o := range logits {
			logits[o] = hb[o]
			for k := range x {
				logits[o] += x[k] * hw[k*m.Outputs+o]
			}
		}
		if m.Loss == LossMSE {
			for o, l := range logits {
				d := l - float64(ys[o])
				sum += 0.5 * d * d
			}
			continue
		}
		var z float64
		for _, l := range logits {
			z += math.Exp(l)
		}
		sum += math.Log(z) - logits[labels[0]]
	}
	return sum / float64(job.Batch.Global)
}

// TestFirstLoss checks the first step's loss against referenceLoss, for
// both losses and both activations, within 1e-6 relative. The engine keeps
// activations in float32 (unit roundoff 6e-8) through four blocks of sums
// of at most eight terms, a few roundoffs each (the differences seen are
// below 1e-7); a wrong weight, sample, bias or activation moves the loss
// by far more.
func TestFirstLoss(t *testing.T) {
	tests := []struct{ loss, act string }{
		{LossCrossEntropy, ActGeLU}, {LossMSE, ActGeLU}, {LossCrossEntropy, ActTanh},
	}
	for _, tc := range tests {
		t.Run(tc.loss+"-"+tc.act, func(t *testing.T) {
			job := tinyJob(tc.loss)
			job.Model.Activation = tc.act
			want := referenceLoss(job)
			got, err := newSolo(t, job, nil).Step(t.Context(), 0)
			if err != nil {
				t.Fatal(err)
			}
			if d := math.Abs(got-want) / want; !(d <= 1e-6) {
				t.Errorf("first loss %.9g, float64 reference %.9g (relative %.2g)", got, want, d)
			}
			t.Logf("first loss %.9g, reference %.9g", got, want)
		})
	}
}

// TestDivergedNamesStep: with a learning rate of 1e38 the first update
// overflows the weights, so the loss of step 2 (counting from 1, as
// StepResult does) is the first that is not finite: Train reports step 1
// only and its error names step 2.
func TestDivergedNamesStep(t *testing.T) {
	job := tinyJob(LossMSE)
	job.Optimizer.LR, job.Steps = 1e38, 3
	var reported []int
	_, err := RunInProc(t.Context(), DefaultConfig(job), func(s StepResult) error {
		if math.IsNaN(s.Loss) || math.IsInf(s.Loss, 0) {
			t.Errorf("step %d reported with loss %v", s.Step, s.Loss)
		}
		reported = append(reported, s.Step)
		return nil
	})
	if !errors.Is(err, ErrDiverged) || !strings.Contains(err.Error(), "step 2: ") {
		t.Fatalf("err = %v, want ErrDiverged naming step 2", err)
	}
	if len(reported) != 1 || reported[0] != 1 {
		t.Errorf("reported steps %v, want [1]", reported)
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
		{"unknown field", good + "epochs: 3\n", `unknown field "epochs" (known: batch, model, name, optimizer, replan, seed, steps)`},
		{"unknown model field", strings.Replace(good, "outputs: 3}", "outputs: 3, hiden: 4}", 1),
			`unknown field "hiden" in model (known: activation, blocks, hidden, loss, outputs, width)`},
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
