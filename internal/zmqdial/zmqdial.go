// Package zmqdial dials go-zeromq sockets under a context and keeps
// subscriber sessions up with capped exponential backoff. The ZMQ adapters
// (KV-event listeners, the replica mesh) share it.
package zmqdial

import (
	"context"
	"fmt"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Dial connects sock to ep and gives up when ctx ends. zmq4 runs the ZMTP
// handshake without a deadline, so a peer that accepts the TCP connection but
// never answers would block Dial, and with it whoever must stop the socket
// (Detach, Deregister, Close), for good. The dial therefore runs in its own
// goroutine; when ctx ends first, that goroutine is left to finish on its own
// (it closes the socket once Dial returns) and is not waited for.
func Dial(ctx context.Context, sock zmq4.Socket, ep string) error {
	errc := make(chan error, 1)
	go func() {
		err := sock.Dial(ep)
		if ctx.Err() != nil {
			sock.Close()
		}
		errc <- err
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return fmt.Errorf("dial %s: %w", ep, ctx.Err())
	}
}

// Redial runs session until ctx ends, waiting between sessions with capped
// exponential backoff: the first wait is first, each further one doubles up
// to limit, and a session that received something starts over at first (the
// publisher was up; this is a new outage). After every session that ends
// while ctx is live, retry gets its error and the wait before the next.
func Redial(ctx context.Context, first, limit time.Duration, session func() (received bool, err error), retry func(err error, wait time.Duration)) {
	delay := first
	for {
		received, err := session()
		if ctx.Err() != nil {
			return
		}
		if received {
			delay = first
		}
		retry(err, delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(delay*2, limit)
	}
}
