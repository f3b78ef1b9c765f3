package topology

import (
	"fmt"
	"strings"
)

// Axis is one dimension of the parallel grid.
type Axis string

// The axes of the grid. CP (context) and EP (expert) parallelism are accepted
// in an order string for compatibility with Megatron-LM but are always size 1.
const (
	AxisTP Axis = "tp"
	AxisCP Axis = "cp"
	AxisEP Axis = "ep"
	AxisDP Axis = "dp"
	AxisPP Axis = "pp"
)

// Order lists the grid axes fastest-varying first: in "tp-dp-pp" consecutive
// global ranks differ in their TP coordinate.
type Order []Axis

// DefaultOrder is Megatron-LM's default, "tp-cp-ep-dp-pp" with cp = ep = 1:
// global rank = tp + TP*dp + TP*DP*pp.
const DefaultOrder = "tp-cp-dp-pp"

// orderAliases maps other tools' conventions onto ours. DeepSpeed's
// PipeModelDataParallelTopology lists axes slowest first, row-major, as
// ['pipe', 'data', 'model']: model (TP) fastest, then data, then pipe.
var orderAliases = map[string]string{
	"pipe-data-model": "tp-dp-pp",
	"megatron":        DefaultOrder,
	"deepspeed":       "tp-dp-pp",
}

// ParseOrder parses an order string such as "tp-cp-dp-pp" (fastest first),
// or an alias ("pipe-data-model" for DeepSpeed, "megatron").
func ParseOrder(s string) (Order, error) {
	if s == "" {
		s = DefaultOrder
	}
	spec := s
	if a, ok := orderAliases[s]; ok {
		spec = a
	}
	var o Order
	seen := map[Axis]bool{}
	for _, part := range strings.Split(spec, "-") {
		ax := Axis(part)
		switch ax {
		case AxisTP, AxisDP, AxisPP:
			if seen[ax] {
				return nil, invalid("order %q: axis %s appears twice", s, ax)
			}
			seen[ax] = true
			o = append(o, ax)
		case AxisCP, AxisEP:
			if seen[ax] {
				return nil, invalid("order %q: axis %s appears twice", s, ax)
			}
			seen[ax] = true // size 1: no effect on the layout
		default:
			return nil, invalid("order %q: unknown axis %q (use tp, cp, ep, dp, pp joined by '-', fastest first, or pipe-data-model)", s, part)
		}
	}
	if len(o) != 3 {
		return nil, invalid("order %q: must name each of tp, dp and pp once", s)
	}
	return o, nil
}

// String returns the order in our fastest-first form.
func (o Order) String() string {
	parts := make([]string, len(o))
	for i, a := range o {
		parts[i] = string(a)
	}
	return strings.Join(parts, "-")
}

// get returns c's coordinate on axis a.
func (c Coord) get(a Axis) int {
	switch a {
	case AxisTP:
		return c.TP
	case AxisPP:
		return c.PP
	case AxisDP:
		return c.DP
	}
	panic(fmt.Sprintf("topology: no coordinate for axis %q", a))
}
