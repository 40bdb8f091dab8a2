// Package filewatch tells whether files changed, by their size and
// modification time, looked at no more than once per interval. The TLS
// certificates, client CA bundles and token files kvselect re-reads are
// checked this way, by the request or handshake that finds the interval over:
// no goroutine watches them, and a Kubernetes Secret volume's update (a
// symlink swapped to a new directory, which os.Stat follows) shows as a
// change.
package filewatch

import (
	"os"
	"slices"
	"time"
)

// stamp identifies a version of a file without reading it. A missing file is
// a state too: its return is a change.
type stamp struct {
	mod  time.Time
	size int64
	err  string
}

func stampOf(path string) stamp {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{err: err.Error()}
	}
	return stamp{mod: fi.ModTime(), size: fi.Size()}
}

// Watch remembers the files' stamps at the last look. It is not safe for
// concurrent use: its owner serializes calls.
type Watch struct {
	paths   []string
	every   time.Duration
	seen    []stamp
	checked time.Time
}

// New takes the files' stamps now. Call it before reading the files: a change
// racing the read then shows as a new stamp at the next look, and the files
// are read again.
func New(every time.Duration, now time.Time, paths ...string) *Watch {
	w := &Watch{paths: slices.Clone(paths), every: every, checked: now}
	w.seen = w.stamps()
	return w
}

func (w *Watch) stamps() []stamp {
	st := make([]stamp, len(w.paths))
	for i, p := range w.paths {
		st[i] = stampOf(p)
	}
	return st
}

// Changed reports whether the interval since the last look is over and the
// stamps differ from that look's, which it then remembers: each new version
// is reported once, whether or not the caller manages to read it.
func (w *Watch) Changed(now time.Time) bool {
	if now.Sub(w.checked) < w.every {
		return false
	}
	w.checked = now
	st := w.stamps()
	if slices.Equal(st, w.seen) {
		return false
	}
	w.seen = st
	return true
}
