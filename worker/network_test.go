package worker

import (
	"strings"
	"testing"
)

// TestResolveNetwork: what an agent advertises, binds and names as its
// interface, from the flags it was given and the route to its
// coordinator. (The cluster tests cover hosts with their own addresses.)
func TestResolveNetwork(t *testing.T) {
	tests := []struct {
		name                           string
		host, bind, iface, coordinator string
		want                           Network
		wantErr                        string
	}{
		{name: "route to the coordinator", coordinator: "127.0.0.1:7070", want: Network{Host: "127.0.0.1", Bind: "127.0.0.1", Iface: "lo"}},
		{name: "the interface's address", iface: "lo", coordinator: "127.0.0.1:7070", want: Network{Host: "127.0.0.1", Bind: "127.0.0.1", Iface: "lo"}},
		{name: "advertised and bound apart", host: "203.0.113.7", bind: "127.0.0.1", coordinator: "127.0.0.1:7070",
			want: Network{Host: "203.0.113.7", Bind: "127.0.0.1", Iface: "lo"}},
		{name: "unspecified bind has no interface", host: "127.0.0.1", bind: "0.0.0.0", coordinator: "127.0.0.1:7070",
			want: Network{Host: "127.0.0.1", Bind: "0.0.0.0"}},
		{name: "no such interface", iface: "nosuch0", coordinator: "127.0.0.1:7070", wantErr: "--iface nosuch0"},
		{name: "coordinator without a port", coordinator: "127.0.0.1", wantErr: "finding the address that reaches coordinator 127.0.0.1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ResolveNetwork(t.Context(), tc.host, tc.bind, tc.iface, tc.coordinator)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}
