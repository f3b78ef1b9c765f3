package topology

import (
	"fmt"
	"os"
	"strings"
)

// Model describes a GPT-style decoder-only transformer, or, when only Params
// is set, a bare parameter count for model-state-only estimates.
type Model struct {
	// Name labels the model in output.
	Name string `yaml:"name" json:"name"`
	// Layers is the number of transformer layers (l).
	Layers int `yaml:"layers" json:"layers"`
	// Hidden is the hidden size (h).
	Hidden int `yaml:"hidden" json:"hidden"`
	// Heads is the number of attention heads (a).
	Heads int `yaml:"heads" json:"heads"`
	// KVHeads is the number of key/value heads (grouped-query attention);
	// zero means Heads (multi-head attention).
	KVHeads int `yaml:"kv_heads" json:"kv_heads,omitempty"`
	// FFN is the MLP inner size; zero means 4*Hidden.
	FFN int `yaml:"ffn" json:"ffn"`
	// GatedMLP selects a gated MLP (SwiGLU: three matrices) as in Llama.
	GatedMLP bool `yaml:"gated_mlp" json:"gated_mlp,omitempty"`
	// Vocab is the vocabulary size (V).
	Vocab int `yaml:"vocab" json:"vocab"`
	// Seq is the sequence length (s).
	Seq int `yaml:"seq" json:"seq"`
	// LearnedPositions adds a learned position embedding of Seq x Hidden (GPT);
	// false means rotary embeddings without parameters (Llama).
	LearnedPositions bool `yaml:"learned_positions" json:"learned_positions,omitempty"`
	// UntiedEmbeddings gives the output layer its own Vocab x Hidden matrix.
	UntiedEmbeddings bool `yaml:"untied_embeddings" json:"untied_embeddings,omitempty"`
	// Params is a bare parameter count. When set and Layers is zero the
	// model has no architecture: only model states are estimated.
	Params float64 `yaml:"params" json:"params,omitempty"`
}

// Bare reports whether the model is only a parameter count.
func (m Model) Bare() bool { return m.Layers == 0 }

// FFNSize returns the MLP inner size, resolving the default.
func (m Model) FFNSize() int {
	if m.FFN == 0 {
		return 4 * m.Hidden
	}
	return m.FFN
}

// KVHeadCount returns the number of key/value heads, resolving the default.
func (m Model) KVHeadCount() int {
	if m.KVHeads == 0 {
		return m.Heads
	}
	return m.KVHeads
}

// KVDim returns the width of the key (or value) projection.
func (m Model) KVDim() int { return m.KVHeadCount() * (m.Hidden / m.Heads) }

// LayerParams returns the parameters of one transformer layer: QKV and
// output projections with biases, the MLP with biases and two layer norms.
// For GPT (ffn = 4h, kv = h) it is 12h^2 + 13h, as in Narayanan et al. 2021.
func (m Model) LayerParams() float64 {
	h, f, kv := float64(m.Hidden), float64(m.FFNSize()), float64(m.KVDim())
	attn := h*(h+2*kv) + (h + 2*kv) + h*h + h
	mats := 2.0
	if m.GatedMLP {
		mats = 3
	}
	mlp := mats*h*f + (mats-1)*f + h
	return attn + mlp + 4*h
}

// EmbeddingParams returns the input embedding (and learned positions).
func (m Model) EmbeddingParams() float64 {
	p := float64(m.Vocab) * float64(m.Hidden)
	if m.LearnedPositions {
		p += float64(m.Seq) * float64(m.Hidden)
	}
	return p
}

// OutputParams returns the final layer norm and, when untied, the output
// projection.
func (m Model) OutputParams() float64 {
	p := 2 * float64(m.Hidden)
	if m.UntiedEmbeddings {
		p += float64(m.Vocab) * float64(m.Hidden)
	}
	return p
}

// TotalParams returns the model's parameter count (tied embeddings counted once).
func (m Model) TotalParams() float64 {
	if m.Bare() {
		return m.Params
	}
	return float64(m.Layers)*m.LayerParams() + m.EmbeddingParams() + m.OutputParams()
}

// MaxParams is the largest bare parameter count a plan accepts: far above
// any model trained (about 2e12 in 2026), far below where the byte counts
// stop meaning anything.
const MaxParams = 1e15

// CheckParams refuses a bare parameter count that is not a number between 1
// and MaxParams.
func CheckParams(p float64) error {
	if !(p >= 1 && p <= MaxParams) { // NaN fails every comparison
		return invalid("model params %g: want a parameter count between 1 and %g", p, MaxParams)
	}
	return nil
}

