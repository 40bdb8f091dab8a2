package rest

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"testing"
)

// GET /replica_sync/peers is mounted and returns a sorted array of endpoints ([] when
// replica sync is disabled; Dynamo's HTTP test replica_sync_routes_are_mounted).
func TestReplicaSyncPeersIsSortedList(t *testing.T) {
	s := conformance(t)
	var peers []string
	r := s.get(t, "/replica_sync/peers").want(t, http.StatusOK)
	r.decode(t, &peers)
	if peers == nil {
		t.Fatalf("want a JSON array, got %s", r.body)
	}
	if !slices.IsSorted(peers) {
		t.Fatalf("peers not sorted: %q", peers)
	}
}

// Dynamic replica peers, as Dynamo's peer-route tests pin them. With replica sync disabled
// (the assumed configuration) both mutations are 409; with it enabled, register is 201 then
// 200, deregister 200 then 404, and invalid endpoints are 400.
func TestReplicaSyncPeerMembership(t *testing.T) {
	s := conformance(t)
	// A loopback port nobody should be serving replica events on: ZMQ SUB connects lazily,
	// so registering it is harmless.
	endpoint := fmt.Sprintf("tcp://127.0.0.1:%d", 20000+rand.IntN(20000))
	peers := func() []string {
		var p []string
		s.get(t, "/replica_sync/peers").want(t, http.StatusOK).decode(t, &p)
		return p
	}
	r := s.post(t, "/replica_sync/register_peer", obj{"endpoint": endpoint})
	if r.status == http.StatusConflict {
		r.wantError(t, http.StatusConflict, "replica sync is disabled")
		s.post(t, "/replica_sync/deregister_peer", obj{"endpoint": endpoint}).
			wantError(t, http.StatusConflict, "replica sync is disabled")
		if p := peers(); len(p) != 0 {
			t.Fatalf("replica sync disabled but peers = %q", p)
		}
		return
	}
	t.Cleanup(func() { s.post(t, "/replica_sync/deregister_peer", obj{"endpoint": endpoint}) })
	r.wantStatusOK(t, http.StatusCreated)
	s.post(t, "/replica_sync/register_peer", obj{"endpoint": endpoint}).wantOK(t) // already present: 200
	if p := peers(); !slices.Contains(p, endpoint) || !slices.IsSorted(p) {
		t.Fatalf("after register: peers %q", p)
	}
	for _, bad := range []string{"invalid", "tcp://127.0.0.1", "udp://127.0.0.1:1", "tcp://:5557"} {
		s.post(t, "/replica_sync/register_peer", obj{"endpoint": bad}).wantError(t, http.StatusBadRequest)
	}
	s.post(t, "/replica_sync/deregister_peer", obj{"endpoint": endpoint}).wantOK(t)
	if p := peers(); slices.Contains(p, endpoint) {
		t.Fatalf("after deregister: peers %q", p)
	}
	s.post(t, "/replica_sync/deregister_peer", obj{"endpoint": endpoint}).wantError(t, http.StatusNotFound, "peer not found")
}
