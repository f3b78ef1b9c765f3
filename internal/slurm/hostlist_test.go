package slurm

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestExpandHostlist(t *testing.T) {
	tests := []struct {
		expr string
		want []string // every name; nil to check only count, first and last
		// For long expansions:
		count       int
		first, last string
	}{
		{expr: "s1", want: []string{"s1"}},
		{expr: "s1,s2", want: []string{"s1", "s2"}},
		{expr: "s[1-3]", want: []string{"s1", "s2", "s3"}},
		{expr: "s[1-3,7]", want: []string{"s1", "s2", "s3", "s7"}},
		{expr: "s[1-3,7],login1", want: []string{"s1", "s2", "s3", "s7", "login1"}},
		{expr: "s[01-04]", want: []string{"s01", "s02", "s03", "s04"}},
		{expr: "n[01-03]", want: []string{"n01", "n02", "n03"}},
		{expr: "node[8-11]", want: []string{"node8", "node9", "node10", "node11"}},
		{expr: "n[098-101]", want: []string{"n098", "n099", "n100", "n101"}},
		{expr: "n[01-3]", want: []string{"n01", "n02", "n03"}},     // the lower bound sets the width
		{expr: "n[1-03]", want: []string{"n1", "n2", "n3"}},        // the upper bound does not
		{expr: "n[9-10,007]", want: []string{"n9", "n10", "n007"}}, // each range has its own width
		{expr: "rack[01-02]-gpu[1-2]", want: []string{"rack01-gpu1", "rack01-gpu2", "rack02-gpu1", "rack02-gpu2"}},
		{expr: "rack[01-04]-gpu[1-8]", count: 32, first: "rack01-gpu1", last: "rack04-gpu8"},
		{expr: "a[1-2],b[3-4]", want: []string{"a1", "a2", "b3", "b4"}},
		{expr: "gpu-a100-[1-2]", want: []string{"gpu-a100-1", "gpu-a100-2"}},
		{expr: "x[0]", want: []string{"x0"}},
		{expr: "h[1-2]x", want: []string{"h1x", "h2x"}},
		{expr: "s[1-2],login", want: []string{"s1", "s2", "login"}},
		{expr: "[1-2]", want: []string{"1", "2"}},
		{expr: "n1[0-2]", want: []string{"n10", "n11", "n12"}},
		{expr: "a[1-2]b[3-4]c[5-6]", want: []string{"a1b3c5", "a1b3c6", "a1b4c5", "a1b4c6", "a2b3c5", "a2b3c6", "a2b4c5", "a2b4c6"}},
		{expr: "nid[00001-00003].cluster.example.org", want: []string{"nid00001.cluster.example.org", "nid00002.cluster.example.org", "nid00003.cluster.example.org"}},
		{expr: "s1,s1,s[1-2]", want: []string{"s1", "s1", "s1", "s2"}}, // duplicates stay
		{expr: "s[2,1]", want: []string{"s2", "s1"}},                   // in the order written
		{expr: "n[1-65536]", count: MaxHosts, first: "n1", last: "n65536"},
		{expr: "n[18446744073709551614-18446744073709551615]", want: []string{"n18446744073709551614", "n18446744073709551615"}},
	}
	for _, tc := range tests {
		t.Run(tc.expr, func(t *testing.T) {
			got, err := ExpandHostlist(tc.expr)
			if err != nil {
				t.Fatalf("ExpandHostlist(%q): %v", tc.expr, err)
			}
			if tc.want != nil {
				if !slices.Equal(got, tc.want) {
					t.Errorf("ExpandHostlist(%q) = %q, want %q", tc.expr, got, tc.want)
				}
				return
			}
			if len(got) != tc.count || got[0] != tc.first || got[len(got)-1] != tc.last {
				t.Errorf("ExpandHostlist(%q): %d names from %q to %q, want %d from %q to %q",
					tc.expr, len(got), got[0], got[len(got)-1], tc.count, tc.first, tc.last)
			}
		})
	}
}

