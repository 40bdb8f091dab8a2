package mesh

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Message authentication. The mesh's ZMQ transport has no usable security:
// go-zeromq offers NULL and PLAIN (a cleartext password) but not CURVE, and
// Dynamo's mesh has none at all. Whoever reaches a replica's sync port, or can
// get a replica to subscribe to them (a registered peer, a spoofed DNS name),
// could otherwise book phantom load onto any worker, free real bookings and
// rebind sessions on every replica. With a shared key each message carries
// an HMAC-SHA256 tag in a third frame:
//
//	[topic, payload, auth]
//	auth = version (1 byte, 0x01)
//	     ‖ sender   (8 bytes, big endian: the publisher's replica id)
//	     ‖ epoch    (8 bytes, big endian: random per publishing Mesh)
//	     ‖ sequence (8 bytes, big endian: 1, 2, … per publishing Mesh)
//	     ‖ tag      (32 bytes)
//	tag  = HMAC-SHA256(key, "kvselect/replica-sync/auth/v1\x00"
//	                        ‖ auth[0:25] ‖ len(topic) (4 bytes, big endian) ‖ topic ‖ payload)
//
// The tag covers the topic and the whole payload, so neither can be swapped,
// and the header, so the sequence cannot be rewritten. It is checked with
// hmac.Equal before anything is decoded. A verified message then passes the
// replay window of its stream (sender, epoch): a sequence above the highest
// seen is accepted, one within the 64 below it only once, anything older
// never. A restarted publisher draws a new epoch and starts a new stream, so
// its sequence may start over; the first message of an unknown stream is
// accepted at any sequence, because subscribers join running publishers. The
// receiver remembers a bounded number of streams (maxReplayStreams, and
// maxStreamsPerSender per sender), the least recently active evicted first.
//
// What the key proves is membership, not identity: every key holder can
// publish under any sender id, as every replica is equally trusted. A stream
// that was evicted can be replayed (an attacker needs recorded traffic of a
// publisher whose stream has gone quiet for longer than maxReplayStreams newer
// streams took to appear); what it replays expires like any mirrored booking.

// MinKeyBytes is the shortest key the mesh accepts: HMAC-SHA256's block of
// entropy.
const MinKeyBytes = 32

// maxKeyFileBytes bounds a key file: anything larger is the wrong file.
const maxKeyFileBytes = 4 << 10

const (
	authVersion   = 1
	authHeaderLen = 1 + 8 + 8 + 8
	authFrameLen  = authHeaderLen + sha256.Size

	// replayWindow is how far below the highest sequence of a stream a
	// message may arrive (reordered, or its copy over a second connection to
	// the same publisher lost) and still be accepted once.
	replayWindow = 64
	// maxReplayStreams bounds the streams remembered; maxStreamsPerSender
	// bounds the incarnations of one sender id among them.
	maxReplayStreams    = 1024
	maxStreamsPerSender = 4

	// rejectLogEvery rate-limits the warning per rejection reason.
	rejectLogEvery = 10 * time.Second
)

var authDomain = []byte("kvselect/replica-sync/auth/v1\x00")

// LoadKey reads a replica sync key file: either hex (what `openssl rand -hex
// 32` writes; surrounding whitespace ignored) or raw bytes (one trailing
// newline ignored). A file that is all hex digits is decoded as hex. The key
// must hold at least MinKeyBytes bytes after decoding. Errors name the path.
func LoadKey(path string) ([]byte, error) {
	key, err := loadKey(path)
	if err != nil {
		return nil, fmt.Errorf("replica sync key file %s: %w", path, err)
	}
	return key, nil
}

func loadKey(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxKeyFileBytes {
		return nil, fmt.Errorf("larger than %d bytes: not a key", maxKeyFileBytes)
	}
	return parseKey(b)
}

