package httpadmin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"unicode/utf8"

	gojson "github.com/goccy/go-json"
)

// maxBodyBytes is Dynamo's REQUEST_BODY_LIMIT_BYTES (8 MiB), applied to every
// route that reads a body; a larger body is a 413, sent so that a client still
// writing its body reads it rather than a reset (tooLarge, oversize.go).
const maxBodyBytes = 8 << 20

// The rejection texts are axum's JsonRejection body texts, which Dynamo wraps in
// its {"error": ...} envelope (415 content type, 400 syntax, 422 shape, 413
// size): clients match on the status and at most on these prefixes; the rest of
// each message is Go's description of the problem in serde's words where that
// is cheap.
const (
	msgContentType = "Expected request with `Content-Type: application/json`"
	prefixSyntax   = "Failed to parse the request body as JSON: "
	prefixShape    = "Failed to deserialize the JSON body into the target type: "
	msgTooLarge    = "Failed to buffer the request body: length limit exceeded"
)

// shapeError is a well-formed body of the wrong shape: 422.
type shapeError struct{ msg string }

func (e *shapeError) Error() string { return e.msg }

func shapef(format string, args ...any) error { return &shapeError{fmt.Sprintf(format, args...)} }

var bodyPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// readJSON is axum's Json extractor: Content-Type (415), size (413), syntax and
// empty body (400), then shape (422) — the decode into dst plus check, which
// holds the wire rules encoding/json cannot express (required fields, enums,
// router_config_override ranges). On failure it has answered the request.
//
// Known differences from serde_json, all on the lenient side and none reachable
// by a client that sends what the API documents: object keys match struct
// fields case-insensitively and the last of duplicate keys wins (serde: unknown
// field ignored / 422); null for a non-optional defaulted field (priority_jump,
// advisory, ...) keeps the default (serde: 422); a lone UTF-16 surrogate escape
// decodes to U+FFFD (serde: 400); nested required fields inside multimodal
// block infos are not enforced.
func (s *server) readJSON(w http.ResponseWriter, r *http.Request, dst any, check func(body []byte) error) bool {
	if !isJSONContentType(r.Header.Get("Content-Type")) {
		refuseUnread(w, r, http.StatusUnsupportedMediaType, msgContentType)
		return false
	}
	if r.ContentLength > maxBodyBytes {
		tooLarge(w, r, 0) // oversize.go: answered, not reset
		return false
	}
	buf := bodyPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer func() {
		if buf.Cap() <= 1<<20 { // do not pin near-limit buffers
			bodyPool.Put(buf)
		}
	}()
	if _, err := buf.ReadFrom(io.LimitReader(r.Body, maxBodyBytes+1)); err != nil {
		writeError(w, http.StatusBadRequest, "Failed to buffer the request body: "+err.Error(), nil)
		return false
	}
	if buf.Len() > maxBodyBytes {
		tooLarge(w, r, int64(buf.Len()))
		return false
	}
	body := buf.Bytes()
	err := decodeBody(body, dst)
	if err == nil && check != nil {
		err = check(body)
	}
	if err != nil {
		if se, ok := errors.AsType[*shapeError](err); ok {
			writeError(w, http.StatusUnprocessableEntity, prefixShape+se.msg, nil)
		} else {
			writeError(w, http.StatusBadRequest, prefixSyntax+err.Error(), nil)
		}
		return false
	}
	return true
}

// isJSONContentType is axum's json_content_type: application/json or any
// application/*+json, parameters allowed.
func isJSONContentType(v string) bool {
	if v == "application/json" {
		return true
	}
	if v == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(v)
	if err != nil {
		return false
	}
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

// decodeBody decodes a JSON object into dst. Syntax problems (empty body,
// malformed or truncated JSON, invalid UTF-8, trailing data) are plain errors
// (400); well-formed JSON that does not fit dst — wrong types, negative or
// overflowing integers (2^63 in an i64 hash, 2^64 in a u64 id), a non-object —
// is a *shapeError (422).
func decodeBody(body []byte, dst any) error {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		line, col := position(body, len(body))
		return fmt.Errorf("EOF while parsing a value at line %d column %d", line, col)
	}
	if !utf8.Valid(body) {
		i := invalidUTF8(body)
		line, col := position(body, i)
		return fmt.Errorf("invalid UTF-8 at line %d column %d", line, col)
	}
	if string(trimmed) == "null" {
		// encoding/json leaves dst alone for a top-level null; serde rejects it.
		return shapef("invalid type: null, expected %s", describe(reflect.TypeOf(dst)))
	}
	// goccy/go-json decodes the common, valid body several times faster than
	// encoding/json (2,048 token ids: the bulk of a /select_and_reserve); on any
	// failure encoding/json decodes again so errors keep its exact positions and
	// the serde-style texts built from them below.
	if gojson.Unmarshal(body, dst) == nil {
		return nil
	}
	err := json.Unmarshal(body, dst)
	if err == nil {
		return nil
	}
	if se, ok := errors.AsType[*json.SyntaxError](err); ok {
		line, col := position(body, int(se.Offset))
		msg := se.Error()
		if msg == "unexpected end of JSON input" {
			msg = "EOF while parsing a value"
		}
		return fmt.Errorf("%s at line %d column %d", msg, line, col)
	}
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		line, col := position(body, int(te.Offset))
		what := "invalid type: " + te.Value
		if n, isNum := strings.CutPrefix(te.Value, "number "); isNum {
			kind := "integer"
			if strings.ContainsAny(n, ".eE") {
				kind = "floating point"
			}
			what = fmt.Sprintf("invalid value: %s `%s`", kind, n)
		}
		field := ""
		if te.Field != "" {
			field = te.Field + ": "
		}
		return shapef("%s%s, expected %s at line %d column %d", field, what, describe(te.Type), line, col)
	}
	return shapef("%v", err)
}

// describe names a Go type the way serde's "expected ..." does.
func describe(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return fmt.Sprintf("u%d", t.Bits())
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return fmt.Sprintf("i%d", t.Bits())
	case reflect.Uint, reflect.Int:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return fmt.Sprintf("f%d", t.Bits())
	case reflect.Bool:
		return "a boolean"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a sequence"
	case reflect.Map:
		return "a map"
	case reflect.Struct:
		return "struct " + t.Name()
	}
	return t.String()
}

// position converts a byte offset into serde's 1-based line and column.
func position(body []byte, off int) (line, col int) {
	off = min(max(off, 0), len(body))
	line = 1 + bytes.Count(body[:off], []byte{'\n'})
	col = off - (bytes.LastIndexByte(body[:off], '\n') + 1)
	return line, col
}

func invalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// required is serde's check of a non-optional field: absent is "missing field",
// null is a type error. raw is what a probe struct captured for the key.
func required(raw json.RawMessage, path, name, want string) error {
	if len(raw) == 0 {
		if path != "" {
			return shapef("%s: missing field `%s`", path, name)
		}
		return shapef("missing field `%s`", name)
	}
	if string(raw) == "null" {
		full := name
		if path != "" {
			full = path + "." + name
		}
		return shapef("%s: invalid type: null, expected %s", full, want)
	}
	return nil
}

// oneOf is serde's unknown-variant check of a string enum.
func oneOf(v *string, field string, variants ...string) error {
	if v == nil {
		return nil
	}
	for _, x := range variants {
		if *v == x {
			return nil
		}
	}
	return shapef("%s: unknown variant `%s`, expected one of `%s`", field, *v, strings.Join(variants, "`, `"))
}
