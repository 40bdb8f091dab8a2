package extproc

import (
	"runtime"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the default "proto" codec used for decoding
	"google.golang.org/grpc/mem"
)

// vtMarshaler is what go-control-plane's vtprotobuf code generates for every
// ext_proc message: size and marshal without reflection.
type vtMarshaler interface {
	SizeVT() int
	MarshalToSizedBufferVTStrict(dAtA []byte) (int, error)
}

// vtCodec marshals with the generated vtprotobuf code and unmarshals with
// gRPC's standard proto codec (go-control-plane generates no vtprotobuf
// unmarshal). Its name is "proto": the wire format is the same.
type vtCodec struct{ std encoding.CodecV2 }

func (c vtCodec) Name() string { return "proto" }

func (c vtCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(vtMarshaler)
	if !ok {
		return c.std.Marshal(v)
	}
	size := m.SizeVT()
	if mem.IsBelowBufferPoolingThreshold(size) {
		buf := make([]byte, size)
		if _, err := m.MarshalToSizedBufferVTStrict(buf); err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(buf)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	if _, err := m.MarshalToSizedBufferVTStrict((*buf)[:size]); err != nil {
		pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

func (c vtCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.std.Unmarshal(data, v) }

// ServerOptions are the grpc.Server options the picker is measured with: the
// vtprotobuf marshaler for responses and a fixed pool of stream workers
// (one per P) instead of a goroutine per stream. Use them when the server
// carries only the picker (and health).
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(vtCodec{std: encoding.GetCodecV2("proto")}),
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
	}
}
