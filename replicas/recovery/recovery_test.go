package recovery

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvselect/kvselect/httpadmin"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

var bg = context.Background()

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newService is a selection service with the approximate index (bookings
// teach it), so a test can fill an index without engines.
func newService(t *testing.T, seed uint64, workers int) *selection.Service {
	t.Helper()
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	s, err := selection.New(selection.Config{Router: rc, Rand: rand.New(rand.NewPCG(seed, seed))})
	if err != nil {
		t.Fatal(err)
	}
	for id := 1; id <= workers; id++ {
		ep, bs := "http://w:8000", uint32(4)
		if _, err := s.UpsertWorker(bg, catalog.Record{WorkerID: uint64(id), ModelName: "model", RoutingGroup: "g:1", Endpoint: &ep, BlockSize: &bs}); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// peerWithIndex serves a real REST API over a service that booked a few prompts.
func peerWithIndex(t *testing.T) (*selection.Service, string) {
	t.Helper()
	s := newService(t, 1, 3)
	for i := range 6 {
		tokens := make([]uint32, 16)
		for j := range tokens {
			tokens[j] = uint32(i*100 + j)
		}
		if _, err := s.SelectAndReserve(bg, &selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "model", RoutingGroup: "g:1"},
			PromptRequest: selection.PromptRequest{TokenIDs: tokens}}); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(httpadmin.New(s, httpadmin.Options{Logger: quiet}))
	t.Cleanup(srv.Close)
	return s, srv.URL
}

func dumpJSON(t *testing.T, s *selection.Service) string {
	t.Helper()
	b, err := json.Marshal(s.Inspect().Dump())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// refusedURL is a loopback address nobody listens on.
func refusedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

func serve(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// The first peer with a usable dump wins; refused connections, error
// statuses, bodies that are not dumps and EPP-style error entries are skipped.
// The recovered index dumps exactly as the peer's.
func TestRecoversFromFirstUsablePeer(t *testing.T) {
	a, good := peerWithIndex(t)
	bad := []string{
		refusedURL(t),
		serve(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", http.StatusInternalServerError) }),
		serve(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "not json") }),
		serve(t, func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, `{"model:default":{"error":"peer KV index not yet recovered"}}`)
		}),
	}
	b := newService(t, 2, 3)
	res := Run(bg, b.Replica(), Options{Peers: append(bad, good+"/"), Delay: -1, Logger: quiet})
	if res.State != selection.RecoveryRecovered || res.Peer != good+"/" || len(res.Failed) != len(bad) {
		t.Fatalf("result %+v", res)
	}
	for _, f := range res.Failed[1:] {
		if !errors.Is(f.Err, ErrIncompatible) {
			t.Errorf("%s: %v, want ErrIncompatible", f.Peer, f.Err)
		}
	}
	if len(res.Partitions) != 1 || res.Partitions[0].Events == 0 || res.Partitions[0].Failed != 0 || res.Partitions[0].Err != nil {
		t.Fatalf("partitions %+v", res.Partitions)
	}
	if got, want := dumpJSON(t, b), dumpJSON(t, a); got != want {
		t.Fatalf("recovered dump differs:\n%s\nwant\n%s", got, want)
	}
	if st := b.Ready(); !st.Ready || st.IndexRecovery != "recovered" {
		t.Fatalf("ready %+v", st)
	}
	// The recovered index serves selection: a replayed prompt matches.
	tokens := make([]uint32, 16)
	for j := range tokens {
		tokens[j] = uint32(j)
	}
	resp, err := b.Select(bg, &selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "model", RoutingGroup: "g:1"},
		PromptRequest: selection.PromptRequest{TokenIDs: tokens}})
	if err != nil || resp.Overlap.LongestMatched != 16 {
		t.Fatalf("select after recovery: %+v %v", resp, err)
	}
}

