package zmqguard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
)

type guardCase struct {
	name      string
	lim       Limits
	stream    []byte
	reason    string // "" when the whole stream is accepted
	handshake bool   // HandshakeDone after the stream (when accepted)
}

var nullHandshake = cat(greeting("NULL", 0), ready("PUB"))

// guardCases are streams with the verdict a FrameGuard must reach on them.
func guardCases() []guardCase {
	lim := Limits{MaxFrame: 1024}
	return []guardCase{
		{name: "handshake then messages", lim: lim, handshake: true, stream: cat(nullHandshake,
			message([]byte("kv@worker-1"), binary.BigEndian.AppendUint64(nil, 7), bytes.Repeat([]byte{0xAB}, 300)),
			message([]byte("single")), message(nil))},
		{name: "frame exactly at the cap", lim: lim, handshake: true, stream: cat(nullHandshake, message(make([]byte, 1024)))},
		{name: "greeting alone", lim: lim, stream: greeting("NULL", 1)},
		{name: "greeting from a newer ZMTP", lim: lim, stream: func() []byte { g := greeting("NULL", 0); g[versionAt] = 4; return g }()},
		{name: "READY cut short is not yet a handshake", lim: lim, stream: cat(greeting("NULL", 0), ready("PUB")[:20])},
		{name: "READY with an empty value", lim: lim, handshake: true, stream: cat(greeting("NULL", 0), command("READY", property("Identity", "")))},
		{name: "READY with no properties", lim: lim, handshake: true, stream: cat(greeting("NULL", 0), command("READY", nil))},
		{name: "INITIATE ends a PLAIN handshake", lim: lim, handshake: true, stream: cat(greeting("PLAIN", 0), command("HELLO", []byte{0, 0}), command("INITIATE", property("Socket-Type", "PUB")))},
		{name: "a longer name starting with INITIATE is another command", lim: lim, stream: cat(greeting("CURVE", 0), command("INITIATEX", nil))},
		{name: "unknown command bodies are not parsed", lim: lim, handshake: true, stream: cat(nullHandshake, command("PING", []byte{0xFF, 0xFF, 1}))},
		{name: "CURVE READY is an encrypted box, not properties", lim: lim, handshake: true, stream: cat(greeting("CURVE", 0), command("READY", []byte{9, 'x'}))},
		{name: "long form for a small size", lim: lim, handshake: true, stream: cat(nullHandshake, header(0, 3, true), []byte("abc"))},
		{name: "messages at the frame-count cap", lim: Limits{MaxFrame: 1024, MaxFrames: 3}, handshake: true, stream: cat(nullHandshake,
			message([]byte("a"), []byte("b"), []byte("c")), message([]byte("a"), []byte("b"), []byte("c")))},

		{name: "HTTP instead of a greeting", lim: lim, reason: ReasonBadGreeting, stream: []byte("GET / HTTP/1.1\r\nHost: kvselect\r\n\r\n")},
		{name: "signature without its last byte", lim: lim, reason: ReasonBadGreeting, stream: func() []byte { g := greeting("NULL", 0); g[9] = 0; return g }()},
		{name: "ZMTP 2 peer", lim: lim, reason: ReasonBadGreeting, stream: func() []byte { g := greeting("NULL", 0); g[versionAt] = 1; return g }()},
		{name: "as-server neither 0 nor 1", lim: lim, reason: ReasonBadGreeting, stream: greeting("NULL", 7)},
		{name: "reserved flag bit", lim: lim, reason: ReasonBadFlags, stream: cat(nullHandshake, []byte{0x80, 0})},
		{name: "command with MORE", lim: lim, reason: ReasonBadFlags, stream: cat(greeting("NULL", 0), []byte{flagCommand | flagMore, 1})},
		{name: "frame one byte over the cap", lim: lim, reason: ReasonOversizedFrame, stream: cat(nullHandshake, header(0, 1025, true))},
		{name: "a terabyte frame in the handshake", lim: lim, reason: ReasonOversizedFrame, stream: cat(greeting("NULL", 0), header(flagCommand, 1<<40, true))},
		{name: "a terabyte frame after the handshake", lim: lim, reason: ReasonOversizedFrame, stream: cat(nullHandshake, header(flagMore, 1<<40, true))},
		{name: "size past int64", lim: lim, reason: ReasonOversizedFrame, stream: cat(nullHandshake, header(0, 1<<63+5, true))},
		{name: "short size over a tiny cap", lim: Limits{MaxFrame: 100}, reason: ReasonOversizedFrame, stream: cat(greeting("NULL", 0), header(flagCommand, 200, false))},
		{name: "message over the frame-count cap", lim: Limits{MaxFrame: 1024, MaxFrames: 3}, reason: ReasonTooManyFrames, stream: cat(nullHandshake,
			message([]byte("a"), []byte("b"), []byte("c"), nil))},
		{name: "empty command", lim: lim, reason: ReasonBadCommand, stream: cat(greeting("NULL", 0), frame(flagCommand, nil))},
		{name: "empty command name", lim: lim, reason: ReasonBadCommand, stream: cat(greeting("NULL", 0), frame(flagCommand, []byte{0, 'x'}))},
		{name: "command name longer than its frame", lim: lim, reason: ReasonBadCommand, stream: cat(greeting("NULL", 0), frame(flagCommand, []byte{5, 'R', 'E', 'A', 'D', 'Y'}[:5]))},
		{name: "READY property without its value length", lim: lim, reason: ReasonBadCommand, stream: cat(greeting("NULL", 0), command("READY", []byte{1, 'A'}))},
		{name: "READY property name past the frame", lim: lim, reason: ReasonBadCommand, stream: cat(greeting("NULL", 0), command("READY", []byte{200, 'A'}))},
		{name: "READY value longer than the frame", lim: lim, reason: ReasonBadCommand, stream: cat(greeting("NULL", 0), command("READY", property("Identity", "abc")[:12]))},
		{name: "PLAIN INITIATE cut inside a property", lim: lim, reason: ReasonBadCommand, stream: cat(greeting("PLAIN", 0), command("INITIATE", []byte{3, 'a', 'b', 'c', 0, 0}))},
	}
}

