package engine

// MemKind is a category of engine memory.
type MemKind int

// Memory categories, as the planner splits per-GPU memory.
const (
	MemParams      MemKind = iota // parameters held (ZeRO-3: the owned shard plus the gathered chunk in use)
	MemGrads                      // gradient buffers (full, transient, or the owned shard)
	MemOptimizer                  // Adam first and second moments
	MemActivations                // stashed activations and in-flight send/receive buffers
	numMemKinds
)

// String names the category.
func (k MemKind) String() string {
	return [...]string{"params", "grads", "optimizer", "activations"}[k]
}

// Memory is the byte accounting of one rank: every float32 buffer the engine
// allocates for the model is counted when it is made and uncounted when it
// is dropped. Scratch of the matrix multiply and Go runtime overhead are not
// included.
type Memory struct {
	// Peak is each category's own peak, in bytes.
	Peak [numMemKinds]int64
	// PeakTotal is the peak of the sum of all categories, in bytes.
	PeakTotal int64
	cur       [numMemKinds]int64
}

func (m *Memory) add(k MemKind, floats int) {
	m.cur[k] += 4 * int64(floats)
	m.Peak[k] = max(m.Peak[k], m.cur[k])
	var t int64
	for _, v := range m.cur {
		t += v
	}
	m.PeakTotal = max(m.PeakTotal, t)
}

func (m *Memory) addBytes(k MemKind, b int64) { m.add(k, int(b/4)) }

// resetPeaks starts a new peak window at the current usage.
func (m *Memory) resetPeaks() {
	var t int64
	for k, v := range m.cur {
		m.Peak[k] = v
		t += v
	}
	m.PeakTotal = t
}
