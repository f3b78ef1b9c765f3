package topology

// Layout is a pure rank layout: the sizes of the tensor-, pipeline- and
// data-parallel axes and their order. It maps global ranks to grid
// coordinates and forms the process groups, and needs no cluster: the
// planner places a Layout on nodes (Plan), the engine forms its
// communicators from it and the coordinator derives every rank's
// environment from it. A Layout is a value; its methods may be called
// concurrently.
type Layout struct {
	// TP, PP and DP are the sizes of the three axes.
	TP, PP, DP int
	// Order lists the axes fastest-varying first.
	Order Order

	// stride of each axis, indexed by axisIndex.
	stride [3]int
}

// NewLayout returns the layout of tp*pp*dp ranks in the given order ("" is
// DefaultOrder, Megatron-LM's tp-cp-dp-pp). Every rejection wraps ErrInvalid.
func NewLayout(tp, pp, dp int, order string) (Layout, error) {
	o, err := ParseOrder(order)
	if err != nil {
		return Layout{}, err
	}
	if tp < 1 || pp < 1 || dp < 1 {
		return Layout{}, invalid("tp %d, pp %d and dp %d must each be at least 1", tp, pp, dp)
	}
	l := Layout{TP: tp, PP: pp, DP: dp, Order: o}
	stride := 1
	for _, a := range o {
		l.stride[axisIndex(a)] = stride
		stride *= l.size(a)
	}
	return l, nil
}

// size returns the number of ranks along axis a.
func (l Layout) size(a Axis) int {
	switch a {
	case AxisTP:
		return l.TP
	case AxisPP:
		return l.PP
	}
	return l.DP
}

// World returns the number of ranks, tp*pp*dp.
func (l Layout) World() int { return l.TP * l.PP * l.DP }

// Coord returns rank r's grid coordinates.
func (l Layout) Coord(r Rank) Coord {
	n := int(r)
	return Coord{
		TP: n / l.stride[0] % l.TP,
		PP: n / l.stride[1] % l.PP,
		DP: n / l.stride[2] % l.DP,
	}
}

// Rank returns the global rank at grid coordinates c.
func (l Layout) Rank(c Coord) Rank {
	return Rank(c.TP*l.stride[0] + c.PP*l.stride[1] + c.DP*l.stride[2])
}

// Groups holds every process group of a layout, as lists of global ranks.
// Each list is ordered by the group rank (the coordinate along the axis).
type Groups struct {
	TP [][]Rank `json:"tp"`
	PP [][]Rank `json:"pp"`
	DP [][]Rank `json:"dp"`
}

// Groups returns the TP, PP and DP groups. Groups of one axis are listed in
// order of their lowest global rank, as Megatron-LM enumerates them.
func (l Layout) Groups() Groups {
	return Groups{TP: l.groups(AxisTP), PP: l.groups(AxisPP), DP: l.groups(AxisDP)}
}

// Group returns the ranks of r's group along axis a, ordered by group rank.
func (l Layout) Group(a Axis, r Rank) []Rank {
	s := l.stride[axisIndex(a)]
	base := int(r) - l.Coord(r).get(a)*s
	out := make([]Rank, l.size(a))
	for k := range out {
		out[k] = Rank(base + k*s)
	}
	return out
}

// groups enumerates the groups along axis a: one per rank whose coordinate
// on a is zero, in rank order. Those bases are runs of stride ranks, every
// stride*size ranks (as crossing visits them), and the groups share one
// array of the world's ranks, each capped at its own size.
func (l Layout) groups(a Axis) [][]Rank {
	s, n := l.stride[axisIndex(a)], l.size(a)
	all := make([]Rank, 0, l.World())
	out := make([][]Rank, 0, l.World()/n)
	for r0 := 0; r0 < l.World(); r0 += s * n {
		for base := r0; base < r0+s; base++ {
			at := len(all)
			for k := range n {
				all = append(all, Rank(base+k*s))
			}
			out = append(out, all[at:len(all):len(all)])
		}
	}
	return out
}

// CheckDomains refuses the layout when a tensor-parallel group would span
// two NVLink domains of domain consecutive ranks (ranks fill nodes, and
// domains, in order).
func (l Layout) CheckDomains(domain int) error {
	if domain > 0 && l.TP > domain {
		return tpBeyondDomain(l.TP, domain)
	}
	if r, ok := l.crossing(AxisTP, domain); ok {
		g := l.Group(AxisTP, r)
		return invalid("order %s puts tensor-parallel group %v across NVLink domains %d and %d (domain size %d): TP groups must stay inside one domain; put tp first in --order",
			l.Order, g, int(g[0])/domain, int(g[len(g)-1])/domain, domain)
	}
	return nil
}

// tpBeyondDomain refuses a TP degree larger than an NVLink domain.
func tpBeyondDomain(tp, domain int) error {
	return invalid("tp %d is larger than the NVLink domain of %s: a tensor-parallel group must stay inside one NVLink domain", tp, plural(domain, "GPU", "GPUs"))
}

// Crosses reports whether some group along axis a has members in two
// NVLink domains of domain consecutive ranks.
func (l Layout) Crosses(a Axis, domain int) bool {
	_, ok := l.crossing(a, domain)
	return ok
}

// crossing finds the first group along axis a that spans two domains and
// returns its first member. A group is base + k*stride for k < size, so it
// stays in one domain when its first and last members do; the bases are
// the ranks with coordinate 0 on a: runs of stride ranks, every
// stride*size ranks. It visits world/size ranks.
func (l Layout) crossing(a Axis, domain int) (Rank, bool) {
	s, n := l.stride[axisIndex(a)], l.size(a)
	if n == 1 {
		return 0, false
	}
	last := (n - 1) * s
	for r0 := 0; r0 < l.World(); r0 += s * n {
		for r := r0; r < r0+s; r++ {
			if r/domain != (r+last)/domain {
				return Rank(r), true
			}
		}
	}
	return 0, false
}
