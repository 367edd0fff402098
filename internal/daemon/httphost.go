package daemon

import (
	"net"
	"strings"
)

// hostCheck decides which Host headers the HTTP listener answers: a page
// of another site whose name was pointed at the listener's address (DNS
// rebinding) sends its own name as Host, and is refused.
//
// Allowed: the listen address's host; on loopback also "localhost",
// 127.0.0.1 and ::1; on every interface (0.0.0.0, ::, or no host) also
// any IP address literal and "localhost" (a rebinding page names a domain,
// never an address); and every name of --http-allowed-hosts. The port is
// not compared. Names compare case-insensitively, without a final dot.
type hostCheck struct {
	names map[string]bool
	// anyIP: any IP address literal is allowed.
	anyIP bool
	// listen is the listen address, for the refusal's message.
	listen string
}

// newHostCheck builds the check of a listener on listen (an address as
// given to --http-listen) with the extra names allowed.
func newHostCheck(listen string, extra []string) hostCheck {
	h := hostCheck{names: make(map[string]bool), listen: listen}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		host = listen
	}
	host = canonHost(host)
	ip := net.ParseIP(host)
	switch {
	case host == "" || ip != nil && ip.IsUnspecified():
		h.anyIP = true
		h.names["localhost"] = true
	case host == "localhost" || ip != nil && ip.IsLoopback():
		for _, n := range []string{"localhost", "127.0.0.1", "::1"} {
			h.names[n] = true
		}
	}
	if host != "" {
		h.names[host] = true
	}
	for _, n := range extra {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if hn, _, err := net.SplitHostPort(n); err == nil {
			n = hn
		}
		h.names[canonHost(n)] = true
	}
	return h
}

// canonHost lowers a host name, strips an IPv6 literal's brackets and a
// final dot.
func canonHost(h string) string {
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// allowed reports whether a request's Host header may be answered.
func (h hostCheck) allowed(hostHeader string) bool {
	host := hostHeader
	if hn, _, err := net.SplitHostPort(hostHeader); err == nil {
		host = hn
	}
	host = canonHost(host)
	if host == "" {
		return false
	}
	if h.names[host] {
		return true
	}
	return h.anyIP && net.ParseIP(host) != nil
}

func (h hostCheck) String() string { return "listening on " + h.listen }
