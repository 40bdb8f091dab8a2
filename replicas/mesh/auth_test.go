package mesh

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvselect/kvselect/internal/metricstest"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/index"
)

// testKey derives a distinct 32-byte key from a label.
func testKey(label string) []byte {
	k := sha256.Sum256([]byte(label))
	return k[:]
}

func withKey(key []byte, more ...[]byte) func(*Options) {
	return func(o *Options) { o.Key, o.Keys = key, more }
}

// rejectedMetric reads kvselect_replica_sync_rejected_envelopes_total{reason}
// from the mesh's collector.
func rejectedMetric(t *testing.T, m *Mesh, reason string) float64 {
	t.Helper()
	v, ok := metricstest.Series(t, m)["kvselect_replica_sync_rejected_envelopes_total{reason="+reason+"}"]
	if !ok {
		t.Fatalf("no rejected series for reason %q", reason)
	}
	return v
}

// roguePub is a raw ZMQ publisher on loopback that a victim can be made to
// subscribe to.
func roguePub(t *testing.T) (zmq4.Socket, string) {
	t.Helper()
	pub := zmq4.NewPub(bg)
	t.Cleanup(func() { _ = pub.Close() })
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	return pub, "tcp://" + pub.Addr().String()
}

// forger signs messages the way a mesh holding key would, under a sender id of
// its own: the legitimate sentinels sent through a rogue socket.
type forger struct {
	a   *authenticator
	seq uint64
}

func newForger(t *testing.T, key []byte, sender uint64) *forger {
	t.Helper()
	a, err := newAuthenticator([][]byte{key}, sender)
	if err != nil {
		t.Fatal(err)
	}
	return &forger{a: a}
}

func (f *forger) msg(topic string, payload []byte) zmq4.Msg {
	f.seq++
	return zmq4.NewMsgFrom([]byte(topic), payload, f.a.seal(nil, f.seq, []byte(topic), payload))
}

// remoteAdd is a peer's AddRequest for worker 1 of "model" (block size 4).
func remoteAdd(id string) []byte {
	ev := selection.BookingEvent{Kind: selection.BookingAdded, Partition: index.Partition{Model: "model", RoutingGroup: "default"},
		BlockSize: 4, RequestID: id, Worker: index.WorkerKey{WorkerID: 1}, Origin: 0xfeed, TrackingHashes: []uint64{7},
		TrackPrefill: true, PrefillTokens: ptr(uint64(4))}
	return AppendBooking(nil, &ev)
}

func remoteFree(id string) []byte {
	ev := selection.BookingEvent{Kind: selection.BookingFreed, Partition: index.Partition{Model: "model", RoutingGroup: "default"},
		BlockSize: 4, RequestID: id, Worker: index.WorkerKey{WorkerID: 1}, Origin: 0xfeed}
	return AppendBooking(nil, &ev)
}

