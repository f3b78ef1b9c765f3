package coordinator

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// encoded is a message already in its wire form: sent to many streams, it
// is encoded once, not once per stream. Its bytes are shared and never
// modified.
type encoded []byte

// passCodec is the server's codec: gRPC's protobuf codec, through which an
// encoded message goes as it is.
type passCodec struct{ encoding.CodecV2 }

func newPassCodec() passCodec { return passCodec{encoding.GetCodecV2("proto")} }

// Marshal implements encoding.CodecV2.
func (c passCodec) Marshal(v any) (mem.BufferSlice, error) {
	if e, ok := v.(encoded); ok {
		return mem.BufferSlice{mem.SliceBuffer(e)}, nil // Free does nothing: the bytes stay shared
	}
	return c.CodecV2.Marshal(v)
}
