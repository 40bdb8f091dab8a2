package catalog

import (
	"net/url"
	"strings"
)

// Address is the host:port a gateway dials for a worker endpoint as
// registered: an endpoint URL ("http://10.0.0.5:8000") gives its host and
// port, or its scheme's default port (443 for https and grpcs, 80 otherwise);
// an endpoint without a scheme is taken as host[:port]. IPv6 hosts come out
// in brackets ("[fd00::5]:8000"), the form GIE's endpoint-picker protocol
// (proposal 004) uses in x-gateway-destination-endpoint. What cannot be read
// as either is returned as given, so it simply matches no gateway address.
func Address(endpoint string) string {
	if strings.Contains(endpoint, "://") {
		u, err := url.Parse(endpoint)
		if err != nil || u.Host == "" {
			return endpoint
		}
		port := u.Port()
		if port == "" {
			switch u.Scheme {
			case "https", "grpcs":
				port = "443"
			default:
				port = "80"
			}
		}
		return joinHostPort(u.Hostname(), port)
	}
	if host, port, ok := splitHostPort(endpoint); ok {
		return joinHostPort(host, port)
	}
	return strings.Trim(endpoint, "[]")
}

// splitHostPort splits "host:port" and "[v6]:port" as net.SplitHostPort does
// for the shapes an endpoint takes; a bare IPv6 address or a missing port is
// not a host:port. (The selection core imports no package net.)
func splitHostPort(s string) (host, port string, ok bool) {
	if rest, found := strings.CutPrefix(s, "["); found {
		host, tail, closed := strings.Cut(rest, "]")
		port, hasPort := strings.CutPrefix(tail, ":")
		if !closed || !hasPort || port == "" || strings.Contains(port, ":") {
			return "", "", false
		}
		return host, port, true
	}
	i := strings.LastIndexByte(s, ':')
	if i < 0 || strings.IndexByte(s, ':') != i || i == len(s)-1 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

// joinHostPort is net.JoinHostPort: brackets around a host with a colon.
func joinHostPort(host, port string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + port
	}
	return host + ":" + port
}