// warmRogue sends signed Frees of unknown requests through pub until victim
// has heard one: the rogue subscription is then live, and everything sent
// after arrives in order on that one connection.
func warmRogue(t *testing.T, victim *replica, pub zmq4.Socket, f *forger) {
	t.Helper()
	before := victim.mesh.Stats().Bookings["unknown_request"]
	for i := 0; ; i++ {
		if err := pub.Send(f.msg(TopicSlotTracker, remoteFree(fmt.Sprint("warm-", i)))); err != nil {
			t.Fatal(err)
		}
		end := time.Now().Add(200 * time.Millisecond)
		for time.Now().Before(end) {
			if victim.mesh.Stats().Bookings["unknown_request"] > before {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		if i > int(deadline/(200*time.Millisecond)) {
			t.Fatal("rogue subscription never carried a message")
		}
	}
}

func book(t *testing.T, r *replica, id string) {
	t.Helper()
	if _, err := r.svc.Reserve(bg, &selection.ReservationRequest{PartitionKey: selection.PartitionKey{ModelName: "model"},
		SelectionID: &id, WorkerID: ptr(uint64(1)), PromptRequest: selection.PromptRequest{SequenceHashes: []int64{1}, ISLTokens: ptr(uint64(4))}}); err != nil {
		t.Fatal(err)
	}
}

// Two replicas sharing a key exchange the whole booking lifecycle as
// unkeyed ones do, and reject nothing.
func TestKeyedMeshPropagatesLifecycle(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	key := testKey("mesh")
	a, b := newReplicaWith(t, "A", 1, clk, 2, nil, withKey(key)), newReplicaWith(t, "B", 2, clk, 2, nil, withKey(key))
	connect(t, a, b)
	waitMeshed(t, a, b)
	waitMeshed(t, b, a)
	if _, err := a.svc.SelectAndReserve(bg, &selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "model"},
		SelectionID: ptr("replicated"), PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1, 2, 3, 4}}}); err != nil {
		t.Fatal(err)
	}
	want := selection.PotentialLoad{ActiveRequests: 1, PotentialDecodeBlocks: 1, PotentialPrefillTokens: 4}
	eventually(t, "B mirrors the booking", func() bool { return load(b) == want })
	if err := a.svc.PrefillComplete(bg, "replicated"); err != nil {
		t.Fatal(err)
	}
	want.PotentialPrefillTokens = 0
	eventually(t, "B sees prefill complete", func() bool { return load(b) == want })
	if err := b.svc.Free(bg, "replicated"); err != nil { // freed on the mirror, published back
		t.Fatal(err)
	}
	eventually(t, "A frees", func() bool { return load(a) == selection.PotentialLoad{} })
	for _, r := range []*replica{a, b} {
		if st := r.mesh.Stats(); len(st.Rejected) != 0 || st.Malformed != 0 {
			t.Errorf("%s rejected %v, malformed %d", r.name, st.Rejected, st.Malformed)
		}
		for _, reason := range []string{RejectedUnauthenticated, RejectedReplayed, RejectedMalformed} {
			if v := rejectedMetric(t, r.mesh, reason); v != 0 {
				t.Errorf("%s: rejected{%s} = %v", r.name, reason, v)
			}
		}
	}
}