// Validate names the first field that cannot work.
func (m Model) Validate() error {
	if m.Bare() {
		if m.Params == 0 {
			return invalid("model: give --params or an architecture (--layers, --hidden, --heads, --vocab, --seq)")
		}
		if err := CheckParams(m.Params); err != nil {
			return err
		}
		if m.Hidden != 0 || m.Heads != 0 {
			return invalid("model layers 0: an architecture needs --layers as well as --hidden and --heads")
		}
		return nil
	}
	switch {
	case m.Layers < 1:
		return invalid("model layers %d: must be at least 1", m.Layers)
	case m.Hidden < 1:
		return invalid("model hidden %d: must be at least 1", m.Hidden)
	case m.Heads < 1:
		return invalid("model heads %d: must be at least 1", m.Heads)
	case m.Hidden%m.Heads != 0:
		return invalid("model hidden %d: must be divisible by heads %d", m.Hidden, m.Heads)
	case m.KVHeads < 0 || m.KVHeads > m.Heads || (m.KVHeads > 0 && m.Heads%m.KVHeads != 0):
		return invalid("model kv_heads %d: must divide heads %d", m.KVHeads, m.Heads)
	case m.FFN < 0:
		return invalid("model ffn %d: must be positive", m.FFN)
	case m.Vocab < 1:
		return invalid("model vocab %d: must be at least 1", m.Vocab)
	case m.Seq < 1:
		return invalid("model seq %d: must be at least 1", m.Seq)
	case m.Params != 0:
		return invalid("model params %g: give either a parameter count or an architecture, not both", m.Params)
	}
	return nil
}

// gpt builds a Narayanan et al. 2021 Table 1 style model: ffn 4h, vocab
// 51200, sequence 2048, learned positions, tied embeddings.
func gpt(name string, heads, hidden, layers int) Model {
	return Model{Name: name, Layers: layers, Hidden: hidden, Heads: heads, Vocab: 51200, Seq: 2048, LearnedPositions: true}
}

// modelPresets are the built-in models. The gpt-* rows from 1.7b to 1t are
// Table 1 of Narayanan et al. 2021 ("Efficient Large-Scale Language Model
// Training on GPU Clusters Using Megatron-LM"); gpt-13b and gpt-175b are
// GPT-3 (Brown et al. 2020, Table 2.1); llama-* are Llama 2 (Touvron et al. 2023).
var modelPresets = map[string]Model{
	"gpt-1.7b":  gpt("gpt-1.7b", 24, 2304, 24),
	"gpt-3.6b":  gpt("gpt-3.6b", 32, 3072, 30),
	"gpt-7.5b":  gpt("gpt-7.5b", 32, 4096, 36),
	"gpt-13b":   gpt("gpt-13b", 40, 5120, 40),
	"gpt-18b":   gpt("gpt-18b", 48, 6144, 40),
	"gpt-39b":   gpt("gpt-39b", 64, 8192, 48),
	"gpt-76b":   gpt("gpt-76b", 80, 10240, 60),
	"gpt-145b":  gpt("gpt-145b", 96, 12288, 80),
	"gpt-175b":  gpt("gpt-175b", 96, 12288, 96),
	"gpt-310b":  gpt("gpt-310b", 128, 16384, 96),
	"gpt-530b":  gpt("gpt-530b", 128, 20480, 105),
	"gpt-1t":    gpt("gpt-1t", 160, 25600, 128),
	"llama-7b":  {Name: "llama-7b", Layers: 32, Hidden: 4096, Heads: 32, FFN: 11008, GatedMLP: true, Vocab: 32000, Seq: 4096, UntiedEmbeddings: true},
	"llama-70b": {Name: "llama-70b", Layers: 80, Hidden: 8192, Heads: 64, KVHeads: 8, FFN: 28672, GatedMLP: true, Vocab: 32000, Seq: 4096, UntiedEmbeddings: true},
}

// ModelPresets returns the names of the built-in models, sorted.
func ModelPresets() []string { return sortedKeys(modelPresets) }

// ModelPreset returns a built-in model by name.
func ModelPreset(name string) (Model, error) {
	m, ok := modelPresets[name]
	if !ok {
		return Model{}, fmt.Errorf("model %q: %w (known: %s)", name, ErrUnknownPreset, strings.Join(ModelPresets(), ", "))
	}
	return m, nil
}

// ParseModel decodes a YAML model spec; `preset:` names a base to override.
// Unknown fields are an error.
func ParseModel(data []byte) (Model, error) {
	m, err := parseWithPreset(data, "model", ModelPreset)
	if err != nil {
		return Model{}, err
	}
	if err := m.Validate(); err != nil {
		return Model{}, err
	}
	return m, nil
}

// LoadModel resolves a --model argument: a preset name, or a YAML file.
func LoadModel(nameOrPath string) (Model, error) {
	if m, ok := modelPresets[nameOrPath]; ok {
		return m, nil
	}
	data, err := os.ReadFile(nameOrPath)
	if err != nil {
		if os.IsNotExist(err) && !strings.ContainsAny(nameOrPath, "/") {
			return ModelPreset(nameOrPath)
		}
		return Model{}, invalid("model %q: %v", nameOrPath, err)
	}
	m, err := ParseModel(data)
	if err != nil {
		return Model{}, fmt.Errorf("%s: %w", nameOrPath, err)
	}
	return m, nil
}