func TestExpandHostlistErrors(t *testing.T) {
	long := strings.Repeat("a", MaxNameLen+1)
	tests := []struct {
		expr string
		want string // in the message, after the quoted expression
	}{
		{"", "empty expression"},
		{"a,,b", "empty item at byte 2"},
		{",a", "empty item at byte 0"},
		{"a,", "empty item at byte 2"},
		{"s[1-3", "'[' at byte 1 is never closed"},
		{"s[1-3],t[4", "'[' at byte 8 is never closed"},
		{"s1-3]", "']' at byte 4 closes no '['"},
		{"s[1]]", "']' at byte 4 closes no '['"},
		{"][", "']' at byte 0 closes no '['"},
		{"s[1-[2]]", "brackets do not nest"},
		{"s[]", "empty brackets at byte 1"},
		{"s[1,,2]", "empty range"},
		{"s[,1]", "empty range"},
		{"s[1,]", "empty range"},
		{"s[3-1]", `range "3-1" runs backwards (3 > 1)`},
		{"s[a-b]", `bound "a" of range "a-b" is not a decimal number`},
		{"s[1-b]", `bound "b" of range "1-b" is not a decimal number`},
		{"s[+1]", `bound "+1" of range "+1" is not a decimal number`},
		{"s[0x1]", "not a decimal number"},
		{"s[-1]", `range "-1" lacks a bound`},
		{"s[1-]", `range "1-" lacks a bound`},
		{"s[1-2-3]", "more than one '-'"},
		{"s[--1]", "more than one '-'"},
		{"s[1-5:2]", `range "1-5:2" has a step`},
		{"s[1:2]", "has a step"},
		{"s[99999999999999999999]", "too large"},
		{"n[0-65536]", "more than 65536 names"},
		{"n[1-70000]", "more than 65536 names"},
		{"n[0-18446744073709551615]", "more than 65536 names"},
		{"a[1-300]b[1-300]", "more than 65536 names"},
		{"a[1-40000],b[1-40000]", "more than 65536 names"},
		{"a[1-9],b[1-65536]", "more than 65536 names"},
		{"s1, s2", "whitespace at byte 3"},
		{"s1\ts2", "whitespace at byte 2"},
		{"s[1, 2]", "whitespace"},
		{long, "a name would be 256 bytes long"},
		{"n[" + strings.Repeat("0", MaxNameLen) + "]", "a name would be 256 bytes long"},
	}
	for _, tc := range tests {
		t.Run(tc.expr, func(t *testing.T) {
			got, err := ExpandHostlist(tc.expr)
			if err == nil {
				t.Fatalf("ExpandHostlist(%q) = %d names, want an error", tc.expr, len(got))
			}
			if !errors.Is(err, ErrBadHostlist) {
				t.Errorf("error %v does not wrap ErrBadHostlist", err)
			}
			if msg := err.Error(); !strings.Contains(msg, strconv.Quote(tc.expr)) || !strings.Contains(msg, tc.want) {
				t.Errorf("error %q, want the expression and %q", msg, tc.want)
			}
			if got != nil {
				t.Errorf("ExpandHostlist(%q) returned names with its error: %q", tc.expr, got)
			}
		})
	}
}

// TestExpandHostlistReference compares ExpandHostlist with a naive
// recursive expansion on random expressions.
func TestExpandHostlistReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	prefixes := []string{"", "n", "gpu-", "rack", "a1"}
	seps := []string{"", "-", "x", ".ib", "-gpu"}
	for range 2000 {
		var items []string
		for range 1 + rng.IntN(3) {
			var b strings.Builder
			b.WriteString(prefixes[rng.IntN(len(prefixes))])
			for g := range rng.IntN(4) {
				if g > 0 {
					b.WriteString(seps[rng.IntN(len(seps))])
				}
				var ranges []string
				for range 1 + rng.IntN(3) {
					lo := rng.IntN(120)
					lows := fmt.Sprintf("%0*d", rng.IntN(4), lo)
					if rng.IntN(3) == 0 {
						ranges = append(ranges, lows)
					} else {
						ranges = append(ranges, lows+"-"+strconv.Itoa(lo+rng.IntN(6)))
					}
				}
				b.WriteString("[" + strings.Join(ranges, ",") + "]")
			}
			if b.Len() == 0 || rng.IntN(4) == 0 {
				b.WriteString("z")
			}
			items = append(items, b.String())
		}
		expr := strings.Join(items, ",")
		var want []string
		for _, it := range items {
			want = append(want, naiveExpand(it)...)
		}
		got, err := ExpandHostlist(expr)
		if err != nil {
			t.Fatalf("ExpandHostlist(%q): %v", expr, err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("ExpandHostlist(%q) = %q, want %q", expr, got, want)
		}
	}
}

// naiveExpand expands one well-formed item by substituting each number of
// its first bracket group and expanding the rest of the item for each.
func naiveExpand(item string) []string {
	i := strings.IndexByte(item, '[')
	if i < 0 {
		return []string{item}
	}
	j := strings.IndexByte(item, ']')
	var out []string
	for _, r := range strings.Split(item[i+1:j], ",") {
		lo, hi, ok := strings.Cut(r, "-")
		if !ok {
			hi = lo
		}
		a, _ := strconv.Atoi(lo)
		b, _ := strconv.Atoi(hi)
		for v := a; v <= b; v++ {
			for _, rest := range naiveExpand(item[j+1:]) {
				out = append(out, fmt.Sprintf("%s%0*d%s", item[:i], len(lo), v, rest))
			}
		}
	}
	return out
}

func FuzzExpandHostlist(f *testing.F) {
	for _, s := range []string{
		"s1", "s[1-3,7],login1", "rack[01-04]-gpu[1-8]", "n[098-101]", "h[1-2]x",
		"s[1-5:2]", "s[[1]]", "s[]", "a,,b", "n[0-65536]", "s[3-1]", "][", "[1-2]",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		names, err := ExpandHostlist(expr)
		if err != nil {
			if !errors.Is(err, ErrBadHostlist) {
				t.Fatalf("ExpandHostlist(%q): error %v does not wrap ErrBadHostlist", expr, err)
			}
			return
		}
		if len(names) == 0 || len(names) > MaxHosts {
			t.Fatalf("ExpandHostlist(%q) = %d names, want 1 to %d", expr, len(names), MaxHosts)
		}
		for _, n := range names {
			if n == "" || len(n) > MaxNameLen || strings.ContainsAny(n, "[],") {
				t.Fatalf("ExpandHostlist(%q) gave the name %q", expr, n)
			}
		}
	})
}
