package main

import (
	"strings"
	"testing"
)

// FuzzHostfile: any hostfile is parsed or refused with an error, never a
// panic; one that parses names at least one host, each a single word
// without a comment, with the same slots (at least 1) for all.
func FuzzHostfile(f *testing.F) {
	f.Add("h1 slots=8\nh2 slots=8\n")
	f.Add("# a comment\nh1\n\nh2 # trailing\n")
	f.Add("h1 slots=0\n")
	f.Add("h1 slots=4\nh2 slots=8\n")
	f.Add("h1 slots=8 extra\n")
	f.Add("h1 slots=-1\nh2 slots=99999999999999999999\n")
	f.Add(strings.Repeat("x", 70000))
	f.Fuzz(func(t *testing.T, in string) {
		hosts, slots, err := parseHostfile(strings.NewReader(in), "fuzz")
		if err != nil {
			return
		}
		if len(hosts) == 0 || slots < 1 {
			t.Fatalf("parsed %d hosts with slots=%d", len(hosts), slots)
		}
		for _, h := range hosts {
			if h == "" || strings.ContainsAny(h, " \t\n#") {
				t.Fatalf("host %q", h)
			}
		}
	})
}
