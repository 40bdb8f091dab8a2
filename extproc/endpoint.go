package extproc

import (
	"net"
	"strings"
	"sync"

	"google.golang.org/protobuf/types/known/structpb"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
)

// addrCache maps a worker endpoint as registered ("http://10.0.0.5:8000") to
// the address a gateway dials ("10.0.0.5:8000"). Endpoints change rarely, so
// each is parsed once.
type addrCache struct{ m sync.Map }

func (c *addrCache) addr(endpoint string) string {
	if v, ok := c.m.Load(endpoint); ok {
		return v.(string)
	}
	a := catalog.Address(endpoint)
	c.m.Store(endpoint, a)
	return a
}

// target is one entry of a subset hint or test-pick list: an IP (any port) or
// an ip:port.
type target struct{ host, port string }

func parseTargets(entries []string) []target {
	out := make([]target, 0, len(entries))
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if h, p, err := net.SplitHostPort(e); err == nil {
			out = append(out, target{host: h, port: p})
			continue
		}
		out = append(out, target{host: strings.Trim(e, "[]")})
	}
	return out
}

func (t target) matches(addr string) bool {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		h, p = addr, ""
	}
	return h == t.host && (t.port == "" || t.port == p)
}

// subsetHint reads protocol 004's endpoint subset from the request's
// metadata: envoy.lb.subset_hint / x-gateway-destination-endpoint-subset, a
// list of "ip:port" strings or one comma-separated string (what declarative
// header-to-metadata filters produce). present is false when the key is
// absent (pick from the whole pool); an empty list is present and excludes
// every endpoint.
func subsetHint(md *corev3.Metadata) (entries []string, present bool) {
	ns := md.GetFilterMetadata()[MetadataSubsetHint]
	if ns == nil {
		return nil, false
	}
	v, ok := ns.GetFields()[KeySubset]
	if !ok {
		return nil, false
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			if s := e.GetStringValue(); s != "" {
				entries = append(entries, s)
			}
		}
	case *structpb.Value_StringValue:
		for e := range strings.SplitSeq(k.StringValue, ",") {
			if e = strings.TrimSpace(e); e != "" {
				entries = append(entries, e)
			}
		}
	}
	return entries, true
}

// servedEndpoint reads protocol 004's served endpoint (envoy.lb /
// x-gateway-destination-endpoint-served) from response metadata.
func servedEndpoint(md *corev3.Metadata) string {
	return strings.TrimSpace(md.GetFilterMetadata()[MetadataLB].GetFields()[KeyServed].GetStringValue())
}

// allowedWorkers translates a list of endpoint targets into the worker ids
// whose endpoint matches one of them.
func (c *addrCache) allowedWorkers(eps []selection.RankEndpoint, ts []target) []uint64 {
	var out []uint64
	for _, e := range eps {
		if len(out) > 0 && out[len(out)-1] == e.WorkerID {
			continue // the next rank of a worker already allowed
		}
		a := c.addr(e.Endpoint)
		for _, t := range ts {
			if t.matches(a) {
				out = append(out, e.WorkerID)
				break
			}
		}
	}
	return out
}