// Readiness is held while recovery is pending and released when every peer
// failed: the replica starts empty.
func TestReadinessWaitsThenStartsEmpty(t *testing.T) {
	release := make(chan struct{})
	slow := serve(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		http.Error(w, "gone", http.StatusServiceUnavailable)
	})
	b := newService(t, 2, 1)
	done := make(chan Result, 1)
	go func() {
		done <- Run(bg, b.Replica(), Options{Peers: []string{slow, refusedURL(t)}, Delay: -1, Logger: quiet})
	}()
	end := time.Now().Add(10 * time.Second)
	for b.Ready().IndexRecovery != selection.RecoveryPending.String() {
		if time.Now().After(end) {
			t.Fatal("recovery never pending")
		}
		time.Sleep(time.Millisecond)
	}
	if st := b.Ready(); st.Ready || st.IndexRecovery != "pending" || st.SchedulableWorkers != 1 {
		t.Fatalf("ready while recovering: %+v", st)
	}
	close(release)
	res := <-done
	if res.State != selection.RecoveryFailed || res.Peer != "" || len(res.Failed) != 2 {
		t.Fatalf("result %+v", res)
	}
	if st := b.Ready(); !st.Ready || st.IndexRecovery != "failed" {
		t.Fatalf("ready after failed recovery: %+v", st)
	}
	if d := b.Inspect().Dump(); len(d["model:g:1"].Events) != 0 {
		t.Fatalf("index not empty: %+v", d)
	}
}

