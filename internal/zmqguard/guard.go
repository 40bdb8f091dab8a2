package zmqguard

import (
	"bytes"
	"fmt"
)

// Reasons a guard drops a peer for, as passed to the onReject callback and
// carried by RejectError. They are short and fixed so that a caller can use
// them as a metric label.
const (
	// ReasonBadGreeting: the first 64 bytes are not a ZMTP 3.x greeting
	// (signature 0xFF … 0x7F, major version 3 or later, as-server 0 or 1).
	ReasonBadGreeting = "bad_greeting"
	// ReasonBadFlags: a frame's flags byte sets a reserved bit, or sets MORE
	// on a command frame (commands are always a single frame).
	ReasonBadFlags = "bad_flags"
	// ReasonOversizedFrame: a frame header announces more bytes than the cap.
	ReasonOversizedFrame = "oversized_frame"
	// ReasonTooManyFrames: a multi-part message goes on for more frames than
	// the cap.
	ReasonTooManyFrames = "too_many_frames"
	// ReasonBadCommand: a command frame is malformed: no name, a name longer
	// than the frame, or handshake metadata whose properties do not add up to
	// the frame's size.
	ReasonBadCommand = "bad_command"
	// ReasonHandshakeTimeout: the peer did not finish its side of the
	// handshake in time (see WithHandshakeTimeout).
	ReasonHandshakeTimeout = "handshake_timeout"
)

// RejectError says why a peer was dropped. It implements net.Error (neither a
// timeout nor temporary) because zmq4 marks a connection closed, and lets its
// reaper remove it, only on io.EOF or a non-timeout net.Error; any other read
// error would leave the dead connection registered with the socket.
type RejectError struct {
	Reason string // one of the Reason constants
	Detail string // what exactly was wrong, for logs
}

func (e *RejectError) Error() string {
	if e.Detail == "" {
		return "zmqguard: peer rejected: " + e.Reason
	}
	return "zmqguard: peer rejected: " + e.Reason + ": " + e.Detail
}

// Timeout reports false: a rejection is final even when a deadline caused it.
func (e *RejectError) Timeout() bool { return false }

// Temporary reports false: retrying the read cannot succeed.
func (e *RejectError) Temporary() bool { return false }

// Limits are the caps a FrameGuard enforces.
type Limits struct {
	// MaxFrame is the largest frame body, in bytes, a peer may announce.
	// It applies to command frames too, so it must leave room for the
	// handshake's READY command (a few dozen bytes).
	MaxFrame int64
	// MaxFrames is the most frames one multi-part message may have; 0 means
	// no cap. zmq4 keeps every frame of a message until its last one arrives,
	// so MaxFrames*MaxFrame bounds what one message can make it hold.
	MaxFrames int
}

// ZMTP 3 wire constants (https://rfc.zeromq.org/spec/23/).
const (
	greetingLen = 64
	sigFirst    = 0xFF // greeting byte 0
	sigLast     = 0x7F // greeting byte 9
	versionAt   = 10   // major version; the minor one follows
	mechAt      = 12   // 20 bytes, NUL-padded
	mechLen     = 20
	asServerAt  = 32

	flagMore     = 0x01
	flagLong     = 0x02
	flagCommand  = 0x04
	flagReserved = 0xF8
)

type phase uint8

const (
	phaseGreeting phase = iota
	phaseFlags
	phaseSize
	phaseBody
	phaseRejected
)

// cmdState is where a command body's parse stands. Only the name is parsed
// for every command; the body after it is read as metadata properties
// (name-length byte, name, 4-byte big-endian value length, value) when the
// command is one zmq4 decodes that way, and skipped otherwise.
type cmdState uint8

const (
	cmdNameLen cmdState = iota
	cmdName
	cmdOpaque
	propNameLen
	propName
	propValueLen
	propValue
)

