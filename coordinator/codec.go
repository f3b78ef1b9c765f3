package coordinator

import (
	"time"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// encoded is a message already in its wire form: sent to many streams, it
// is encoded once, not once per stream. Its bytes are shared and never
// modified.
type encoded []byte

// withRenewal is assignment e with a renewal of ttlMs sent at sent
// (lease_ttl_ms and sent_unix_nanos), in a copy: a field that comes again
// later in a message replaces the earlier one, so the fields are appended.
func (e encoded) withRenewal(ttlMs int64, sent time.Time) encoded {
	b := make([]byte, len(e), len(e)+24)
	copy(b, e)
	b = protowire.AppendTag(b, 6, protowire.VarintType) // Assignment.lease_ttl_ms
	b = protowire.AppendVarint(b, uint64(ttlMs))
	b = protowire.AppendTag(b, 13, protowire.VarintType) // Assignment.sent_unix_nanos
	return protowire.AppendVarint(b, uint64(sent.UnixNano()))
}

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