func parseKey(b []byte) ([]byte, error) {
	if t := bytes.TrimSpace(b); len(t) > 0 && isHex(t) {
		if len(t)%2 != 0 {
			return nil, fmt.Errorf("hex key with an odd number of digits (%d)", len(t))
		}
		key := make([]byte, hex.DecodedLen(len(t)))
		if _, err := hex.Decode(key, t); err != nil {
			return nil, err
		}
		if len(key) < MinKeyBytes {
			return nil, fmt.Errorf("hex key of %d bytes, need at least %d (generate one with `openssl rand -hex 32`)", len(key), MinKeyBytes)
		}
		return key, nil
	}
	raw := b
	if r, ok := bytes.CutSuffix(raw, []byte("\n")); ok {
		raw, _ = bytes.CutSuffix(r, []byte("\r"))
	}
	if len(raw) == 0 {
		return nil, errors.New("empty key")
	}
	if len(raw) < MinKeyBytes {
		return nil, fmt.Errorf("key of %d bytes, need at least %d (generate one with `openssl rand -hex 32`)", len(raw), MinKeyBytes)
	}
	return bytes.Clone(raw), nil
}

func isHex(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// rejectReason says why an authenticated mesh dropped a message before
// decoding it.
type rejectReason uint8

const (
	accepted rejectReason = iota
	rejectUnauthenticated
	rejectReplayed
	rejectMalformed
	numRejectReasons
)

// Rejection reasons: the labels of kvselect_replica_sync_rejected_envelopes_total
// and the keys of Stats.Rejected.
const (
	RejectedUnauthenticated = "unauthenticated" // no authentication frame, or a tag no key produces
	RejectedReplayed        = "replayed"        // a sequence already accepted, or too old, in its stream
	RejectedMalformed       = "malformed"       // frame count, or an authentication frame of the wrong size or version
)

var rejectNames = [numRejectReasons]string{"", RejectedUnauthenticated, RejectedReplayed, RejectedMalformed}

func (r rejectReason) String() string { return rejectNames[r] }

// macKey computes tags under one key. HMAC states are pooled: subscriptions
// verify concurrently, and a fresh hmac.New per message would allocate.
type macKey struct{ pool sync.Pool }

type macState struct {
	h   hash.Hash
	n   [4]byte
	sum [sha256.Size]byte
}

func newMACKey(key []byte) *macKey {
	key = bytes.Clone(key)
	k := &macKey{}
	k.pool.New = func() any { return &macState{h: hmac.New(sha256.New, key)} }
	return k
}

// tag writes the tag of (hdr, topic, payload) to out.
func (k *macKey) tag(out *[sha256.Size]byte, hdr, topic, payload []byte) {
	st := k.pool.Get().(*macState)
	st.h.Reset()
	st.h.Write(authDomain)
	st.h.Write(hdr)
	binary.BigEndian.PutUint32(st.n[:], uint32(len(topic)))
	st.h.Write(st.n[:])
	st.h.Write(topic)
	st.h.Write(payload)
	*out = [sha256.Size]byte(st.h.Sum(st.sum[:0]))
	k.pool.Put(st)
}

// authHeader is the authenticated part of the auth frame.
type authHeader struct {
	sender, epoch, seq uint64
}

// authenticator signs outbound messages with the first key, verifies inbound
// ones against every key and keeps the replay windows.
type authenticator struct {
	keys   []*macKey
	sender uint64
	epoch  uint64
	replay replayGuard
}

func newAuthenticator(keys [][]byte, sender uint64) (*authenticator, error) {
	if len(keys) == 0 {
		return nil, errors.New("no key")
	}
	a := &authenticator{sender: sender, replay: replayGuard{streams: make(map[streamID]replayState), perSender: make(map[uint64]int)}}
	for i, k := range keys {
		if len(k) < MinKeyBytes {
			return nil, fmt.Errorf("key %d: %d bytes, need at least %d", i, len(k), MinKeyBytes)
		}
		a.keys = append(a.keys, newMACKey(k))
	}
	var e [8]byte
	for a.epoch == 0 {
		if _, err := rand.Read(e[:]); err != nil {
			return nil, err
		}
		a.epoch = binary.BigEndian.Uint64(e[:])
	}
	return a, nil
}

// seal appends the auth frame of message seq to dst.
func (a *authenticator) seal(dst []byte, seq uint64, topic, payload []byte) []byte {
	start := len(dst)
	dst = append(dst, authVersion)
	dst = binary.BigEndian.AppendUint64(dst, a.sender)
	dst = binary.BigEndian.AppendUint64(dst, a.epoch)
	dst = binary.BigEndian.AppendUint64(dst, seq)
	var t [sha256.Size]byte
	a.keys[0].tag(&t, dst[start:], topic, payload)
	return append(dst, t[:]...)
}

// verify checks an auth frame against topic and payload; it does not touch
// the replay windows.
func (a *authenticator) verify(topic, payload, frame []byte) (authHeader, rejectReason) {
	if len(frame) != authFrameLen || frame[0] != authVersion {
		return authHeader{}, rejectMalformed
	}
	hdr, got := frame[:authHeaderLen], frame[authHeaderLen:]
	var want [sha256.Size]byte
	for _, k := range a.keys {
		k.tag(&want, hdr, topic, payload)
		if hmac.Equal(want[:], got) {
			return authHeader{
				sender: binary.BigEndian.Uint64(hdr[1:]),
				epoch:  binary.BigEndian.Uint64(hdr[9:]),
				seq:    binary.BigEndian.Uint64(hdr[17:]),
			}, accepted
		}
	}
	return authHeader{}, rejectUnauthenticated
}

// open authenticates a received message, frames [topic, payload, auth], and
// records it in its stream's replay window. Only an accepted message may be
// decoded.
func (a *authenticator) open(frames [][]byte) rejectReason {
	switch len(frames) {
	case 2:
		return rejectUnauthenticated
	case 3:
	default:
		return rejectMalformed
	}
	h, r := a.verify(frames[0], frames[1], frames[2])
	if r != accepted {
		return r
	}
	if !a.replay.accept(h.sender, h.epoch, h.seq) {
		return rejectReplayed
	}
	return accepted
}

// streamID names one publisher incarnation.
type streamID struct{ sender, epoch uint64 }

// replayState is a stream's sliding window: the highest sequence accepted,
// and a bitmap of the replayWindow sequences at and below it already accepted
// (bit i for max-i).
type replayState struct {
	max, seen uint64
	used      uint64 // replayGuard.tick of the latest acceptance
}

// replayGuard holds the replay windows of the streams heard, bounded.
type replayGuard struct {
	mu        sync.Mutex
	tick      uint64
	streams   map[streamID]replayState
	perSender map[uint64]int
}

// accept reports whether seq is new in its stream, and records it.
func (g *replayGuard) accept(sender, epoch, seq uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.tick++
	id := streamID{sender, epoch}
	s, ok := g.streams[id]
	if !ok {
		g.makeRoom(sender)
		g.streams[id] = replayState{max: seq, seen: 1, used: g.tick}
		g.perSender[sender]++
		return true
	}
	if seq > s.max {
		if d := seq - s.max; d < replayWindow {
			s.seen = s.seen<<d | 1
		} else {
			s.seen = 1
		}
		s.max = seq
	} else {
		d := s.max - seq
		if d >= replayWindow || s.seen&(1<<d) != 0 {
			return false
		}
		s.seen |= 1 << d
	}
	s.used = g.tick
	g.streams[id] = s
	return true
}

// makeRoom evicts the least recently active stream of sender when it has
// maxStreamsPerSender, then the least recently active of all when the guard
// is full. Only verified messages reach it, so only key holders (restarting
// replicas) cause evictions.
func (g *replayGuard) makeRoom(sender uint64) {
	if g.perSender[sender] >= maxStreamsPerSender {
		g.evict(func(id streamID) bool { return id.sender == sender })
	}
	if len(g.streams) >= maxReplayStreams {
		g.evict(func(streamID) bool { return true })
	}
}

func (g *replayGuard) evict(match func(streamID) bool) {
	var (
		oldest streamID
		used   uint64
		found  bool
	)
	for id, s := range g.streams {
		if match(id) && (!found || s.used < used) {
			oldest, used, found = id, s.used, true
		}
	}
	if !found {
		return
	}
	delete(g.streams, oldest)
	if g.perSender[oldest.sender]--; g.perSender[oldest.sender] <= 0 {
		delete(g.perSender, oldest.sender)
	}
}

// logLimiter lets one log line through per interval.
type logLimiter struct{ next atomic.Int64 }

func (l *logLimiter) allow(now time.Time, every time.Duration) bool {
	n := l.next.Load()
	t := now.UnixNano()
	return t >= n && l.next.CompareAndSwap(n, t+every.Nanoseconds())
}
