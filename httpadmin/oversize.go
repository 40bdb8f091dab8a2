package httpadmin

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Bounds of the drain after a 413 on an HTTP/1.x connection (tooLarge), or
// another refusal of a large body left unread (refuseUnread). A
// client that does not wait for 100 Continue — Python's urllib, requests,
// most scripts — writes its whole body before it reads anything. If the
// server closes the socket with some of that body still unread, the kernel
// answers with a TCP RST, and the client sees "connection reset by peer"
// while still writing instead of the 413 it was sent. Reading the rest of the
// body after the answer lets the client finish writing and read it. The
// bounds keep a client from holding the handler forever or making the server
// read without end: 64 MiB is eight times the body limit, so any plausible
// mistake (a prompt a few times too large) is drained, and 10 s lets a slow
// client on a slow link send it. Past either bound the connection is closed
// and the client may be reset after all: it was not going to stop.
const (
	oversizeDrainBytes = 64 << 20
	oversizeDrainTime  = 10 * time.Second
)

// netHTTPDrains is how much of an unread body net/http reads by itself after
// a handler returns, to keep the connection (its maxPostHandlerReadBytes).
const netHTTPDrains = 256 << 10

// refuseUnread answers status {"error": msg} to a request whose body is
// refused unread (no route, wrong method, credentials, content type). A body
// net/http would not drain by itself — a larger Content-Length, or a chunked
// one — goes through answerAndDrain: a client still writing it would
// otherwise see a reset instead of the answer.
func refuseUnread(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if r.Body != nil && r.Body != http.NoBody && (r.ContentLength < 0 || r.ContentLength > netHTTPDrains) {
		answerAndDrain(w, r, status, msg, 0)
		return
	}
	writeError(w, status, msg, nil)
}

// tooLarge answers 413 {"error": msgTooLarge} (answerAndDrain).
func tooLarge(w http.ResponseWriter, r *http.Request, consumed int64) {
	answerAndDrain(w, r, http.StatusRequestEntityTooLarge, msgTooLarge, consumed)
}

// answerAndDrain answers status {"error": msg} to a request whose body the
// handler will not read in full. consumed is how many body
// bytes the handler read before it gave up: 0 when Content-Length alone was
// over the limit. Then, if the client asked for 100-continue, it is waiting
// and has sent nothing, so the ordinary answer is already graceful.
//
// On an HTTP/1.x connection that may hold unread body bytes it hijacks the
// connection and does what net/http's own close does not: answers with
// Connection: close, half-closes the write side (the client sees the end of
// the answer), drains the rest of the request — up to its Content-Length when
// it has one, so the connection closes as soon as the body is in, else until
// the client closes — within oversizeDrainBytes and oversizeDrainTime, and
// only then closes. HTTP/2 resets just the stream, which costs nothing, so it
// gets the ordinary answer, as does a writer that cannot be hijacked (a
// middleware's wrapper without Unwrap).
func answerAndDrain(w http.ResponseWriter, r *http.Request, status int, msg string, consumed int64) {
	if r.ProtoMajor != 1 || (consumed == 0 && strings.EqualFold(r.Header.Get("Expect"), "100-continue")) {
		writeError(w, status, msg, nil)
		return
	}
	// The same status, Content-Type and body writeError sends; the headers
	// middleware set before the handler ran go along, as they would have.
	h := w.Header().Clone()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		writeError(w, status, msg, nil)
		return
	}
	defer conn.Close()
	body := errorJSON(msg)
	for _, k := range []string{"Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive", "Trailer"} {
		h.Del(k)
	}
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Connection", "close")
	if _, ok := h["Date"]; !ok {
		h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	}
	_ = conn.SetWriteDeadline(time.Now().Add(oversizeDrainTime))
	bw := brw.Writer
	bw.WriteString("HTTP/1.1 " + strconv.Itoa(status) + " " + http.StatusText(status) + "\r\n")
	_ = h.Write(bw)
	bw.WriteString("\r\n")
	bw.Write(body)
	if bw.Flush() != nil {
		return // the client is gone: nothing to drain for
	}
	closeWrite(conn)
	_ = conn.SetReadDeadline(time.Now().Add(oversizeDrainTime))
	limit := int64(oversizeDrainBytes)
	if r.ContentLength > 0 {
		limit = min(limit, r.ContentLength-consumed)
	}
	// brw.Reader, not conn: it may hold body bytes net/http had buffered.
	_, _ = io.CopyN(io.Discard, brw.Reader, limit)
}

// closeWrite sends the end of the answer while the read side stays open. On
// TLS, tls.Conn.CloseWrite sends close_notify but leaves TCP alone, so the
// underlying connection is half-closed too: a client that ignores close_notify
// still sees EOF.
func closeWrite(conn net.Conn) {
	type closeWriter interface{ CloseWrite() error }
	if tc, ok := conn.(*tls.Conn); ok {
		_ = tc.CloseWrite()
		conn = tc.NetConn()
	}
	if cw, ok := conn.(closeWriter); ok {
		_ = cw.CloseWrite()
	}
}

// errorJSON is writeError's body for msg: the errorBody envelope, HTML not
// escaped and no trailing newline, as writeJSON encodes it.
func errorJSON(msg string) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(errorBody{Error: msg}) // a string field cannot fail
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'})
}