// A rogue publisher the victim subscribes to sends well-formed bookings with
// no tag, a tag under another key, a tag over another payload or topic, and
// broken authentication frames: none is applied, each is counted by reason.
// A validly signed sentinel sent after them on the same connection is
// applied, so by then every rogue message has been handled.
func TestKeyedMeshRejectsForgedMessages(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	key := testKey("mesh")
	victim := newReplicaWith(t, "victim", 1, clk, 2, nil, withKey(key))
	pub, ep := roguePub(t)
	if _, err := victim.mesh.Register(ep); err != nil {
		t.Fatal(err)
	}
	legit := newForger(t, key, 0xfeed)
	warmRogue(t, victim, pub, legit)

	wrong := newForger(t, testKey("another key"), 0xbad)
	topic := []byte(TopicSlotTracker)
	other := legit.msg(TopicSlotTracker, remoteAdd("signed-other"))
	otherTopic := legit.msg(TopicSessionAffinity, remoteAdd("signed-other-topic"))
	good := legit.msg(TopicSlotTracker, remoteAdd("signed"))
	short := bytes.Clone(good.Frames[2][:authFrameLen-1])
	v2 := bytes.Clone(good.Frames[2])
	v2[0] = 2
	rogue := []struct {
		reason string
		msg    zmq4.Msg
	}{
		{RejectedUnauthenticated, zmq4.NewMsgFrom(topic, remoteAdd("no-mac"))},
		{RejectedUnauthenticated, wrong.msg(TopicSlotTracker, remoteAdd("wrong-key"))},
		{RejectedUnauthenticated, zmq4.NewMsgFrom(topic, remoteAdd("payload-swapped"), other.Frames[2])},
		{RejectedUnauthenticated, zmq4.NewMsgFrom(topic, remoteAdd("signed-other-topic"), otherTopic.Frames[2])},
		{RejectedMalformed, zmq4.NewMsgFrom(topic, remoteAdd("short-auth"), short)},
		{RejectedMalformed, zmq4.NewMsgFrom(topic, remoteAdd("version-2"), v2)},
		{RejectedMalformed, zmq4.NewMsgFrom(topic, remoteAdd("four-frames"), good.Frames[2], []byte("x"))},
		{RejectedMalformed, zmq4.NewMsgFrom(topic)},
	}
	want := map[string]uint64{}
	for _, r := range rogue {
		if err := pub.Send(r.msg); err != nil {
			t.Fatal(err)
		}
		want[r.reason]++
	}
	if err := pub.Send(legit.msg(TopicSlotTracker, remoteAdd("sentinel"))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the sentinel is applied", func() bool { return victim.mesh.Stats().Bookings["applied"] >= 1 })
	if l := load(victim); l.ActiveRequests != 1 {
		t.Fatalf("victim holds %d bookings, want only the sentinel", l.ActiveRequests)
	}
	st := victim.mesh.Stats()
	if st.Bookings["applied"] != 1 || st.Malformed != 0 {
		t.Fatalf("stats %+v", st)
	}
	for reason, n := range want {
		if st.Rejected[reason] != n {
			t.Errorf("Stats.Rejected[%s] = %d, want %d", reason, st.Rejected[reason], n)
		}
		if v := rejectedMetric(t, victim.mesh, reason); v != float64(n) {
			t.Errorf("rejected{%s} = %v, want %d", reason, v, n)
		}
	}
	if v := rejectedMetric(t, victim.mesh, RejectedReplayed); v != 0 {
		t.Errorf("rejected{replayed} = %v", v)
	}
}

// A valid message captured off a replica's PUB socket and published again
// — as is, or with its sequence raised — is not applied again: the copy is
// counted as replayed, the edited one as unauthenticated.
func TestKeyedMeshRejectsReplays(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	key := testKey("mesh")
	a, b := newReplicaWith(t, "A", 1, clk, 2, nil, withKey(key)), newReplicaWith(t, "B", 2, clk, 2, nil, withKey(key))
	connect(t, a, b)
	waitMeshed(t, a, b)

	// A spy subscribes to A like any peer could and records what A sends.
	spy := zmq4.NewSub(bg)
	t.Cleanup(func() { _ = spy.Close() })
	if err := spy.Dial(a.endpoint()); err != nil {
		t.Fatal(err)
	}
	if err := spy.SetOption(zmq4.OptionSubscribe, TopicSlotTracker); err != nil {
		t.Fatal(err)
	}
	heard := make(chan zmq4.Msg, 1024)
	go func() {
		for {
			msg, err := spy.Recv()
			if err != nil {
				return
			}
			select {
			case heard <- msg:
			default:
			}
		}
	}()
	// Book and free on A until the spy captured an admission that B applied
	// and then freed.
	var captured zmq4.Msg
	end := time.Now().Add(deadline)
	for i := 0; captured.Frames == nil; i++ {
		if time.Now().After(end) {
			t.Fatal("spy captured nothing")
		}
		id := fmt.Sprint("captured-", i)
		book(t, a, id)
		eventually(t, "B mirrors "+id, func() bool { return load(b).ActiveRequests == 1 })
		if err := a.svc.Free(bg, id); err != nil {
			t.Fatal(err)
		}
		eventually(t, "B frees "+id, func() bool { return load(b).ActiveRequests == 0 })
		wait := time.After(time.Second)
	drain:
		for {
			select {
			case msg := <-heard:
				if len(msg.Frames) != 3 {
					t.Fatalf("A sent %d frames", len(msg.Frames))
				}
				if ev, err := DecodeBooking(msg.Frames[1]); err == nil && ev.Kind == selection.BookingAdded && ev.RequestID == id {
					captured = msg
					break drain
				}
			case <-wait:
				break drain
			}
		}
	}

	pub, ep := roguePub(t)
	if _, err := b.mesh.Register(ep); err != nil {
		t.Fatal(err)
	}
	eventually(t, "B counts the replay", func() bool {
		if err := pub.Send(captured); err != nil {
			t.Fatal(err)
		}
		return b.mesh.Stats().Rejected[RejectedReplayed] >= 1
	})
	bumped := bytes.Clone(captured.Frames[2])
	bumped[authHeaderLen-1]++ // the sequence's low byte: the tag no longer matches
	if err := pub.Send(zmq4.NewMsgFrom(captured.Frames[0], captured.Frames[1], bumped)); err != nil {
		t.Fatal(err)
	}
	if err := pub.Send(newForger(t, key, 0xfeed).msg(TopicSlotTracker, remoteAdd("sentinel"))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "B applies the sentinel", func() bool { return load(b).ActiveRequests >= 1 })
	if l := load(b); l.ActiveRequests != 1 {
		t.Fatalf("B holds %d bookings, want only the sentinel (the replayed admission was applied)", l.ActiveRequests)
	}
	st := b.mesh.Stats()
	if st.Rejected[RejectedUnauthenticated] != 1 || st.Rejected[RejectedReplayed] == 0 || st.Rejected[RejectedMalformed] != 0 {
		t.Fatalf("rejected %v", st.Rejected)
	}
	if v := rejectedMetric(t, b.mesh, RejectedReplayed); v != float64(st.Rejected[RejectedReplayed]) || v < 1 {
		t.Fatalf("rejected{replayed} = %v", v)
	}
}

// A keyed replica applies nothing from an unkeyed one or one with another key,
// and those apply nothing from it: the mesh splits rather than trusting.
func TestKeyedAndUnkeyedMeshesDoNotMix(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	key := testKey("mesh")
	a := newReplicaWith(t, "A", 1, clk, 2, nil, withKey(key))
	b := newReplicaWith(t, "B", 2, clk, 2, nil, withKey(key))
	u := newReplica(t, "U", 3, clk, 2, nil)
	w := newReplicaWith(t, "W", 4, clk, 2, nil, withKey(testKey("another key")))
	for _, ep := range []string{a.endpoint(), u.endpoint(), w.endpoint()} {
		if _, err := b.mesh.Register(ep); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []*replica{u, w} {
		if _, err := r.mesh.Register(a.endpoint()); err != nil {
			t.Fatal(err)
		}
	}
	waitMeshed(t, a, b)
	received := func(r *replica, ep string) uint64 {
		var n uint64
		for _, p := range r.mesh.Stats().Peers {
			if p.Endpoint == ep {
				n += p.Received
			}
		}
		return n
	}
	// U and W book (and never free); A books and frees, until B has heard U
	// and W, and U and W have heard A.
	for i := 0; ; i++ {
		book(t, u, fmt.Sprint("u-", i))
		book(t, w, fmt.Sprint("w-", i))
		book(t, a, fmt.Sprint("a-", i))
		if err := a.svc.Free(bg, fmt.Sprint("a-", i)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		if received(b, u.endpoint()) > 0 && received(b, w.endpoint()) > 0 &&
			u.mesh.Stats().Malformed > 0 && w.mesh.Stats().Rejected[RejectedUnauthenticated] > 0 {
			break
		}
		if i > int(deadline/(20*time.Millisecond)) {
			t.Fatalf("meshes never exchanged: B %+v, U %+v, W %+v", b.mesh.Stats(), u.mesh.Stats(), w.mesh.Stats())
		}
	}
	// Everything B received from U and W was rejected as unauthenticated…
	eventually(t, "B rejects all of U's and W's messages", func() bool {
		return b.mesh.Stats().Rejected[RejectedUnauthenticated] == received(b, u.endpoint())+received(b, w.endpoint())
	})
	// …and U's and W's bookings are never freed: B's load returns to zero
	// only if none of them was applied.
	eventually(t, "B holds only A's (freed) bookings", func() bool { return load(b).ActiveRequests == 0 })
	if st := b.mesh.Stats(); st.Rejected[RejectedReplayed] != 0 || st.Rejected[RejectedMalformed] != 0 {
		t.Fatalf("B stats %+v", st)
	}
	// U sees A's three frames as malformed (today's rule for an unkeyed
	// mesh); W rejects A's tags. Neither decoded anything of A's.
	for _, r := range []*replica{u, w} {
		if st := r.mesh.Stats(); len(st.Bookings) != 0 {
			t.Fatalf("%s decoded A's events: %+v", r.name, st.Bookings)
		}
	}
	if v := rejectedMetric(t, u.mesh, RejectedUnauthenticated); v != 0 {
		t.Fatalf("unkeyed mesh counts rejections: %v", v)
	}
}

// Rolling key rotation: a replica that signs with the new key and still
// accepts the old one interoperates with one that signs with the old key and
// already accepts the new one; a replica that knows only the old key rejects
// the new signatures.
func TestKeyRotationIsRolling(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	oldKey, newKey := testKey("old"), testKey("new")
	a := newReplicaWith(t, "A", 1, clk, 1, nil, withKey(oldKey, newKey))
	b := newReplicaWith(t, "B", 2, clk, 1, nil, withKey(newKey, oldKey))
	c := newReplicaWith(t, "C", 3, clk, 1, nil, withKey(oldKey))
	connect(t, a, b)
	waitMeshed(t, a, b)
	waitMeshed(t, b, a)
	if _, err := c.mesh.Register(b.endpoint()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "C rejects B's new-key messages", func() bool {
		book(t, b, fmt.Sprint("rot-", probes.Add(1)))
		return c.mesh.Stats().Rejected[RejectedUnauthenticated] > 0
	})
	if l := load(c); l.ActiveRequests != 0 {
		t.Fatalf("C applied new-key bookings: %+v", l)
	}
}

func TestStartRejectsShortKeys(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	a := newReplica(t, "A", 1, clk, 1, nil)
	for _, o := range []Options{
		{Key: []byte{}},
		{Key: make([]byte, MinKeyBytes-1)},
		{Key: testKey("k"), Keys: [][]byte{[]byte("short")}},
	} {
		o.Bind = "tcp://127.0.0.1:0"
		if m, err := Start(bg, a.svc.Replica(), o); err == nil || !strings.Contains(err.Error(), "replica sync key") {
			if m != nil {
				_ = m.Close()
			}
			t.Errorf("key %d bytes, keys %d: %v", len(o.Key), len(o.Keys), err)
		}
	}
}

func TestLoadKey(t *testing.T) {
	dir := t.TempDir()
	hex64 := "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	raw32 := "abcdefghijklmnopqrstuvwxyz-ABCDE" // not all hex: raw
	decoded := bytes.Repeat([]byte{0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}, 2)
	for _, tc := range []struct {
		name, content string
		want          []byte
		err           string
	}{
		{"hex with newline", hex64 + "\n", decoded, ""},
		{"hex in capitals with spaces", "  " + strings.ToUpper(hex64) + " \r\n", decoded, ""},
		{"longer hex", hex64 + "0011", append(bytes.Clone(decoded), 0x00, 0x11), ""},
		{"raw", raw32, []byte(raw32), ""},
		{"raw with one trailing newline", raw32 + "\n", []byte(raw32), ""},
		{"raw with CRLF", raw32 + "\r\n", []byte(raw32), ""},
		{"raw keeps a second newline", raw32 + "\n\n", []byte(raw32 + "\n"), ""},
		{"short hex", hex64[:62] + "\n", nil, "hex key of 31 bytes, need at least 32"},
		{"odd hex", hex64[:63], nil, "odd number"},
		{"short raw", "not-a-long-enough-key\n", nil, "key of 21 bytes, need at least 32"},
		{"empty", "", nil, "empty key"},
		{"only a newline", "\n", nil, "empty key"},
		{"too large", strings.Repeat("x", maxKeyFileBytes+1), nil, "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := LoadKey(path)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), path) {
					t.Fatalf("err %v, want %q naming the path", err, tc.err)
				}
				return
			}
			if err != nil || !bytes.Equal(got, tc.want) {
				t.Fatalf("got %x, %v; want %x", got, err, tc.want)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		path := filepath.Join(dir, "absent")
		if _, err := LoadKey(path); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
			t.Fatalf("err %v", err)
		}
	})
}

// seal and verify: the tag covers topic, payload and header; every key of the
// list verifies, the first signs.
func TestSealVerify(t *testing.T) {
	k1, k2 := testKey("one"), testKey("two")
	signer, err := newAuthenticator([][]byte{k1}, 42)
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := newAuthenticator([][]byte{k2, k1}, 7)
	if err != nil {
		t.Fatal(err)
	}
	topic, payload := []byte(TopicSlotTracker), remoteAdd("r")
	frame := signer.seal(nil, 9, topic, payload)
	if len(frame) != authFrameLen {
		t.Fatalf("frame of %d bytes", len(frame))
	}
	h, r := verifier.verify(topic, payload, frame)
	if r != accepted || h != (authHeader{sender: 42, epoch: signer.epoch, seq: 9}) {
		t.Fatalf("verify: %v %+v", r, h)
	}
	only2, _ := newAuthenticator([][]byte{k2}, 7)
	if _, r := only2.verify(topic, payload, frame); r != rejectUnauthenticated {
		t.Fatalf("other key: %v", r)
	}
	if _, r := verifier.verify([]byte(TopicSessionAffinity), payload, frame); r != rejectUnauthenticated {
		t.Fatalf("other topic: %v", r)
	}
	// Topic and payload are length-delimited: moving bytes between them breaks the tag.
	moved := append(bytes.Clone(topic), payload[0])
	if _, r := verifier.verify(moved, payload[1:], frame); r != rejectUnauthenticated {
		t.Fatalf("bytes moved from payload to topic: %v", r)
	}
	for i := range frame {
		bad := bytes.Clone(frame)
		bad[i] ^= 0x01
		want := rejectUnauthenticated
		if i == 0 {
			want = rejectMalformed
		}
		if _, r := verifier.verify(topic, payload, bad); r != want {
			t.Fatalf("bit flipped at %d: %v", i, r)
		}
	}
	if a, b := newAuthenticatorT(t, k1), newAuthenticatorT(t, k1); a.epoch == b.epoch {
		t.Fatalf("epochs repeat: %x", a.epoch)
	}
}

func newAuthenticatorT(t *testing.T, key []byte) *authenticator {
	t.Helper()
	a, err := newAuthenticator([][]byte{key}, 1)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The replay window: strictly newer sequences always pass, a sequence within
// the window once, older ones never; a new epoch is a new stream; streams
// are bounded per sender and overall, least recently active evicted.
func TestReplayGuard(t *testing.T) {
	g := replayGuard{streams: map[streamID]replayState{}, perSender: map[uint64]int{}}
	steps := []struct {
		sender, epoch, seq uint64
		ok                 bool
	}{
		{1, 1, 100, true}, // first message of a stream: any sequence
		{1, 1, 100, false},
		{1, 1, 101, true},
		{1, 1, 99, true}, // reordered within the window
		{1, 1, 99, false},
		{1, 1, 200, true},
		{1, 1, 101, false}, // fell out of the window
		{1, 1, 137, true},  // 200-137 = 63: the window's last slot
		{1, 1, 136, false},
		{1, 1, 137, false},
		{1, 2, 1, true}, // the sender restarted: a new stream
		{1, 2, 1, false},
		{2, 1, 100, true}, // another sender's sequence space
		{1, 1, 201, true},
	}
	for i, s := range steps {
		if got := g.accept(s.sender, s.epoch, s.seq); got != s.ok {
			t.Fatalf("step %d %+v: accepted %v", i, s, got)
		}
	}
	// Incarnations of one sender: the fifth evicts the least recently active
	// (epoch 2), whose old messages then pass again — the bounded memory's
	// price.
	for e := uint64(3); e <= maxStreamsPerSender; e++ {
		g.accept(1, e, 1)
	}
	if g.perSender[1] != maxStreamsPerSender {
		t.Fatalf("%d streams of sender 1", g.perSender[1])
	}
	g.accept(1, 1, 202) // keep epoch 1 active
	g.accept(1, maxStreamsPerSender+1, 1)
	if _, ok := g.streams[streamID{1, 2}]; ok || g.perSender[1] != maxStreamsPerSender {
		t.Fatalf("epoch 2 not evicted: %v", g.streams)
	}
	if g.accept(1, 1, 202) {
		t.Fatal("active stream forgotten")
	}
	if !g.accept(1, 2, 1) {
		t.Fatal("evicted stream still remembered")
	}
	// Overall bound.
	for s := uint64(100); s < 100+2*maxReplayStreams; s++ {
		g.accept(s, 1, 1)
	}
	if len(g.streams) != maxReplayStreams {
		t.Fatalf("%d streams kept", len(g.streams))
	}
	n := 0
	for _, c := range g.perSender {
		n += c
	}
	if n != maxReplayStreams {
		t.Fatalf("per-sender counts sum to %d", n)
	}
}
