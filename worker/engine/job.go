package engine

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// Activation functions a block may use.
const (
	ActGeLU = "gelu" // tanh approximation of GeLU (Hendrycks & Gimpel 2016)
	ActTanh = "tanh"
)

// Loss functions the head may use.
const (
	LossCrossEntropy = "cross_entropy" // softmax cross-entropy over synthetic labels
	LossMSE          = "mse"           // 1/2 squared error against a teacher's outputs
)

// Job is a native-engine training job as read from its YAML file. The
// parallel layout is not part of it: the same job runs on any layout.
type Job struct {
	// Name labels the job in logs.
	Name string `yaml:"name"`
	// Model is the network.
	Model ModelSpec `yaml:"model"`
	// Batch sizes the global and micro-batches.
	Batch BatchSpec `yaml:"batch"`
	// Optimizer configures Adam.
	Optimizer AdamSpec `yaml:"optimizer"`
	// Steps is the number of optimizer steps.
	Steps int `yaml:"steps"`
	// Seed fixes the initial weights, the teacher and the data.
	Seed uint64 `yaml:"seed"`
	// Replan is how gpucoord launch re-plans the job when its nodes
	// change (launch's --replan flags override it); the engine does not
	// read it.
	Replan *ReplanSpec `yaml:"replan,omitempty"`
}

// ReplanSpec is a job file's replan section: launch's --replan,
// --plan-model, --plan-cluster, --replan-gain and --min-samples-per-second.
type ReplanSpec struct {
	Mode                string  `yaml:"mode,omitempty"`
	Model               string  `yaml:"model,omitempty"`
	Cluster             string  `yaml:"cluster,omitempty"`
	Gain                float64 `yaml:"gain,omitempty"`
	MinSamplesPerSecond float64 `yaml:"min_samples_per_second,omitempty"`
}

// ModelSpec is a residual MLP: Blocks blocks of
// x + W2·act(W1·x + b1) + b2 (W1 is Width x Hidden, W2 Hidden x Width), then
// a linear head Width -> Outputs and the loss.
type ModelSpec struct {
	// Width is the input and residual-stream width.
	Width int `yaml:"width"`
	// Hidden is the inner width of each block; tensor parallelism splits it.
	Hidden int `yaml:"hidden"`
	// Blocks is the number of residual blocks; pipeline parallelism splits them.
	Blocks int `yaml:"blocks"`
	// Outputs is the head's width: classes for cross-entropy, targets for MSE.
	Outputs int `yaml:"outputs"`
	// Activation is "gelu" (default) or "tanh".
	Activation string `yaml:"activation"`
	// Loss is "cross_entropy" (default) or "mse".
	Loss string `yaml:"loss"`
}

// BatchSpec sizes a step's batch.
type BatchSpec struct {
	// Global is the number of samples per optimizer step over all replicas.
	Global int `yaml:"global"`
	// Micro is the number of samples per micro-batch.
	Micro int `yaml:"micro"`
}

// AdamSpec configures Adam (Kingma & Ba 2015) with bias correction.
type AdamSpec struct {
	// LR is the learning rate.
	LR float64 `yaml:"lr"`
	// Beta1 is the first-moment decay; 0 means 0.9.
	Beta1 float64 `yaml:"beta1"`
	// Beta2 is the second-moment decay; 0 means 0.999.
	Beta2 float64 `yaml:"beta2"`
	// Eps is added to the root of the second moment; 0 means 1e-8.
	Eps float64 `yaml:"eps"`
}

// unknownField is yaml.v3's line for a field a struct lacks.
var unknownField = regexp.MustCompile(`line (\d+): field (\S+) not found in type engine\.(\w+)`)

// yamlMessage rewrites yaml.v3's decoding error in the file's terms: an
// unknown field is named with the section it is in and the fields that
// section knows, not a Go type.
func yamlMessage(err error) string {
	msg := err.Error()
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return msg
	}
	var lines []string
	for _, e := range te.Errors {
		m := unknownField.FindStringSubmatch(e)
		if m == nil {
			lines = append(lines, e)
			continue
		}
		section, known := jobSection(m[3])
		where := ""
		if section != "" {
			where = " in " + section
		}
		lines = append(lines, fmt.Sprintf("line %s: unknown field %q%s (known: %s)", m[1], m[2], where, strings.Join(known, ", ")))
	}
	return strings.Join(lines, "; ")
}

