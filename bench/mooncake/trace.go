package mooncake

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// BlockTokens is the number of tokens per block in the Mooncake traces.
const BlockTokens = 512

// Request is one line of a Mooncake trace.
type Request struct {
	// Timestamp is the arrival time in milliseconds from the trace start.
	Timestamp int64
	// InputLength and OutputLength are token counts.
	InputLength, OutputLength int
	// HashIDs are the ids of the request's prompt blocks, in order.
	HashIDs []uint64
}

// Arrivals is when each of reqs is sent, from the replay's start: at the
// trace's own times divided by compress, or, with rate > 0, evenly every
// 1/rate seconds (a steady stream of the same requests in the same order).
func Arrivals(reqs []Request, compress, rate float64) func(i int) time.Duration {
	if rate > 0 {
		return func(i int) time.Duration { return time.Duration(float64(i) / rate * float64(time.Second)) }
	}
	return func(i int) time.Duration {
		return time.Duration(float64(time.Duration(reqs[i].Timestamp-reqs[0].Timestamp)*time.Millisecond) / compress)
	}
}

// LineError reports a malformed line of a trace file.
type LineError struct {
	Path string // file name as given to LoadTrace
	Line int    // 1-based line number
	Err  error
}

func (e *LineError) Error() string {
	return fmt.Sprintf("mooncake: %s:%d: %v", e.Path, e.Line, e.Err)
}

func (e *LineError) Unwrap() error { return e.Err }

// traceLine mirrors the JSON of one trace line; pointers detect missing
// fields.
type traceLine struct {
	Timestamp    *int64   `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// maxLine bounds the length of one trace line.
const maxLine = 64 << 20

// LoadTrace reads a Mooncake trace: JSON Lines, one request per line, plain
// or gzip-compressed (detected from the content, whatever the file name).
// Blank lines are skipped. A malformed line yields a *LineError naming the
// file and line. Fields other than timestamp, input_length, output_length
// and hash_ids are ignored; timestamp and hash_ids are required, lengths
// must not be negative.
func LoadTrace(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("mooncake: load trace: %w", err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<16)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("mooncake: load trace %s: %w", path, err)
		}
		defer zr.Close()
		r = zr
	}
	return readTrace(path, r)
}

func readTrace(path string, r io.Reader) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), maxLine)
	var reqs []Request
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		req, err := parseLine(b)
		if err != nil {
			return nil, &LineError{Path: path, Line: line, Err: err}
		}
		reqs = append(reqs, req)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &LineError{Path: path, Line: line + 1, Err: fmt.Errorf("line longer than %d bytes", maxLine)}
		}
		return nil, fmt.Errorf("mooncake: read trace %s after line %d: %w", path, line, err)
	}
	return reqs, nil
}

func parseLine(b []byte) (Request, error) {
	var tl traceLine
	if err := json.Unmarshal(b, &tl); err != nil {
		return Request{}, fmt.Errorf("bad JSON: %w", err)
	}
	switch {
	case tl.Timestamp == nil:
		return Request{}, errors.New(`missing "timestamp"`)
	case tl.HashIDs == nil:
		return Request{}, errors.New(`missing "hash_ids"`)
	case tl.InputLength != nil && *tl.InputLength < 0:
		return Request{}, fmt.Errorf("negative input_length %d", *tl.InputLength)
	case tl.OutputLength != nil && *tl.OutputLength < 0:
		return Request{}, fmt.Errorf("negative output_length %d", *tl.OutputLength)
	}
	req := Request{Timestamp: *tl.Timestamp, HashIDs: tl.HashIDs}
	if tl.InputLength != nil {
		req.InputLength = *tl.InputLength
	}
	if tl.OutputLength != nil {
		req.OutputLength = *tl.OutputLength
	}
	return req, nil
}

// Duplicate returns factor structurally identical copies of the trace with
// disjoint hash-id spaces: copy d adds d*(maxID+1) to every id. Copies of
// one request are adjacent (request 0 copy 0, request 0 copy 1, ...), so
// the arrival order is kept. A factor of 1 or less returns reqs unchanged.
func Duplicate(reqs []Request, factor int) []Request {
	if factor <= 1 {
		return reqs
	}
	var maxID uint64
	for _, r := range reqs {
		for _, id := range r.HashIDs {
			maxID = max(maxID, id)
		}
	}
	base := maxID + 1
	out := make([]Request, 0, len(reqs)*factor)
	for _, r := range reqs {
		for d := range factor {
			c := r
			c.HashIDs = make([]uint64, len(r.HashIDs))
			off := base * uint64(d)
			for i, id := range r.HashIDs {
				c.HashIDs[i] = id + off
			}
			out = append(out, c)
		}
	}
	return out
}
