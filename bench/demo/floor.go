package demo

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/grpc"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/floorpicker"
	"github.com/kvselect/kvselect/bench/promtext"
	"github.com/kvselect/kvselect/bench/relay"
	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// Floor is a running floor picker (bench/floorpicker): an ext_proc picker
// that does only what the protocol requires, naming the engines round-robin,
// so that a path's cost can be measured with a picker that costs nothing
// above it.
type Floor struct {
	cfg    floorpicker.Config
	conn   *grpc.ClientConn
	helper *peerproc.Helper
	log    *os.File
}

// StartFloor runs c.FloorPicker in front of fl's engines, its log in
// c.Out/[prefix-]floor-picker.log, and dials it as Envoy would.
func StartFloor(ctx context.Context, c Config, fl *fleet.Fleet, prefix string) (_ *Floor, err error) {
	ports, err := fleet.FreePorts(2)
	if err != nil {
		return nil, err
	}
	f := &Floor{cfg: floorpicker.Config{ExtProcPort: ports[0], HTTPPort: ports[1], Endpoints: fl.Workers}}
	name := "floor-picker.log"
	if prefix != "" {
		name = prefix + "-" + name
	}
	if f.log, err = os.Create(filepath.Join(c.Out, name)); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			f.Stop()
		}
	}()
	if f.helper, err = floorpicker.Start(ctx, c.FloorPicker, f.cfg, f.log); err != nil {
		return nil, err
	}
	if f.conn, err = fleet.Dial(f.ExtProc(), false); err != nil {
		return nil, fmt.Errorf("dial the floor picker: %w", err)
	}
	return f, nil
}

// ExtProc is where it serves ext_proc (host:port, plaintext).
func (f *Floor) ExtProc() string { return f.cfg.ExtProcAddr() }

// Stop closes the connection and ends the process.
func (f *Floor) Stop() {
	if f.conn != nil {
		f.conn.Close()
	}
	if f.helper != nil {
		f.helper.Stop()
	}
	if f.log != nil {
		f.log.Close()
	}
}

// Pid is the floor picker's process id.
func (f *Floor) Pid() int { return f.helper.Pid() }

// Metrics scrapes the floor picker's /metrics.
func (f *Floor) Metrics(ctx context.Context, fl *fleet.Fleet) (promtext.Samples, error) {
	return promtext.Scrape(ctx, fl.HTTP, f.cfg.MetricsURL())
}

// Relay sends requests through the floor picker to fl's engines, as Envoy
// does.
func (f *Floor) Relay(fl *fleet.Fleet) *relay.Relay {
	return &relay.Relay{Picker: envoysim.New(f.conn), HTTP: fl.HTTP}
}
