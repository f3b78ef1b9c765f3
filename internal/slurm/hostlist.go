package slurm

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// MaxHosts is the most names ExpandHostlist returns for one expression.
// Slurm refuses a single bracket range of more than 64Ki hosts; the bound
// here covers the whole expression, so that a typo such as "n[1-1000000]"
// or "a[1-999]b[1-999]" fails at once instead of allocating its names.
const MaxHosts = 1 << 16

// MaxNameLen is the longest name, in bytes, that ExpandHostlist produces:
// no host name, fully qualified or not, is longer.
const MaxNameLen = 255

// ErrBadHostlist is wrapped by every error ExpandHostlist returns. The
// message names the expression and what is wrong with it.
var ErrBadHostlist = errors.New("slurm: bad host list")

// ExpandHostlist returns the host names a Slurm host-list expression stands
// for, in the order `scontrol show hostnames` prints them.
//
// The expression is a comma-separated list of items; commas inside
// brackets belong to the bracket. An item is literal text and bracket
// groups such as "[1-3,7]", each a comma-separated list of numbers and
// ranges lo-hi. A number is printed zero-padded to the width of the range's
// lower bound as written: "n[01-03]" is n01 n02 n03, "n[8-11]" is n8 n9 n10
// n11 and "n[098-101]" is n098 n099 n100 n101. An item with several groups
// stands for their cartesian product, the first group varying slowest:
// "rack[01-02]-gpu[1-2]" is rack01-gpu1 rack01-gpu2 rack02-gpu1
// rack02-gpu2. Names are kept in order, duplicates included.
//
// It returns an error wrapping ErrBadHostlist, and never panics, for an
// empty expression or item, whitespace, an unbalanced, nested or empty
// bracket, an empty range, a bound that is not a decimal number, a range
// whose lower bound is above its upper one, a step such as "1-5:2" (Slurm
// takes none in host lists), more than MaxHosts names in all, or a name
// longer than MaxNameLen bytes.
//
// It is stricter than Slurm where Slurm's leniency hides a typo: Slurm
// also splits at spaces and tabs, skips empty items, and reads "n[1-]" as
// n1. It accepts text after an item's last bracket group ("h[1-2]x" is h1x
// h2x), which Slurm's own parser refuses; Slurm never writes such a list.
func ExpandHostlist(expr string) ([]string, error) {
	names, err := expand(expr)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %v", ErrBadHostlist, expr, err)
	}
	return names, nil
}

