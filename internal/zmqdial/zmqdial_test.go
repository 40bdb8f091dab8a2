package zmqdial

import (
	"context"
	"errors"
	"net"
	"slices"
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

// TestRedialBackoff: waits double from the first up to the limit, a session
// that received something starts over, and the loop ends with ctx without a
// retry for the session that ctx ended.
func TestRedialBackoff(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const first, limit = time.Millisecond, 4 * time.Millisecond
	received := []bool{false, false, false, false, true, false}
	var waits []time.Duration
	n := 0
	Redial(ctx, first, limit,
		func() (bool, error) {
			r := received[n]
			n++
			if n == len(received) {
				cancel()
			}
			return r, errors.New("session ended")
		},
		func(err error, wait time.Duration) {
			if err == nil || err.Error() != "session ended" {
				t.Errorf("retry got %v", err)
			}
			waits = append(waits, wait)
		})
	want := []time.Duration{first, 2 * first, limit, limit, first}
	if !slices.Equal(waits, want) || n != len(received) {
		t.Fatalf("%d sessions, waits %v; want %d, %v", n, waits, len(received), want)
	}
}
