package report

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Progress draws a one-line progress bar on w. On a terminal it is redrawn
// in place with a carriage return at most every 100 ms; anywhere else (a CI
// log, a file, a pipe) it prints a plain line at most every NonTTYEvery, so
// logs get a few lines instead of thousands of carriage returns.
type Progress struct {
	mu    sync.Mutex
	w     io.Writer
	label string
	start time.Time
	last  time.Time
	tty   bool
}

// NonTTYEvery is how often a Progress that is not on a terminal prints.
const NonTTYEvery = 5 * time.Second

// NewProgress starts a bar labelled label.
func NewProgress(w io.Writer, label string) *Progress {
	now := time.Now()
	return &Progress{w: w, label: label, start: now, last: now, tty: isTerminal(w)}
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Update redraws the bar for done of total; the final call (done == total)
// always draws and ends the line.
func (p *Progress) Update(done, total int) {
	if p == nil || p.w == nil || total <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	final := done >= total
	if !p.tty {
		if !final && now.Sub(p.last) < NonTTYEvery {
			return
		}
		p.last = now
		fmt.Fprintf(p.w, "%s: %d/%d (%d%%) after %.1fs\n", p.label, done, total, done*100/total, now.Sub(p.start).Seconds())
		return
	}
	if !final && now.Sub(p.last) < 100*time.Millisecond {
		return
	}
	p.last = now
	const width = 30
	filled := min(width, done*width/total)
	bar := strings.Repeat("█", filled) + strings.Repeat("·", width-filled)
	fmt.Fprintf(p.w, "\r%-28s %s %3d%% %d/%d %5.1fs", p.label, bar, done*100/total, done, total, now.Sub(p.start).Seconds())
	if final {
		fmt.Fprintln(p.w)
	}
}