// jobSection finds the Job field whose type is named typ: its YAML name
// ("" for Job itself) and the YAML names of its fields, sorted.
func jobSection(typ string) (string, []string) {
	names := func(t reflect.Type) []string {
		var out []string
		for i := range t.NumField() {
			if n, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); n != "" && n != "-" {
				out = append(out, n)
			}
		}
		slices.Sort(out)
		return out
	}
	jt := reflect.TypeOf(Job{})
	for i := range jt.NumField() {
		f := jt.Field(i)
		if f.Type.Kind() == reflect.Struct && f.Type.Name() == typ {
			n, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			return n, names(f.Type)
		}
	}
	return "", names(jt)
}

// ParseJob decodes a job from YAML, rejecting unknown fields, fills
// defaults, applies edit (command-line overrides; nil for none) and
// validates the result, so an override can complete a file that lacks a
// field.
func ParseJob(r io.Reader, edit func(*Job)) (*Job, error) {
	dec := yaml.NewDecoder(r)
	dec.KnownFields(true)
	var j Job
	if err := dec.Decode(&j); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: empty job file", ErrInvalidJob)
		}
		return nil, fmt.Errorf("%w: %s", ErrInvalidJob, yamlMessage(err))
	}
	j.fillDefaults()
	if edit != nil {
		edit(&j)
	}
	if err := j.Validate(); err != nil {
		return nil, err
	}
	return &j, nil
}

// LoadJob reads and parses a job file; edit is as for ParseJob.
func LoadJob(path string, edit func(*Job)) (*Job, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // "no such file or directory", the path said once
		}
		return nil, invalidJob(fmt.Sprintf("job file %s: %v", path, err))
	}
	j, err := ParseJob(bytes.NewReader(b), edit)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return j, nil
}

func (j *Job) fillDefaults() {
	if j.Model.Activation == "" {
		j.Model.Activation = ActGeLU
	}
	if j.Model.Loss == "" {
		j.Model.Loss = LossCrossEntropy
	}
	if j.Optimizer.Beta1 == 0 {
		j.Optimizer.Beta1 = 0.9
	}
	if j.Optimizer.Beta2 == 0 {
		j.Optimizer.Beta2 = 0.999
	}
	if j.Optimizer.Eps == 0 {
		j.Optimizer.Eps = 1e-8
	}
}

// Validate names the first field that cannot work.
func (j *Job) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidJob, fmt.Sprintf(format, a...))
	}
	m := j.Model
	switch {
	case m.Width < 1:
		return bad("model.width %d must be at least 1", m.Width)
	case m.Hidden < 1:
		return bad("model.hidden %d must be at least 1", m.Hidden)
	case m.Blocks < 1:
		return bad("model.blocks %d must be at least 1", m.Blocks)
	case m.Outputs < 1:
		return bad("model.outputs %d must be at least 1", m.Outputs)
	case m.Activation != ActGeLU && m.Activation != ActTanh:
		return bad("model.activation %q: want %q or %q", m.Activation, ActGeLU, ActTanh)
	case m.Loss != LossCrossEntropy && m.Loss != LossMSE:
		return bad("model.loss %q: want %q or %q", m.Loss, LossCrossEntropy, LossMSE)
	case m.Loss == LossCrossEntropy && m.Outputs < 2:
		return bad("model.outputs %d: cross-entropy needs at least 2 classes", m.Outputs)
	case j.Batch.Micro < 1:
		return bad("batch.micro %d must be at least 1", j.Batch.Micro)
	case j.Batch.Global < j.Batch.Micro || j.Batch.Global%j.Batch.Micro != 0:
		return bad("batch.global %d must be a positive multiple of batch.micro %d", j.Batch.Global, j.Batch.Micro)
	case !(j.Optimizer.LR > 0):
		return bad("optimizer.lr %g must be positive", j.Optimizer.LR)
	case !(j.Optimizer.Beta1 >= 0 && j.Optimizer.Beta1 < 1):
		return bad("optimizer.beta1 %g must be in [0, 1)", j.Optimizer.Beta1)
	case !(j.Optimizer.Beta2 >= 0 && j.Optimizer.Beta2 < 1):
		return bad("optimizer.beta2 %g must be in [0, 1)", j.Optimizer.Beta2)
	case !(j.Optimizer.Eps > 0):
		return bad("optimizer.eps %g must be positive", j.Optimizer.Eps)
	case j.Steps < 1:
		return bad("steps %d must be at least 1", j.Steps)
	}
	return nil
}

// Params returns the number of trainable parameters of the whole model.
func (m ModelSpec) Params() int {
	block := m.Width*m.Hidden + m.Hidden + m.Hidden*m.Width + m.Width
	return m.Blocks*block + m.Width*m.Outputs + m.Outputs
}
