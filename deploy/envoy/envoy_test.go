// Package envoy holds the reference Envoy configuration for running kvselect
// as an endpoint picker (envoy.yaml); its test parses the file with
// go-control-plane's bootstrap proto, so a field Envoy would reject fails here.
package envoy

import (
	"os"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

func load(t *testing.T) *bootstrapv3.Bootstrap {
	t.Helper()
	raw, err := os.ReadFile("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	// Unknown fields are errors: a misspelt key must not pass silently.
	if err := (protojson.UnmarshalOptions{}).Unmarshal(js, &b); err != nil {
		t.Fatalf("envoy.yaml is not a valid Bootstrap: %v", err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml fails Envoy's proto validation: %v", err)
	}
	return &b
}

func TestEnvoyConfigIsTheEndpointPickerSetup(t *testing.T) {
	b := load(t)
	ls := b.GetStaticResources().GetListeners()
	if len(ls) != 1 {
		t.Fatalf("%d listeners", len(ls))
	}
	var hcm hcmv3.HttpConnectionManager
	if err := ls[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	filters := hcm.GetHttpFilters()
	if len(filters) != 2 || filters[1].GetName() != "envoy.filters.http.router" {
		t.Fatalf("http filters %v: want ext_proc then the router", filters)
	}
	var ep extprocfilter.ExternalProcessor
	if err := filters[0].GetTypedConfig().UnmarshalTo(&ep); err != nil {
		t.Fatal(err)
	}
	pm := ep.GetProcessingMode()
	if pm.GetRequestBodyMode() != extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED || pm.GetResponseBodyMode() != extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED ||
		pm.GetRequestTrailerMode() != extprocfilter.ProcessingMode_SEND || pm.GetResponseTrailerMode() != extprocfilter.ProcessingMode_SEND {
		t.Fatalf("processing mode %v: want FULL_DUPLEX_STREAMED bodies and SEND trailers", pm)
	}
	if got := ep.GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != "kvselect_extproc" {
		t.Fatalf("ext_proc cluster %q", got)
	}
	if fwd := ep.GetMetadataOptions().GetForwardingNamespaces().GetUntyped(); !has(fwd, "envoy.lb") || !has(fwd, "envoy.lb.subset_hint") {
		t.Fatalf("forwarded metadata namespaces %v", fwd)
	}
	if rcv := ep.GetMetadataOptions().GetReceivingNamespaces().GetUntyped(); !has(rcv, "envoy.lb") {
		t.Fatalf("received metadata namespaces %v", rcv)
	}
	if !ep.GetAllowContentLengthHeader() {
		t.Fatal("allow_content_length_header must keep the picker's content-length")
	}

	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	od := clusters["original_destination_cluster"]
	if od.GetType() != clusterv3.Cluster_ORIGINAL_DST || od.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED ||
		!od.GetOriginalDstLbConfig().GetUseHttpHeader() || od.GetOriginalDstLbConfig().GetHttpHeaderName() != "x-gateway-destination-endpoint" {
		t.Fatalf("original destination cluster %v", od)
	}
	pk := clusters["kvselect_extproc"]
	if pk == nil || pk.GetHealthChecks()[0].GetGrpcHealthCheck().GetServiceName() != "envoy.service.ext_proc.v3.ExternalProcessor" {
		t.Fatalf("picker cluster %v", pk)
	}
	port := pk.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue()
	if port != 9002 {
		t.Fatalf("picker port %d, want kvselect's default 9002", port)
	}
}

func has(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}
