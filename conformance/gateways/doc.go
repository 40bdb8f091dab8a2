// Package gateways runs kvselect behind a real gateway that is not Envoy and
// checks what a client of that gateway sees. Today that gateway is NGINX
// Gateway Fabric's endpoint-picker path (NGF, github.com/nginx/nginx-gateway-fabric):
// Debian's NGINX with the njs module runs NGF's epp.js, which asks NGF's Go
// shim on 127.0.0.1:54800, which asks kvselect's ext_proc picker over a new
// gRPC connection per request (headers, then the whole body; never the
// response phase), and NGINX proxies the request to the endpoint named.
//
// The shim, epp.js and nginx.example.conf come from the folder named by
// KVSELECT_NGF_SHIM_DIR; nginx comes from PATH (apt-get install nginx-light
// libnginx-mod-http-js). Without either the tests skip with the reason;
// KVSELECT_REQUIRE_GATEWAYS=1 (or KVSELECT_REQUIRE_PEERS=1) makes that a
// failure, as CI does. kvselect and its mock workers run as real processes,
// built by the first test that runs (or taken from KVSELECT_BIN and
// KVSELECT_MOCKWORKER_BIN); llm-d-inference-sim joins when KVSELECT_LLMD_SIM
// is set.
//
// The shim's port is fixed by NGF, so the tests run one after another and two
// instances of this suite cannot run at once on one machine: the second fails
// saying port 54800 is taken. `make test` runs this package alone
// (`make conformance-gateways`), not inside its parallel `go test ./...`.
package gateways
