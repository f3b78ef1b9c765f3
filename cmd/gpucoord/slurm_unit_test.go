package main

import "testing"

func TestNodeAddr(t *testing.T) {
	for show, want := range map[string]string{
		"NodeName=gpu1 Arch=x86_64 CoresPerSocket=1 \n   CPUAlloc=0 NodeAddr=10.0.0.7 NodeHostName=gpu1 Version=22.05.8": "10.0.0.7",
		"NodeName=h2 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 NodeAddr=h2-ib NodeHostName=h2":                             "h2-ib",
		"Node gpu9 not found": "",
		"":                    "",
	} {
		if got := nodeAddr(show); got != want {
			t.Errorf("nodeAddr(%q) = %q, want %q", show, got, want)
		}
	}
}
