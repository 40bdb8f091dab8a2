// Package envoy holds the reference Envoy configurations for running kvselect
// as an endpoint picker: envoy-tls.yaml for a picker that serves TLS (the
// recommended one, matching the deploy/ manifests), envoy-mtls.yaml for one
// that also requires Envoy's client certificate, envoy.yaml for a plaintext
// picker next to Envoy. Its test parses the files with go-control-plane's
// bootstrap proto, so a field Envoy would reject fails here.
package envoy

import (
	"os"
	"slices"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

func load(t *testing.T, name string) *bootstrapv3.Bootstrap {
	t.Helper()
	raw, err := os.ReadFile(name)
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
		t.Fatalf("%s is not a valid Bootstrap: %v", name, err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("%s fails Envoy's proto validation: %v", name, err)
	}
	return &b
}

func TestEnvoyConfigIsTheEndpointPickerSetup(t *testing.T) {
	pk := checkPickerSetup(t, load(t, "envoy.yaml"))
	if ts := pk.GetTransportSocket(); ts != nil {
		t.Fatalf("envoy.yaml dials the picker with %v; kvselect serves plaintext by default", ts)
	}
}

// envoy-tls.yaml is envoy.yaml with the picker dialed over TLS: ALPN h2 on
// the data and health-check connections (grpc-go servers refuse TLS without
// it) and no verification of the self-signed certificate.
func TestEnvoyTLSConfigDialsThePickerOverTLS(t *testing.T) {
	pk := checkPickerSetup(t, load(t, "envoy-tls.yaml"))
	ctx := upstreamTLS(t, pk).GetCommonTlsContext()
	if !slices.Equal(ctx.GetAlpnProtocols(), []string{"h2"}) {
		t.Fatalf("picker ALPN %v, want h2", ctx.GetAlpnProtocols())
	}
	if ctx.GetValidationContextType() != nil {
		t.Fatalf("validation %v: the example dials the self-signed certificate unverified", ctx.GetValidationContextType())
	}
	if hc := pk.GetHealthChecks()[0]; !slices.Equal(hc.GetTlsOptions().GetAlpnProtocols(), []string{"h2"}) {
		t.Fatalf("health check TLS options %v, want ALPN h2", hc.GetTlsOptions())
	}
}

// envoy-mtls.yaml is envoy-tls.yaml with both ends authenticated: Envoy
// presents a certificate and key (what --extproc-client-ca requires at every
// handshake, health checks included, as they share the transport socket) and
// verifies the picker's certificate against a CA and the Service's name.
func TestEnvoyMTLSConfigAuthenticatesBothEnds(t *testing.T) {
	pk := checkPickerSetup(t, load(t, "envoy-mtls.yaml"))
	up := upstreamTLS(t, pk)
	ctx := up.GetCommonTlsContext()
	if !slices.Equal(ctx.GetAlpnProtocols(), []string{"h2"}) {
		t.Fatalf("picker ALPN %v, want h2", ctx.GetAlpnProtocols())
	}
	certs := ctx.GetTlsCertificates()
	if len(certs) != 1 || certs[0].GetCertificateChain().GetFilename() == "" || certs[0].GetPrivateKey().GetFilename() == "" {
		t.Fatalf("client certificate %v: want one chain and key from files", certs)
	}
	vc := ctx.GetValidationContext()
	if vc.GetTrustedCa().GetFilename() == "" {
		t.Fatalf("validation context %v: the picker's certificate must be verified against a CA", vc)
	}
	sans := vc.GetMatchTypedSubjectAltNames()
	if len(sans) != 1 || sans[0].GetMatcher().GetExact() == "" || sans[0].GetMatcher().GetExact() != up.GetSni() {
		t.Fatalf("SAN matchers %v with SNI %q: want the picker's DNS name, sent as SNI too", sans, up.GetSni())
	}
	if vc.GetAllowExpiredCertificate() || vc.GetTrustChainVerification() != tlsv3.CertificateValidationContext_VERIFY_TRUST_CHAIN {
		t.Fatalf("validation context %v: verification must not be relaxed", vc)
	}
	if hc := pk.GetHealthChecks()[0]; !slices.Equal(hc.GetTlsOptions().GetAlpnProtocols(), []string{"h2"}) || hc.GetTransportSocketMatchCriteria() != nil {
		t.Fatalf("health check %v: want ALPN h2 over the cluster's (client-certificate) transport socket", hc)
	}
}

// upstreamTLS returns the picker cluster's UpstreamTlsContext.
func upstreamTLS(t *testing.T, pk *clusterv3.Cluster) *tlsv3.UpstreamTlsContext {
	t.Helper()
	ts := pk.GetTransportSocket()
	if ts.GetName() != "envoy.transport_sockets.tls" {
		t.Fatalf("picker transport socket %v", ts)
	}
	var up tlsv3.UpstreamTlsContext
	if err := ts.GetTypedConfig().UnmarshalTo(&up); err != nil {
		t.Fatal(err)
	}
	return &up
}

// checkPickerSetup checks what the configurations share and returns the
// picker's cluster.
func checkPickerSetup(t *testing.T, b *bootstrapv3.Bootstrap) *clusterv3.Cluster {
	t.Helper()
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
	return pk
}

func has(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}
