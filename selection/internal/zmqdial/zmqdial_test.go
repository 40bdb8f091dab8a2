package zmqdial

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// A peer that accepts TCP but never answers the ZMTP greeting: Dial returns
// when the context ends instead of hanging.
func TestDialGivesUpWithTheContext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, silent
		}
	}()
	sub := zmq4.NewSub(context.Background(), zmq4.WithDialerMaxRetries(0))
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = Dial(ctx, sub, "tcp://"+ln.Addr().String())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial = %v, want the context's deadline", err)
	}
}

func TestDialConnects(t *testing.T) {
	pub := zmq4.NewPub(context.Background())
	defer pub.Close()
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	sub := zmq4.NewSub(context.Background())
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Dial(ctx, sub, "tcp://"+pub.Addr().String()); err != nil {
		t.Fatal(err)
	}
}
