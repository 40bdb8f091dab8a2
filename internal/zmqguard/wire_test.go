package zmqguard

import (
	"encoding/binary"
)

// Builders of raw ZMTP 3 bytes, for peers the tests play by hand.

// greeting is a 64-byte ZMTP 3.0 greeting for mechanism mech.
func greeting(mech string, asServer byte) []byte {
	g := make([]byte, greetingLen)
	g[0], g[9] = sigFirst, sigLast
	g[versionAt], g[versionAt+1] = 3, 0
	copy(g[mechAt:mechAt+mechLen], mech)
	g[asServerAt] = asServer
	return g
}

// header is a frame header announcing size bytes, in the short form when it
// fits unless long is set.
func header(flags byte, size uint64, long bool) []byte {
	if !long && size <= 255 {
		return []byte{flags, byte(size)}
	}
	h := make([]byte, 9)
	h[0] = flags | flagLong
	binary.BigEndian.PutUint64(h[1:], size)
	return h
}

// frame is one frame carrying body.
func frame(flags byte, body []byte) []byte {
	return append(header(flags, uint64(len(body)), false), body...)
}

// message is a multi-part message: MORE on every frame but the last.
func message(parts ...[]byte) []byte {
	var b []byte
	for i, p := range parts {
		var fl byte
		if i < len(parts)-1 {
			fl = flagMore
		}
		b = append(b, frame(fl, p)...)
	}
	return b
}

// command is a command frame: name-length byte, name, body.
func command(name string, body []byte) []byte {
	b := append([]byte{byte(len(name))}, name...)
	return frame(flagCommand, append(b, body...))
}

// property is one metadata property as READY carries it.
func property(name, value string) []byte {
	b := append([]byte{byte(len(name))}, name...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
	return append(b, value...)
}

// ready is the NULL-mechanism READY command of a socket of type sockType.
func ready(sockType string) []byte {
	return command("READY", append(property("Socket-Type", sockType), property("Identity", "")...))
}

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}