// verdict feeds stream to a fresh guard in the chunks cut returns and reports
// the reason it was refused for ("" if accepted), how many bytes were
// accepted before the refused chunk, and whether the handshake was done.
func verdict(t testing.TB, lim Limits, stream []byte, cut func(rest int) int) (reason string, accepted int, handshake bool) {
	g := NewFrameGuard(lim)
	for len(stream) > 0 {
		n := min(max(cut(len(stream)), 1), len(stream))
		if err := g.Feed(stream[:n]); err != nil {
			var rej *RejectError
			if !errors.As(err, &rej) {
				t.Fatalf("Feed returned %T %v, want a *RejectError", err, err)
			}
			if again := g.Feed([]byte{0}); again != err {
				t.Fatalf("Feed after a rejection = %v, want the same %v", again, err)
			}
			return rej.Reason, accepted, g.HandshakeDone()
		}
		accepted += n
		stream = stream[n:]
	}
	return "", accepted, g.HandshakeDone()
}

func TestFrameGuardVerdicts(t *testing.T) {
	for _, tc := range guardCases() {
		t.Run(tc.name, func(t *testing.T) {
			reason, _, handshake := verdict(t, tc.lim, tc.stream, func(rest int) int { return rest })
			if reason != tc.reason {
				t.Fatalf("refused for %q, want %q", reason, tc.reason)
			}
			if tc.reason == "" && handshake != tc.handshake {
				t.Fatalf("HandshakeDone = %v, want %v", handshake, tc.handshake)
			}
		})
	}
}

// A reader may hand the guard any cut of the stream, down to single bytes:
// the verdict must not depend on it, and when fed byte by byte the guard must
// refuse the very byte that breaks the stream (nothing after it is needed).
func TestFrameGuardVerdictIgnoresChunking(t *testing.T) {
	for _, tc := range guardCases() {
		t.Run(tc.name, func(t *testing.T) {
			wantReason, _, wantHandshake := verdict(t, tc.lim, tc.stream, func(rest int) int { return rest })
			cuts := map[string]func(int) int{
				"bytes":  func(int) int { return 1 },
				"pairs":  func(int) int { return 2 },
				"nines":  func(int) int { return 9 },
				"greedy": func(rest int) int { return rest },
			}
			for seed := range uint64(20) {
				r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
				cuts["random"+string(rune('a'+seed))] = func(int) int { return 1 + r.IntN(70) }
			}
			_, refusedAt, _ := verdict(t, tc.lim, tc.stream, func(int) int { return 1 })
			for name, cut := range cuts {
				reason, accepted, handshake := verdict(t, tc.lim, tc.stream, cut)
				if reason != wantReason || handshake != wantHandshake {
					t.Errorf("cut %s: verdict %q handshake %v, want %q %v", name, reason, handshake, wantReason, wantHandshake)
				}
				if reason != "" && accepted > refusedAt {
					t.Errorf("cut %s: accepted %d bytes, but the stream breaks at byte %d", name, accepted, refusedAt)
				}
			}
		})
	}
}

// checkFramesWithinCap walks an accepted prefix the plain way, independently
// of FrameGuard, and fails on any frame header in it announcing more than
// maxFrame bytes.
func checkFramesWithinCap(t *testing.T, accepted []byte, maxFrame int64) {
	if len(accepted) <= greetingLen {
		return
	}
	p := accepted[greetingLen:]
	for len(p) >= 2 {
		flags := p[0]
		var size uint64
		var hdr int
		if flags&flagLong != 0 {
			if len(p) < 9 {
				return
			}
			size, hdr = binary.BigEndian.Uint64(p[1:9]), 9
		} else {
			size, hdr = uint64(p[1]), 2
		}
		if size > uint64(maxFrame) {
			t.Fatalf("accepted a frame header announcing %d bytes, cap %d", size, maxFrame)
		}
		if uint64(len(p)-hdr) < size {
			return
		}
		p = p[hdr+int(size):]
	}
}

func FuzzFrameGuard(f *testing.F) {
	for _, tc := range guardCases() {
		f.Add(tc.stream, uint16(tc.lim.MaxFrame), uint8(tc.lim.MaxFrames), uint64(0))
	}
	f.Fuzz(func(t *testing.T, stream []byte, maxFrame uint16, maxFrames uint8, seed uint64) {
		lim := Limits{MaxFrame: int64(maxFrame) + 1, MaxFrames: int(maxFrames % 8)}
		reason, accepted, handshake := verdict(t, lim, stream, func(int) int { return 1 })
		checkFramesWithinCap(t, stream[:accepted], lim.MaxFrame)

		r := rand.New(rand.NewPCG(seed, seed>>1|1))
		for name, cut := range map[string]func(int) int{
			"greedy": func(rest int) int { return rest },
			"random": func(int) int { return 1 + r.IntN(80) },
		} {
			gotReason, gotAccepted, gotHandshake := verdict(t, lim, stream, cut)
			if gotReason != reason || gotHandshake != handshake {
				t.Fatalf("cut %s: verdict %q handshake %v, byte by byte %q %v", name, gotReason, gotHandshake, reason, handshake)
			}
			if gotAccepted > accepted {
				t.Fatalf("cut %s: accepted %d bytes, byte by byte only %d", name, gotAccepted, accepted)
			}
		}
	})
}
