// Package zmqdial dials go-zeromq sockets under a context. The ZMQ adapters
// (KV-event listeners, the replica mesh) share it.
package zmqdial

import (
	"context"
	"fmt"

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