// FrameGuard follows one connection's inbound byte stream as ZMTP 3 — the
// greeting, then frames — and refuses it at the first byte that breaks the
// framing or a limit. It does no I/O and holds no more than a few counters, so
// it accepts a stream cut into chunks of any size, down to one byte, with the
// same verdict. It is not safe for concurrent use.
type FrameGuard struct {
	lim   Limits
	phase phase
	err   *RejectError

	// greeting
	pos  int // greeting bytes seen
	mech [mechLen]byte

	// current frame
	flags     byte
	size      uint64 // announced body size, being assembled in phaseSize
	sizeBytes int    // size bytes still to come
	remaining uint64 // body bytes still to come
	msgFrames int    // frames of the current multi-part message so far

	// current command frame
	cmd      cmdState
	field    uint64 // bytes left of the name, property name or value; or value-length bytes left
	valueLen uint32 // a property value's length, being assembled
	name     [8]byte
	nameLen  int

	handshakeDone bool
}

// NewFrameGuard returns a guard at the start of a connection. A MaxFrame
// below zero counts as zero.
func NewFrameGuard(lim Limits) *FrameGuard {
	return &FrameGuard{lim: lim}
}

// HandshakeDone reports whether the peer has sent the command that ends its
// side of the ZMTP handshake: READY (NULL mechanism, or a PLAIN server) or
// INITIATE (a PLAIN or CURVE client).
func (g *FrameGuard) HandshakeDone() bool { return g.handshakeDone }

// Feed takes the next bytes of the stream. It returns nil when all of p is
// well-formed so far, and otherwise a *RejectError; the chunk is then refused
// whole (the caller must not pass any of it on), and every later call returns
// the same error.
func (g *FrameGuard) Feed(p []byte) error {
	if rej := g.feed(p); rej != nil {
		return rej
	}
	return nil
}

func (g *FrameGuard) feed(p []byte) *RejectError {
	for len(p) > 0 && g.phase != phaseRejected {
		switch g.phase {
		case phaseGreeting:
			p = g.feedGreeting(p)
		case phaseFlags:
			g.feedFlags(p[0])
			p = p[1:]
		case phaseSize:
			g.size = g.size<<8 | uint64(p[0])
			p = p[1:]
			if g.sizeBytes--; g.sizeBytes == 0 {
				g.startBody()
			}
		case phaseBody:
			n := uint64(len(p))
			if n > g.remaining {
				n = g.remaining
			}
			if g.flags&flagCommand != 0 {
				g.feedCommand(p[:n])
			}
			p = p[n:]
			g.remaining -= n
			if g.remaining == 0 && g.phase == phaseBody {
				g.endFrame()
			}
		}
	}
	return g.err
}

