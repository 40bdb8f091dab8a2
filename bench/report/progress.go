package report

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Progress draws a one-line progress bar on w (a terminal's stderr), redrawn
// in place with a carriage return at most every 100 ms.
type Progress struct {
	mu    sync.Mutex
	w     io.Writer
	label string
	start time.Time
	last  time.Time
}

// NewProgress starts a bar labelled label.
func NewProgress(w io.Writer, label string) *Progress {
	now := time.Now()
	return &Progress{w: w, label: label, start: now}
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