// expand does ExpandHostlist's work; its errors say what is wrong but not
// in which expression.
func expand(expr string) ([]string, error) {
	if expr == "" {
		return nil, errors.New("empty expression")
	}
	items, err := splitItems(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, it := range items {
		p, err := parseItem(it.text, it.at)
		if err != nil {
			return nil, err
		}
		names, err = p.appendNames(names)
		if err != nil {
			return nil, err
		}
	}
	return names, nil
}

// item is one top-level item of an expression and the byte offset where it
// starts, for error messages.
type item struct {
	text string
	at   int
}

// splitItems splits expr at the commas outside brackets, checking on the
// way that brackets are balanced and not nested and that there is no
// whitespace.
func splitItems(expr string) ([]item, error) {
	var items []item
	start, open := 0, -1 // open: the offset of the unclosed '[', or -1
	for i := 0; i < len(expr); i++ {
		switch c := expr[i]; {
		case c == '[':
			if open >= 0 {
				return nil, fmt.Errorf("'[' at byte %d is inside the bracket opened at byte %d (brackets do not nest)", i, open)
			}
			open = i
		case c == ']':
			if open < 0 {
				return nil, fmt.Errorf("']' at byte %d closes no '['", i)
			}
			open = -1
		case c == ',' && open < 0:
			items = append(items, item{expr[start:i], start})
			start = i + 1
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f':
			return nil, fmt.Errorf("whitespace at byte %d", i)
		}
	}
	if open >= 0 {
		return nil, fmt.Errorf("'[' at byte %d is never closed", open)
	}
	items = append(items, item{expr[start:], start})
	for _, it := range items {
		if it.text == "" {
			return nil, fmt.Errorf("empty item at byte %d", it.at)
		}
	}
	return items, nil
}

// numRange is one range of a bracket group: lo through hi, each printed
// zero-padded to width digits.
type numRange struct {
	lo, hi uint64
	width  int
}

// pattern is a parsed item: lits[0] groups[0] lits[1] … groups[n-1]
// lits[n].
type pattern struct {
	lits   []string
	groups []group
}

// parseItem parses one item (balanced, unnested brackets, no top-level
// comma) that starts at byte at of the expression.
func parseItem(s string, at int) (pattern, error) {
	var p pattern
	for {
		i := strings.IndexByte(s, '[')
		if i < 0 {
			p.lits = append(p.lits, s)
			return p, nil
		}
		j := strings.IndexByte(s[i:], ']') + i // splitItems saw it closed
		p.lits = append(p.lits, s[:i])
		g, err := parseGroup(s[i+1:j], at+i)
		if err != nil {
			return pattern{}, err
		}
		p.groups = append(p.groups, g)
		s, at = s[j+1:], at+j+1
	}
}

// parseGroup parses the inside of a bracket group opened at byte at.
func parseGroup(body string, at int) (group, error) {
	if body == "" {
		return nil, fmt.Errorf("empty brackets at byte %d", at)
	}
	var g group
	for r := range strings.SplitSeq(body, ",") {
		if r == "" {
			return nil, fmt.Errorf("empty range in the brackets at byte %d", at)
		}
		nr, err := parseRange(r)
		if err != nil {
			return nil, err
		}
		g = append(g, nr)
	}
	return g, nil
}

// parseRange parses "lo-hi" or a single number.
func parseRange(s string) (numRange, error) {
	if strings.Contains(s, ":") {
		return numRange{}, fmt.Errorf("range %q has a step, which Slurm host lists do not take", s)
	}
	lo, hi, isRange := strings.Cut(s, "-")
	if !isRange {
		hi = lo
	}
	if strings.Contains(hi, "-") {
		return numRange{}, fmt.Errorf("range %q has more than one '-'", s)
	}
	l, err := parseBound(lo, s)
	if err != nil {
		return numRange{}, err
	}
	h, err := parseBound(hi, s)
	if err != nil {
		return numRange{}, err
	}
	if l > h {
		return numRange{}, fmt.Errorf("range %q runs backwards (%d > %d)", s, l, h)
	}
	return numRange{lo: l, hi: h, width: len(lo)}, nil
}

// parseBound parses one bound of range r: decimal digits only, no sign.
func parseBound(b, r string) (uint64, error) {
	if b == "" {
		return 0, fmt.Errorf("range %q lacks a bound", r)
	}
	for i := 0; i < len(b); i++ {
		if b[i] < '0' || b[i] > '9' {
			return 0, fmt.Errorf("bound %q of range %q is not a decimal number", b, r)
		}
	}
	n, err := strconv.ParseUint(b, 10, 64)
	if err != nil { // only overflow gets here
		return 0, fmt.Errorf("bound %q of range %q is too large", b, r)
	}
	return n, nil
}

// group is a parsed bracket group: its ranges in order.
type group []numRange

// count is how many numbers g stands for, or MaxHosts+1 when it is more
// than MaxHosts.
func (g group) count() uint64 {
	var n uint64
	for _, r := range g {
		if r.hi-r.lo >= MaxHosts {
			return MaxHosts + 1
		}
		n += r.hi - r.lo + 1
		if n > MaxHosts {
			return MaxHosts + 1
		}
	}
	return n
}

// numbers returns the numbers of g as printed, in order.
func (g group) numbers() []string {
	var out []string
	for _, r := range g {
		for v := r.lo; ; v++ {
			s := strconv.FormatUint(v, 10)
			if len(s) < r.width {
				s = strings.Repeat("0", r.width-len(s)) + s
			}
			out = append(out, s)
			if v == r.hi { // not v <= r.hi in the loop: hi may be the largest uint64
				break
			}
		}
	}
	return out
}

// maxWidth is the most digits a number of g is printed with.
func (g group) maxWidth() int {
	w := 0
	for _, r := range g {
		w = max(w, r.width, len(strconv.FormatUint(r.hi, 10)))
	}
	return w
}

// appendNames appends the names p stands for to names: the cartesian
// product of its groups, the last group varying fastest. It fails, having
// appended nothing, when that would take names past MaxHosts or make a
// name longer than MaxNameLen.
func (p pattern) appendNames(names []string) ([]string, error) {
	total, longest := uint64(1), 0
	for _, l := range p.lits {
		longest += len(l)
	}
	for _, g := range p.groups {
		total *= g.count() // each factor is at most MaxHosts+1 and total stays at most MaxHosts: no overflow
		if uint64(len(names))+total > MaxHosts {
			return nil, fmt.Errorf("expands to more than %d names", MaxHosts)
		}
		longest += g.maxWidth()
	}
	if uint64(len(names))+total > MaxHosts {
		return nil, fmt.Errorf("expands to more than %d names", MaxHosts)
	}
	if longest > MaxNameLen {
		return nil, fmt.Errorf("a name would be %d bytes long, over the limit of %d", longest, MaxNameLen)
	}
	nums := make([][]string, len(p.groups))
	for i, g := range p.groups {
		nums[i] = g.numbers()
	}
	names = slices.Grow(names, int(total))
	idx := make([]int, len(p.groups))
	var b strings.Builder
	for {
		b.Reset()
		b.WriteString(p.lits[0])
		for i := range nums {
			b.WriteString(nums[i][idx[i]])
			b.WriteString(p.lits[i+1])
		}
		names = append(names, b.String())
		i := len(idx) - 1
		for ; i >= 0; i-- { // advance the odometer, last group fastest
			if idx[i]++; idx[i] < len(nums[i]) {
				break
			}
			idx[i] = 0
		}
		if i < 0 {
			return names, nil
		}
	}
}
