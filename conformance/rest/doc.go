// Package rest is the black-box conformance suite for the REST API of a Dynamo-compatible
// standalone selection service (kvselect's server, or Dynamo's own
// `python -m dynamo.select_service`).
//
// The suite lives entirely in _test.go files and talks to the service only over HTTP, using
// the wire format of Dynamo's REST API as its documentation
// (https://docs.nvidia.com/dynamo/dev/components/router/standalone-selection-service) and its
// source (lib/kv-router/src/services/selection/ in github.com/ai-dynamo/dynamo) define it:
// routes, status codes, error texts, the pending-selection cache. Where a test pins the same
// behaviour as one of Dynamo's own HTTP tests (services/selection/tests.rs there), its comment
// names that test. Transport errors (400 unparsable JSON, 415, 422 wrong shape, 413) carry
// the texts of axum, Dynamo's HTTP framework. The package imports nothing from kvselect, so
// the same tests can certify any implementation:
//
//	KVSELECT_URL=http://127.0.0.1:8092 go test -count=1 -v ./conformance/rest
//
// Without KVSELECT_URL every test skips, so `go test ./...` stays green without a server.
//
// # Assumed server configuration
//
//   - default router configuration (no DYN_ROUTER_* variables) except
//     DYN_ROUTER_USE_KV_EVENTS=false: the approximate index, so workers need no KV event
//     endpoints and bookings are recorded into the index;
//   - no queue threshold (DYN_ROUTER_QUEUE_THRESHOLD unset), no policy config, no
//     conditional-disaggregation busy thresholds;
//   - session affinity off (no --session-affinity-ttl-secs), replica sync off (no
//     --replica-sync-port);
//   - --selection-cache-ttl-secs 2, so the pending-selection TTL test runs quickly. Set
//     KVSELECT_SELECTION_CACHE_TTL_SECS when the server runs with another TTL.
//
// Tests that need a different configuration probe for it and skip with the reason: a worker
// registered without KV event endpoints that comes back incomplete means the server consumes
// KV events; a session whose second booking stays on its first booking's worker although an
// idle worker exists means session affinity is on; a register_peer answered with 409 means
// replica sync is off. No test passes silently on a configuration it cannot check.
//
// # Sharing a server
//
// Every test uses its own model name, worker ids and selection ids carrying a random per-run
// suffix, and deletes the workers and reservations it creates, so the suite can run against a
// server that other clients (or another run of this suite) use at the same time. The only
// process-wide state is readiness (GET /ready counts schedulable workers in every partition);
// the readiness tests therefore assert the partition-specific 503 of POST /select and only the
// self-consistency of GET /ready (status 503 exactly when schedulable_workers is 0).
//
// Error messages are part of the wire contract here (clients such as Ray match the 404 of a
// missed replay to fall back to the explicit form), so tests assert the stable fragments of the
// documented texts, never the partition-key rendering, which Dynamo does not document.
package rest
