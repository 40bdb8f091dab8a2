// Package flow is the flow controller of a saturated partition: the order in
// which waiting requests get to the workers, and which requests are not let
// wait at all.
//
// Requests wait in priority bands, the highest first (strict priority, as in
// the Gateway API Inference Extension, where the priority comes from the
// InferenceObjective a request names). Inside a band the tenants (GIE's
// x-gateway-inference-fairness-id) share the pool fairly by start-time fair
// queueing (Goyal, Vin and Cheng, SIGCOMM 1996): each tenant's head of line
// carries a start tag S = max(V, F), F being the finish tag of the tenant's
// last dispatched request and V the band's virtual time (the start tag of the
// request dispatched last); the smallest start tag goes first, and
// dispatching a request of cost c sets F = S + c. With cost fairness c is the
// request's real cost — uncached prompt tokens plus expected output tokens —
// so a tenant sending 32k-token prompts gets the same token throughput as one
// sending 500-token prompts, not 64 times more; with count fairness c is 1;
// with FIFO the band is one queue in arrival order. Inside a tenant requests
// go first in, first out.
//
// The controller is a plain data structure, deterministic and not safe for
// concurrent use: the caller holds a lock, passes the time in, and decides
// when the head may leave (when a worker has room). Limits: queued bytes per
// band and in total (Push refuses what does not fit), a time to live that the
// caller enforces with Expired, and a bound on the tenants remembered (an idle
// tenant's finish tag is remembered while its band is busy, so that leaving
// and coming back buys no head start; past the bound the longest-idle tenant
// is forgotten).
package flow