func (g *FrameGuard) reject(reason, format string, args ...any) {
	g.phase = phaseRejected
	g.err = &RejectError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

func (g *FrameGuard) feedGreeting(p []byte) []byte {
	for len(p) > 0 && g.pos < greetingLen {
		b := p[0]
		switch at := g.pos; {
		case at == 0 && b != sigFirst:
			g.reject(ReasonBadGreeting, "signature starts with %#02x, want %#02x", b, sigFirst)
			return nil
		case at == 9 && b != sigLast:
			g.reject(ReasonBadGreeting, "signature ends with %#02x, want %#02x", b, sigLast)
			return nil
		case at == versionAt && b < 3:
			// Older peers would need ZMTP version negotiation, which zmq4
			// does not do: it refuses them as well.
			g.reject(ReasonBadGreeting, "ZMTP major version %d, want 3 or later", b)
			return nil
		case at >= mechAt && at < mechAt+mechLen:
			g.mech[at-mechAt] = b
		case at == asServerAt && b > 1:
			g.reject(ReasonBadGreeting, "as-server byte %#02x, want 0 or 1", b)
			return nil
		}
		g.pos++
		p = p[1:]
	}
	if g.pos == greetingLen {
		g.phase = phaseFlags
	}
	return p
}

func (g *FrameGuard) mechanism() string {
	m, _, _ := bytes.Cut(g.mech[:], []byte{0})
	return string(m)
}

func (g *FrameGuard) feedFlags(b byte) {
	switch {
	case b&flagReserved != 0:
		g.reject(ReasonBadFlags, "flags %#02x set reserved bits", b)
		return
	case b&flagCommand != 0 && b&flagMore != 0:
		g.reject(ReasonBadFlags, "command frame with MORE set")
		return
	}
	g.msgFrames++
	if g.lim.MaxFrames > 0 && g.msgFrames > g.lim.MaxFrames {
		g.reject(ReasonTooManyFrames, "message goes past %d frames", g.lim.MaxFrames)
		return
	}
	if b&flagMore == 0 {
		g.msgFrames = 0 // this frame is the message's last
	}
	g.flags = b
	g.size = 0
	g.sizeBytes = 1
	if b&flagLong != 0 {
		g.sizeBytes = 8
	}
	g.phase = phaseSize
}

// startBody runs once the size is known: the cap is checked before any of
// the body is let through, so a reader never gets to allocate for it.
func (g *FrameGuard) startBody() {
	if g.size > uint64(max(g.lim.MaxFrame, 0)) {
		g.reject(ReasonOversizedFrame, "frame of %d bytes announced, cap %d", g.size, g.lim.MaxFrame)
		return
	}
	g.remaining = g.size
	g.phase = phaseBody
	if g.flags&flagCommand != 0 {
		g.cmd, g.field, g.nameLen = cmdNameLen, 0, 0
	}
	if g.remaining == 0 {
		g.endFrame()
	}
}

func (g *FrameGuard) endFrame() {
	g.phase = phaseFlags
	if g.flags&flagCommand == 0 {
		return
	}
	switch g.cmd {
	case cmdNameLen, cmdName:
		g.reject(ReasonBadCommand, "command frame of %d bytes has no complete name", g.size)
		return
	case propNameLen, cmdOpaque:
		// complete
	default:
		g.reject(ReasonBadCommand, "%s command of %d bytes ends inside a metadata property", g.cmdName(), g.size)
		return
	}
	switch g.cmdName() {
	case "READY", "INITIATE":
		g.handshakeDone = true
	}
}

// cmdName is the current command's name when it is one the guard tells apart
// (none is longer than 8 bytes), and "" otherwise.
func (g *FrameGuard) cmdName() string {
	if g.nameLen > len(g.name) {
		return ""
	}
	return string(g.name[:g.nameLen])
}

// feedCommand parses p, which lies within the current command's body.
func (g *FrameGuard) feedCommand(p []byte) {
	for len(p) > 0 {
		switch g.cmd {
		case cmdNameLen:
			n := int(p[0])
			p = p[1:]
			if n == 0 || uint64(n) >= g.size {
				g.reject(ReasonBadCommand, "command name of %d bytes in a frame of %d", n, g.size)
				return
			}
			g.nameLen, g.field, g.cmd = n, uint64(n), cmdName
		case cmdName:
			at := g.nameLen - int(g.field)
			for len(p) > 0 && g.field > 0 {
				if at < len(g.name) {
					g.name[at] = p[0]
				}
				at++
				g.field--
				p = p[1:]
			}
			if g.field == 0 {
				g.cmd = cmdOpaque
				if g.carriesMetadata() {
					g.cmd = propNameLen
				}
			}
		case cmdOpaque:
			return
		case propNameLen:
			g.field, g.cmd = uint64(p[0]), propName
			p = p[1:]
			if g.field == 0 {
				g.field, g.cmd = 4, propValueLen
			}
		case propName:
			n := min(g.field, uint64(len(p)))
			g.field -= n
			p = p[n:]
			if g.field == 0 {
				g.field, g.cmd = 4, propValueLen
			}
		case propValueLen:
			g.valueLen = g.valueLen<<8 | uint32(p[0])
			p = p[1:]
			if g.field--; g.field == 0 {
				g.field, g.cmd, g.valueLen = uint64(g.valueLen), propValue, 0
				if g.field == 0 {
					g.cmd = propNameLen
				}
			}
		case propValue:
			n := min(g.field, uint64(len(p)))
			g.field -= n
			p = p[n:]
			if g.field == 0 {
				g.cmd = propNameLen
			}
		}
	}
}

// carriesMetadata reports whether zmq4 decodes the body after this command's
// name as properties: READY under NULL and PLAIN, INITIATE under PLAIN. (Under
// CURVE both are encrypted boxes.) zmq4's property decoder trusts the lengths
// it reads and panics on a list that ends inside a property, so such a body
// must never reach it.
func (g *FrameGuard) carriesMetadata() bool {
	switch mech, name := g.mechanism(), g.cmdName(); {
	case name == "READY":
		return mech == "NULL" || mech == "PLAIN"
	case name == "INITIATE":
		return mech == "PLAIN"
	}
	return false
}
