// Package vtcodec is the gRPC codec of kvselect's ext_proc picker and of
// envoysim: protobuf on the wire, encoded by the vtprotobuf code that
// go-control-plane generates for every Envoy message instead of by
// protobuf-go's reflection.
//
// go-control-plane compiles its _vtproto.pb.go files only under the
// vtprotobuf build tag; the Makefile, the Dockerfile and CI build with it.
// Without the tag (a plain `go build`) the messages lack the generated
// methods and Codec encodes with protobuf-go, as grpc's default codec does:
// the bytes are the same, only slower. Fast reports which one a binary has.
// go-control-plane generates no vtproto unmarshal: decoding is protobuf-go's,
// except for the body-chunk messages that make up most of a streamed
// request, which bodies.go reads with protowire into one allocation each.
//
// Every HTTP request through the picker is ~46 ext_proc messages, and their
// encoding is a measurable share of its CPU (docs/benchmarks.md). The codec is
// set per server (grpc.ForceServerCodecV2) or per connection
// (grpc.ForceCodecV2), never registered globally, so it changes nothing for
// other gRPC services in the process.
package vtcodec

import (
	"fmt"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/kvselect/kvselect/internal/sizepool"
)

// vtMarshaler is the marshal half of vtprotobuf's generated API.
// MarshalToSizedBufferVTStrict writes the fields in field-number order, as
// protobuf-go does, from the end of a buffer of exactly SizeVT bytes.
type vtMarshaler interface {
	SizeVT() int
	MarshalToSizedBufferVTStrict(dAtA []byte) (int, error)
}

// Fast reports whether this binary was built with the vtprotobuf tag, i.e.
// whether Codec encodes ext_proc messages with generated code.
func Fast() bool {
	_, ok := any(&extprocv3.ProcessingResponse{}).(vtMarshaler)
	return ok
}

// Codec is a grpc encoding.CodecV2 for protobuf messages. The zero Codec
// encodes large messages into grpc's default buffer pool; NewCodec's lends
// buffers of its own that it need not clear (encodePool).
type Codec struct{ pool *encodePool }

// NewCodec returns a Codec with its own encode buffers, for one server or
// client connection's lifetime.
func NewCodec() Codec { return Codec{pool: &encodePool{}} }

// encodePool lends Marshal its buffers without clearing them. grpc's default
// pool clears the whole capacity of every buffer it lends, and lends a chunk
// of a long body echoed back (the picker's 62,000 bytes) a 1 MiB buffer: 94
// MiB of clearing for a 1M-token request (BenchmarkMarshalLongChunk: 9.9 µs
// a chunk, against 1.2 µs here). Marshal writes every byte of the length it
// takes, which it checks, so nothing of an earlier message can be sent.
// Buffers come from a sizepool.Pool: rounded to an eighth of their size
// class, kept while messages of their size keep coming.
type encodePool struct{ p sizepool.Pool[byte] }

func (e *encodePool) Get(n int) *[]byte {
	b := e.p.Get(n)[:n]
	return &b
}

func (e *encodePool) Put(b *[]byte) { e.p.Put(*b) }

var _ encoding.CodecV2 = Codec{}

// Name is "proto", the content-subtype of grpc's default codec: the peer sees
// no difference.
func (Codec) Name() string { return "proto" }

// Marshal encodes v, into a pooled buffer when it is large enough to be
// pooled (grpc's own threshold).
func (c Codec) Marshal(v any) (mem.BufferSlice, error) {
	vt, ok := v.(vtMarshaler)
	if !ok {
		m, ok := v.(proto.Message)
		if !ok {
			return nil, fmt.Errorf("vtcodec: cannot marshal %T: not a protobuf message", v)
		}
		b, err := proto.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("vtcodec: marshal %T: %w", v, err)
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	size := vt.SizeVT()
	if mem.IsBelowBufferPoolingThreshold(size) {
		m := &smallMessage{buf: make([]byte, size)}
		if _, err := vt.MarshalToSizedBufferVTStrict(m.buf); err != nil {
			return nil, fmt.Errorf("vtcodec: marshal %T: %w", v, err)
		}
		m.slice[0] = &m.buf
		return m.slice[:], nil
	}
	var pool mem.BufferPool = c.pool
	if c.pool == nil {
		pool = mem.DefaultBufferPool()
	}
	buf := pool.Get(size)
	n, err := vt.MarshalToSizedBufferVTStrict((*buf)[:size])
	if err == nil && n != size {
		// The generated code writes exactly SizeVT bytes; were it ever
		// to write fewer, the uncleared head of the buffer must not go
		// out.
		err = fmt.Errorf("wrote %d of %d bytes", n, size)
	}
	if err != nil {
		pool.Put(buf)
		return nil, fmt.Errorf("vtcodec: marshal %T: %w", v, err)
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// smallMessage is an encoded message below grpc's pooling threshold and the
// one-element BufferSlice grpc takes it in, allocated together: the
// slice's backing array and the buffer's interface value would be two
// allocations of their own, on every streamed chunk the picker echoes.
type smallMessage struct {
	buf   mem.SliceBuffer
	slice [1]mem.Buffer
}

// Unmarshal decodes data into v: body chunks by the readers in bodies.go,
// everything else with protobuf-go.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("vtcodec: cannot unmarshal into %T: not a protobuf message", v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	switch m := m.(type) {
	case *extprocv3.ProcessingRequest:
		if decodeBodyRequest(buf.ReadOnlyData(), m) {
			return nil
		}
	case *extprocv3.ProcessingResponse:
		if decodeBodyResponse(buf.ReadOnlyData(), m) {
			return nil
		}
	}
	if err := proto.Unmarshal(buf.ReadOnlyData(), m); err != nil {
		return fmt.Errorf("vtcodec: unmarshal %T: %w", v, err)
	}
	return nil
}