import (
	"cmp"
	"container/heap"
	"container/list"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Fairness is how a band shares the pool between its tenants.
type Fairness uint8

const (
	// FairnessCost shares tokens: a request's cost is its uncached prompt
	// tokens plus its expected output tokens.
	FairnessCost Fairness = iota
	// FairnessCount shares requests: every request costs 1.
	FairnessCount
	// FairnessFIFO does not share: one queue in arrival order per band.
	FairnessFIFO
)

var fairnessNames = [...]string{FairnessCost: "cost", FairnessCount: "count", FairnessFIFO: "fifo"}

func (f Fairness) String() string {
	if int(f) < len(fairnessNames) {
		return fairnessNames[f]
	}
	return fmt.Sprintf("Fairness(%d)", uint8(f))
}

// ParseFairness parses cost, count or fifo.
func ParseFairness(s string) (Fairness, error) {
	for f, name := range fairnessNames {
		if s == name {
			return Fairness(f), nil
		}
	}
	return 0, fmt.Errorf("unknown fairness %q (want cost, count or fifo)", s)
}

// Defaults and bounds.
const (
	// DefaultTenant is the tenant of a request that names none: GIE's
	// default flow id.
	DefaultTenant = "default-flow"
	// DefaultTTL is how long a request may wait.
	DefaultTTL = 30 * time.Second
	// DefaultMaxTenants bounds the tenants remembered per partition.
	DefaultMaxTenants = 10000
	// MaxTenantLen is the longest tenant id accepted (bytes).
	MaxTenantLen = 256
	// MinPriority and MaxPriority bound a request's priority.
	MinPriority, MaxPriority = -1_000_000, 1_000_000
)

// Errors of Push; the fronts answer them with 429.
var (
	ErrQueueFull      = errors.New("flow control: the queue is full")
	ErrTooManyTenants = errors.New("flow control: too many tenants are waiting")
)

// Config configures a Controller. The zero value is cost fairness, the
// default TTL and tenant bound, and no byte limit.
type Config struct {
	Fairness Fairness
	// TTL is how long a request may wait (DefaultTTL when 0).
	TTL time.Duration
	// MaxBytes bounds the bytes queued in all bands together, MaxBandBytes
	// those queued in one band; 0 is no bound.
	MaxBytes, MaxBandBytes int64
	// MaxTenants bounds the tenants remembered (DefaultMaxTenants when 0).
	MaxTenants int
}

// WithDefaults fills in the defaults of unset fields.
func (c Config) WithDefaults() Config {
	if c.TTL <= 0 {
		c.TTL = DefaultTTL
	}
	if c.MaxTenants <= 0 {
		c.MaxTenants = DefaultMaxTenants
	}
	return c
}

// Validate reports a configuration no controller should run with.
func (c Config) Validate() error {
	var errs []error
	if c.Fairness > FairnessFIFO {
		errs = append(errs, fmt.Errorf("unknown fairness %d", c.Fairness))
	}
	if c.TTL < 0 {
		errs = append(errs, fmt.Errorf("negative queue TTL %v", c.TTL))
	}
	if c.MaxBytes < 0 || c.MaxBandBytes < 0 {
		errs = append(errs, errors.New("negative queue byte limit"))
	}
	if c.MaxTenants < 0 {
		errs = append(errs, fmt.Errorf("negative tenant bound %d", c.MaxTenants))
	}
	return errors.Join(errs...)
}

// Request is what the controller knows of a waiting request.
type Request struct {
	// Priority is the band; higher goes first. Negative is sheddable: the
	// caller rejects it rather than queueing it (Sheddable).
	Priority int
	// Tenant shares its band fairly with the others ("" is DefaultTenant).
	Tenant string
	// Cost is the request's work in tokens (FairnessCost; at least 1 counts).
	Cost int64
	// Bytes counts against the byte limits.
	Bytes int64
	// ISL is the prompt length, summed for the partition's pending figures.
	ISL int
}

// Sheddable reports whether a request of priority p is rejected rather than
// queued when the pool is saturated (GIE: a negative priority).
func Sheddable(p int) bool { return p < 0 }

// Ticket is a waiting request's place in the controller.
type Ticket struct {
	req      Request
	enqueued time.Time
	seq      uint64
	ten      *tenant
	elem     *list.Element // in ten.fifo; nil once removed
	expired  bool          // removed by Expire
}

// Expired reports whether Expire removed t.
func (t *Ticket) Expired() bool { return t.expired }

// Request returns what the ticket was pushed with (the tenant resolved).
func (t *Ticket) Request() Request { return t.req }

// Enqueued is when the ticket was pushed.
func (t *Ticket) Enqueued() time.Time { return t.enqueued }

// tenant is one tenant of one band.
type tenant struct {
	name   string
	b      *band
	fifo   list.List // *Ticket, oldest first
	finish float64   // F of the last dispatched request
	start  float64   // S of the head of line, while queued
	idx    int       // in b.active; -1 while idle
	idle   *list.Element
}

// band is one priority's queue.
type band struct {
	priority int
	vtime    float64
	tenants  map[string]*tenant
	active   tenantHeap // tenants with queued requests, by (start, head seq)
	n        int
	bytes    int64
}

// Controller orders the waiting requests of one partition.
type Controller struct {
	cfg     Config
	bands   map[int]*band
	order   []int     // priorities with a band, highest first
	idle    list.List // *tenant with nothing queued, longest idle first
	tenants int
	n       int
	bytes   int64
	isl     int
	seq     uint64
	evicted uint64
}

// New returns an empty controller; cfg must be valid.
func New(cfg Config) *Controller {
	return &Controller{cfg: cfg.WithDefaults(), bands: make(map[int]*band)}
}

// Config is the controller's configuration, defaults filled in.
func (c *Controller) Config() Config { return c.cfg }

// Len is the number of waiting requests.
func (c *Controller) Len() int { return c.n }

// PendingISL is the waiting requests' total prompt length.
func (c *Controller) PendingISL() int { return c.isl }

// Evicted counts the idle tenants forgotten to keep within MaxTenants.
func (c *Controller) Evicted() uint64 { return c.evicted }

// Push queues r at now. It fails, changing nothing, when r's bytes do not
// fit (ErrQueueFull) or MaxTenants tenants are waiting already
// (ErrTooManyTenants).
func (c *Controller) Push(now time.Time, r Request) (*Ticket, error) {
	if r.Tenant == "" {
		r.Tenant = DefaultTenant
	}
	r.Cost = max(r.Cost, 1)
	r.Bytes = max(r.Bytes, 0)
	b := c.bands[r.Priority]
	if c.cfg.MaxBandBytes > 0 && b != nil && b.bytes+r.Bytes > c.cfg.MaxBandBytes {
		return nil, fmt.Errorf("%w: %d bytes queued at priority %d, %d more would pass the limit of %d",
			ErrQueueFull, b.bytes, r.Priority, r.Bytes, c.cfg.MaxBandBytes)
	}
	if c.cfg.MaxBandBytes > 0 && b == nil && r.Bytes > c.cfg.MaxBandBytes {
		return nil, fmt.Errorf("%w: %d bytes pass the per-priority limit of %d", ErrQueueFull, r.Bytes, c.cfg.MaxBandBytes)
	}
	if c.cfg.MaxBytes > 0 && c.bytes+r.Bytes > c.cfg.MaxBytes {
		return nil, fmt.Errorf("%w: %d bytes queued, %d more would pass the limit of %d", ErrQueueFull, c.bytes, r.Bytes, c.cfg.MaxBytes)
	}
	var t *tenant
	if b != nil {
		t = b.tenants[r.Tenant]
	}
	if t == nil {
		if c.tenants >= c.cfg.MaxTenants && !c.evictIdle() {
			return nil, fmt.Errorf("%w: %d tenants have requests queued", ErrTooManyTenants, c.tenants)
		}
		if b == nil {
			b = c.addBand(r.Priority)
		}
		t = &tenant{name: r.Tenant, b: b, idx: -1}
		b.tenants[r.Tenant] = t
		c.tenants++
	}
	tk := &Ticket{req: r, enqueued: now, seq: c.seq, ten: t}
	c.seq++
	tk.elem = t.fifo.PushBack(tk)
	if t.fifo.Len() == 1 {
		if t.idle != nil {
			c.idle.Remove(t.idle)
			t.idle = nil
		}
		t.start = max(b.vtime, t.finish)
		heap.Push(&b.active, t)
	}
	b.n++
	b.bytes += r.Bytes
	c.n++
	c.bytes += r.Bytes
	c.isl += r.ISL
	return tk, nil
}

func (c *Controller) addBand(p int) *band {
	b := &band{priority: p, tenants: make(map[string]*tenant)}
	c.bands[p] = b
	i, _ := slices.BinarySearchFunc(c.order, p, func(a, p int) int { return p - a }) // descending
	c.order = slices.Insert(c.order, i, p)
	return b
}

// evictIdle forgets the longest-idle tenant; false when every tenant has
// requests queued.
func (c *Controller) evictIdle() bool {
	e := c.idle.Front()
	if e == nil {
		return false
	}
	c.forget(e.Value.(*tenant))
	c.evicted++
	return true
}

func (c *Controller) forget(t *tenant) {
	if t.idle != nil {
		c.idle.Remove(t.idle)
		t.idle = nil
	}
	delete(t.b.tenants, t.name)
	c.tenants--
	if len(t.b.tenants) == 0 {
		c.dropBand(t.b)
	}
}

func (c *Controller) dropBand(b *band) {
	delete(c.bands, b.priority)
	if i := slices.Index(c.order, b.priority); i >= 0 {
		c.order = slices.Delete(c.order, i, i+1)
	}
}

// Head is the request that goes next: the highest band's tenant with the
// smallest start tag, its oldest request. Nil when nothing waits.
func (c *Controller) Head() *Ticket {
	for _, p := range c.order {
		if b := c.bands[p]; b.n > 0 {
			return b.active[0].fifo.Front().Value.(*Ticket)
		}
	}
	return nil
}

// Expired reports whether t has waited its TTL at now.
func (c *Controller) Expired(t *Ticket, now time.Time) bool {
	return now.Sub(t.enqueued) >= c.cfg.TTL
}

// Deadline is when t's TTL runs out.
func (c *Controller) Deadline(t *Ticket) time.Time { return t.enqueued.Add(c.cfg.TTL) }

// Expire removes every request that has waited its TTL at now, charging
// nobody, marks it (Ticket.Expired) and returns how many there were. A
// tenant's requests are in arrival order, so only the expired prefix of
// each tenant is visited.
func (c *Controller) Expire(now time.Time) int {
	var out []*Ticket
	for _, b := range c.bands {
		for _, t := range b.tenants {
			for e := t.fifo.Front(); e != nil; e = e.Next() {
				tk := e.Value.(*Ticket)
				if !c.Expired(tk, now) {
					break
				}
				out = append(out, tk)
			}
		}
	}
	for _, tk := range out {
		c.remove(tk, false)
		tk.expired = true
	}
	return len(out)
}

// Dispatch removes t, which goes to a worker: its band's virtual time and its
// tenant's finish tag advance (only a head of line is dispatched in order;
// dispatching another request is allowed and charges its tenant the same).
func (c *Controller) Dispatch(t *Ticket) { c.remove(t, true) }

// Abandon removes t, which will not run (its client left, its TTL ran out):
// nobody is charged for it.
func (c *Controller) Abandon(t *Ticket) { c.remove(t, false) }

func (c *Controller) remove(tk *Ticket, dispatched bool) {
	if tk.elem == nil {
		return
	}
	t := tk.ten
	b := t.b
	head := t.fifo.Front() == tk.elem
	t.fifo.Remove(tk.elem)
	tk.elem = nil
	if dispatched {
		start := t.start
		if !head {
			start = max(b.vtime, t.finish)
		}
		b.vtime = max(b.vtime, start)
		t.finish = start + c.charge(tk.req)
	}
	b.n--
	b.bytes -= tk.req.Bytes
	c.n--
	c.bytes -= tk.req.Bytes
	c.isl -= tk.req.ISL
	switch {
	case t.fifo.Len() == 0:
		heap.Remove(&b.active, t.idx)
		if b.n == 0 {
			// The band's busy period is over: virtual time and every
			// tenant's tags start afresh with the next request.
			for _, o := range b.tenants {
				if o.idle != nil {
					c.idle.Remove(o.idle)
					o.idle = nil
				}
			}
			c.tenants -= len(b.tenants)
			c.dropBand(b)
			return
		}
		t.idle = c.idle.PushBack(t)
	case head:
		t.start = max(b.vtime, t.finish)
		heap.Fix(&b.active, t.idx)
	}
}

func (c *Controller) charge(r Request) float64 {
	switch c.cfg.Fairness {
	case FairnessCount:
		return 1
	case FairnessFIFO:
		return 0
	}
	return float64(r.Cost)
}

// tenantHeap orders a band's waiting tenants by their head's start tag, then
// by the head's arrival. With FIFO fairness every tag is 0 and arrival alone
// orders.
type tenantHeap []*tenant

func (h tenantHeap) Len() int { return len(h) }
func (h tenantHeap) Less(i, j int) bool {
	if h[i].start != h[j].start {
		return h[i].start < h[j].start
	}
	return h[i].fifo.Front().Value.(*Ticket).seq < h[j].fifo.Front().Value.(*Ticket).seq
}
func (h tenantHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *tenantHeap) Push(x any) {
	t := x.(*tenant)
	t.idx = len(*h)
	*h = append(*h, t)
}
func (h *tenantHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.idx = -1
	return t
}

// State is a snapshot of the waiting requests, for GET /flow and metrics.
type State struct {
	Fairness       string      `json:"fairness"`
	Queued         int         `json:"queued"`
	QueuedBytes    int64       `json:"queued_bytes"`
	Tenants        int         `json:"tenants"`
	EvictedTenants uint64      `json:"evicted_tenants"`
	Bands          []BandState `json:"bands"`
}

// BandState is one priority band.
type BandState struct {
	Priority    int           `json:"priority"`
	Queued      int           `json:"queued"`
	QueuedBytes int64         `json:"queued_bytes"`
	VirtualTime float64       `json:"virtual_time"`
	Tenants     []TenantState `json:"tenants"`
}

// TenantState is one tenant of a band, waiting or remembered.
type TenantState struct {
	Tenant    string  `json:"tenant"`
	Queued    int     `json:"queued"`
	OldestMS  int64   `json:"oldest_wait_ms"`
	StartTag  float64 `json:"start_tag"`
	FinishTag float64 `json:"finish_tag"`
}

// State snapshots the controller at now: bands highest first, tenants by
// name.
func (c *Controller) State(now time.Time) State {
	st := State{Fairness: c.cfg.Fairness.String(), Queued: c.n, QueuedBytes: c.bytes, Tenants: c.tenants,
		EvictedTenants: c.evicted, Bands: []BandState{}}
	for _, p := range c.order {
		b := c.bands[p]
		bs := BandState{Priority: p, Queued: b.n, QueuedBytes: b.bytes, VirtualTime: b.vtime, Tenants: []TenantState{}}
		for _, t := range b.tenants {
			ts := TenantState{Tenant: t.name, Queued: t.fifo.Len(), FinishTag: t.finish}
			if f := t.fifo.Front(); f != nil {
				ts.StartTag = t.start
				ts.OldestMS = now.Sub(f.Value.(*Ticket).enqueued).Milliseconds()
			}
			bs.Tenants = append(bs.Tenants, ts)
		}
		slices.SortFunc(bs.Tenants, func(a, b TenantState) int { return cmp.Compare(a.Tenant, b.Tenant) })
		st.Bands = append(st.Bands, bs)
	}
	return st
}
