// Package epp is a black-box conformance suite for an endpoint picker (EPP)
// over Envoy's ext_proc protocol, as the Gateway API Inference Extension's
// proposal 004 specifies it
// (https://github.com/kubernetes-sigs/gateway-api-inference-extension/tree/main/docs/proposals/004-endpoint-picker-protocol):
// it drives a running kvselect process over gRPC with envoysim — an ext_proc
// client that sends messages in Envoy's order for each processing mode and
// ends every stream as Envoy does — and checks
// every protocol rule from the gateway's side: the destination header and
// envoy.lb metadata, fallbacks, the subset hint, 400/413/429/503 immediate
// responses with a JSON error, body re-chunking with content-length,
// clear_route_cache, served-endpoint attribution, the response lifecycle and
// that no booking outlives its stream, gRPC health, and the GIE conformance
// hooks. Workers are registered and loads read over the server's REST API.
//
// It needs KVSELECT_URL (REST base URL) and KVSELECT_EXTPROC (host:port of
// the ext_proc server); conformance/run-epp.sh starts kvselect processes in
// the configurations the suite knows about and sets the variables. Tests
// whose configuration is absent skip.
package epp
