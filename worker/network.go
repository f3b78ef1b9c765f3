package worker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// Network is how a node is reached: the address it advertises to the other
// nodes, the local address its ranks, stores and gossip member bind, and
// the interface that address belongs to (which gloo and NCCL are told to
// use).
type Network struct {
	// Host is advertised: other nodes dial it.
	Host string
	// Bind is where this node's listeners bind.
	Bind string
	// Iface is the interface holding Bind; empty when none does (an
	// unspecified Bind, or an address only a NAT knows).
	Iface string
}

// ResolveNetwork fills in what the operator left out. iface, when set,
// gives the address (its first IPv4, else IPv6). Without host the node
// advertises the address of the interface that routes to coordinator; bind
// defaults to host. It does not send a packet.
func ResolveNetwork(ctx context.Context, host, bind, iface, coordinator string) (Network, error) {
	n := Network{Host: host, Bind: bind, Iface: iface}
	if iface != "" {
		addr, err := ifaceAddr(iface)
		if err != nil {
			return n, err
		}
		if n.Host == "" {
			n.Host = addr
		}
		if n.Bind == "" {
			n.Bind = addr
		}
	}
	if n.Host == "" {
		addr, err := routeTo(ctx, coordinator)
		if err != nil {
			return n, fmt.Errorf("finding the address that reaches coordinator %s (set --advertise-addr or --iface): %w", coordinator, err)
		}
		n.Host = addr
	}
	if n.Bind == "" {
		// A name is bound where it resolves here, which may not be where
		// other nodes resolve it.
		ip, err := resolve(ctx, n.Host)
		if err != nil {
			return n, fmt.Errorf("advertised address %s: %w", n.Host, err)
		}
		n.Bind = ip
	}
	if n.Iface == "" {
		n.Iface = ifaceOf(n.Bind)
	}
	if ip := net.ParseIP(n.Bind); ip != nil && ip.IsLoopback() {
		if via, err := routeTo(ctx, coordinator); err == nil && !net.ParseIP(via).IsLoopback() {
			return n, fmt.Errorf("this node would listen on %s, a loopback address (advertised as %s), but reaches coordinator %s over the network from %s: other nodes could not reach it; leave out --advertise-addr, or give --iface or --bind",
				n.Bind, n.Host, coordinator, via)
		}
	}
	return n, nil
}

// resolve returns host's first address here: host itself if it is one.
func resolve(ctx context.Context, host string) (string, error) {
	if net.ParseIP(host) != nil {
		return host, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return "", err
	}
	if len(ips) == 0 {
		return "", errNoAddress
	}
	return ips[0].IP.String(), nil
}

// routeTo returns the local address this machine would use to reach addr
// ("host:port"): connecting a UDP socket chooses the route and the source
// address without sending anything.
func routeTo(ctx context.Context, addr string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second) // name resolution only
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String(), nil
}

// ifaceAddr returns the first IPv4 address of the interface named name, or
// its first global IPv6 address.
func ifaceAddr(name string) (string, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return "", fmt.Errorf("--iface %s: %w", name, err)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return "", fmt.Errorf("--iface %s: %w", name, err)
	}
	var v6 string
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		if ipn.IP.To4() != nil {
			return ipn.IP.String(), nil
		}
		if v6 == "" && !ipn.IP.IsLinkLocalUnicast() {
			v6 = ipn.IP.String()
		}
	}
	if v6 == "" {
		return "", fmt.Errorf("--iface %s: %w", name, errNoAddress)
	}
	return v6, nil
}

var errNoAddress = errors.New("no usable address")

// ifaceOf names the interface holding ip, or "" when none does.
func ifaceOf(ip string) string {
	want := net.ParseIP(ip)
	if want == nil || want.IsUnspecified() {
		return ""
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return ""
	}
	for _, ifi := range ifs {
		addrs, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.Equal(want) {
				return ifi.Name
			}
		}
	}
	return ""
}