func TestLimitsAndCancellation(t *testing.T) {
	_, good := peerWithIndex(t)
	b := newService(t, 2, 1)
	res := Run(bg, b.Replica(), Options{Peers: []string{good}, Delay: -1, MaxBytes: 64, Logger: quiet})
	if res.State != selection.RecoveryFailed || len(res.Failed) != 1 || !errors.Is(res.Failed[0].Err, ErrIncompatible) {
		t.Fatalf("oversized dump: %+v", res)
	}
	hang := serve(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	res = Run(bg, b.Replica(), Options{Peers: []string{hang}, Delay: -1, Timeout: 50 * time.Millisecond, Logger: quiet})
	if res.State != selection.RecoveryFailed || !errors.Is(res.Failed[0].Err, context.DeadlineExceeded) {
		t.Fatalf("timeout: %+v", res)
	}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	res = Run(ctx, b.Replica(), Options{Peers: []string{good}, Logger: quiet})
	if res.State != selection.RecoveryFailed || b.Ready().IndexRecovery != selection.RecoveryFailed.String() {
		t.Fatalf("cancelled: %+v", res)
	}
	if res := Run(bg, b.Replica(), Options{}); !reflect.DeepEqual(res, Result{}) {
		t.Fatalf("no peers: %+v", res)
	}
}

// guarded serves h only to requests carrying "Authorization: Bearer <want()>",
// and answers 401 to the others; it records the headers it saw.
func guarded(t *testing.T, want func() string, h http.Handler) (string, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	url := serve(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer "+want() {
			http.Error(w, `{"error":"unauthorized"}`, http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
	return url, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

// The token file is sent as a bearer token, and read again for each request,
// so a token rotated in place (a projected ServiceAccount token) is used.
func TestTokenFileIsSentAndReReadEachFetch(t *testing.T) {
	a := newService(t, 1, 3)
	for i := range 3 {
		if _, err := a.SelectAndReserve(bg, &selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "model", RoutingGroup: "g:1"},
			PromptRequest: selection.PromptRequest{TokenIDs: []uint32{uint32(i), 1, 2, 3}}}); err != nil {
			t.Fatal(err)
		}
	}
	var current atomic.Value
	current.Store("first-token")
	peer, seen := guarded(t, func() string { return current.Load().(string) }, httpadmin.New(a, httpadmin.Options{Logger: quiet}))
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("first-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := newService(t, 2, 3)
	if res := Run(bg, b.Replica(), Options{Peers: []string{peer}, Delay: -1, TokenFile: path, Logger: quiet}); res.State != selection.RecoveryRecovered {
		t.Fatalf("result %+v", res)
	}
	if got, want := dumpJSON(t, b), dumpJSON(t, a); got != want {
		t.Fatalf("recovered dump differs")
	}
	// Rotated in place: the peer now wants the new token only.
	current.Store("second.token-_~+/==")
	if err := os.WriteFile(path, []byte("  second.token-_~+/==\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newService(t, 3, 3)
	if res := Run(bg, c.Replica(), Options{Peers: []string{peer}, Delay: -1, TokenFile: path, Logger: quiet}); res.State != selection.RecoveryRecovered {
		t.Fatalf("after rotation: %+v", res)
	}
	if want := []string{"Bearer first-token", "Bearer second.token-_~+/=="}; !reflect.DeepEqual(seen(), want) {
		t.Fatalf("peer saw %q, want %q", seen(), want)
	}
	// Without a token file no Authorization header is sent.
	d := newService(t, 4, 3)
	if res := Run(bg, d.Replica(), Options{Peers: []string{peer}, Delay: -1, Logger: quiet}); res.State != selection.RecoveryFailed {
		t.Fatalf("without a token: %+v", res)
	}
	if got := seen(); len(got) != 3 || got[2] != "" {
		t.Fatalf("peer saw %q: an Authorization header without a token file", got)
	}
}

// A token file that cannot be used fails the attempt before anything is
// sent, and the next peer is tried, as for any fetch error; a 401 or 403 is
// ErrUnauthorized and logged with the peer and what to check.
func TestTokenFileErrorsAndRefusals(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var requests atomic.Int64
	_, good := peerWithIndex(t)
	counting := serve(t, func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		http.Error(w, "unreachable", http.StatusInternalServerError)
	})
	for _, tc := range []struct{ name, path, err string }{
		{"missing", filepath.Join(dir, "absent"), "no such file"},
		{"empty", write("empty", " \n"), "is empty"},
		{"two tokens", write("two", "one\ntwo\n"), "offset 3"},
		{"too large", write("large", strings.Repeat("a", 9<<10)), "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			b := newService(t, 2, 3)
			res := Run(bg, b.Replica(), Options{Peers: []string{counting, counting}, Delay: -1, TokenFile: tc.path, Logger: log})
			if res.State != selection.RecoveryFailed || len(res.Failed) != 2 {
				t.Fatalf("result %+v", res)
			}
			for _, f := range res.Failed {
				if !strings.Contains(f.Err.Error(), tc.err) || !strings.Contains(f.Err.Error(), tc.path) {
					t.Fatalf("err %v, want %q naming %s", f.Err, tc.err, tc.path)
				}
			}
			if n := requests.Load(); n != 0 {
				t.Fatalf("%d requests sent without a token", n)
			}
			if strings.Count(logs.String(), "index recovery peer failed") != 2 {
				t.Fatalf("logs:\n%s", logs.String())
			}
		})
	}

	token := write("token", "wrong-token")
	refusing := []string{
		serve(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusUnauthorized) }),
		serve(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no scope", http.StatusForbidden) }),
	}
	for _, tokenFile := range []string{token, ""} {
		var logs bytes.Buffer
		b := newService(t, 2, 3)
		res := Run(bg, b.Replica(), Options{Peers: append(slices.Clone(refusing), good), Delay: -1, TokenFile: tokenFile,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if res.State != selection.RecoveryRecovered || res.Peer != good || len(res.Failed) != 2 {
			t.Fatalf("result %+v", res)
		}
		for _, f := range res.Failed {
			if !errors.Is(f.Err, ErrUnauthorized) || errors.Is(f.Err, ErrIncompatible) {
				t.Fatalf("%s: %v, want ErrUnauthorized", f.Peer, f.Err)
			}
		}
		out := logs.String()
		for _, p := range refusing {
			if !strings.Contains(out, "peer="+p) {
				t.Fatalf("log does not name %s:\n%s", p, out)
			}
		}
		hint := "read scope"
		if tokenFile != "" {
			hint = "check that the token in " + tokenFile
		}
		if strings.Count(out, "index recovery peer refused the credentials") != 2 || !strings.Contains(out, hint) {
			t.Fatalf("token file %q, logs:\n%s", tokenFile, out)
		}
	}
}
