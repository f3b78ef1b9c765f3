package nccl

import (
	"fmt"

	"github.com/gpucoord/gpucoord/collectives"
)

// ncclDataType_t values from nccl.h (unchanged since NCCL 2.0; bfloat16 since 2.10).
const (
	ncclUint8    = 1
	ncclFloat32  = 7
	ncclFloat64  = 8
	ncclBfloat16 = 9
)

// ncclRedOp_t values from nccl.h.
const (
	ncclSum = 0
	ncclMax = 2
	ncclMin = 3
)

// dataType maps a collectives element type to ncclDataType_t.
func dataType(d collectives.DType) (int32, error) {
	switch d {
	case collectives.Float32:
		return ncclFloat32, nil
	case collectives.Float64:
		return ncclFloat64, nil
	case collectives.BFloat16:
		return ncclBfloat16, nil
	}
	return 0, fmt.Errorf("%w: data type %d", ErrUnsupported, d)
}

// redOp maps a collectives reduction to ncclRedOp_t.
func redOp(o collectives.Op) (int32, error) {
	switch o {
	case collectives.Sum:
		return ncclSum, nil
	case collectives.Max:
		return ncclMax, nil
	case collectives.Min:
		return ncclMin, nil
	}
	return 0, fmt.Errorf("%w: reduction %d", ErrUnsupported, o)
}

// kind names an operation in shape descriptors and errors.
type kind uint8

const (
	kindAllReduce kind = iota + 1
	kindReduceScatter
	kindAllGather
	kindBroadcast
	kindSendRecv
)

// nccl names the NCCL function of a collective kind.
func (k kind) nccl() string { return "nccl" + k.String() }

func (k kind) String() string {
	switch k {
	case kindAllReduce:
		return "AllReduce"
	case kindReduceScatter:
		return "ReduceScatter"
	case kindAllGather:
		return "AllGather"
	case kindBroadcast:
		return "Broadcast"
	case kindSendRecv:
		return "Send/Recv"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}
