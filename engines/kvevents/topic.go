package kvevents

import (
	"bytes"
	"fmt"

	"github.com/tinylib/msgp/msgp"
)

// TopicPrefix starts llm-d's KV event topics. llm-d configures every vLLM pod
// to publish under kv@<pod-ip>:<port>@<model> (its precise prefix-cache
// producer subscribes to that prefix and reads the pod and model back from
// it), and llm-d-inference-sim does the same.
const TopicPrefix = "kv@"

// ParseTopic reads llm-d's topic convention kv@<host>:<port>@<model>. The
// host:port ends at the first '@' after the prefix (an address holds none), so
// a model name may itself contain '@' or '/'. hostPort is returned as written;
// ok is false for any other shape, including an empty address or model.
func ParseTopic(topic []byte) (hostPort, model []byte, ok bool) {
	rest, found := bytes.CutPrefix(topic, []byte(TopicPrefix))
	if !found {
		return nil, nil, false
	}
	hostPort, model, found = bytes.Cut(rest, []byte("@"))
	if !found || len(hostPort) == 0 || len(model) == 0 || bytes.IndexByte(hostPort, ':') < 0 {
		return nil, nil, false
	}
	return hostPort, model, true
}

// BatchRank reads the data-parallel rank a batch names, without decoding its
// events: the third element of the array [ts, events, dp_rank] or the
// data_parallel_rank (dp_rank, attn_dp_rank) key of the map form. present is
// false when the batch names none (a two-element array, nil, or no key). A
// collector socket uses it to pick the rank a message belongs to; the decoder
// validates the batch in full later.
func BatchRank(payload []byte) (rank uint32, present bool, err error) {
	switch msgp.NextType(payload) {
	case msgp.ArrayType:
		sz, b, err := msgp.ReadArrayHeaderBytes(payload)
		if err != nil {
			return 0, false, batchErr("batch header", err)
		}
		if sz != 2 && sz != 3 {
			return 0, false, fmt.Errorf("%w: batch array of length %d, want 2 or 3", ErrBatch, sz)
		}
		if sz == 2 {
			return 0, false, nil
		}
		for range 2 { // ts, events
			if b, err = msgp.Skip(b); err != nil {
				return 0, false, batchErr("batch field", err)
			}
		}
		rank, present, _, err = readOptUint32(b)
		if err != nil {
			return 0, false, batchErr("dp rank", err)
		}
		return rank, present, nil
	case msgp.MapType:
		sz, b, err := msgp.ReadMapHeaderBytes(payload)
		if err != nil {
			return 0, false, batchErr("batch header", err)
		}
		for range sz {
			var key []byte
			if key, b, err = msgp.ReadMapKeyZC(b); err != nil {
				return 0, false, batchErr("batch key", err)
			}
			switch string(key) {
			case "data_parallel_rank", "dp_rank", "attn_dp_rank":
				// The last key wins, as in the decoder; nil keeps an earlier one.
				var v uint32
				var ok bool
				if v, ok, b, err = readOptUint32(b); err != nil {
					return 0, false, batchErr("dp rank", err)
				}
				if ok {
					rank, present = v, true
				}
				continue
			}
			if b, err = msgp.Skip(b); err != nil {
				return 0, false, batchErr("batch field", err)
			}
		}
		return rank, present, nil
	}
	return 0, false, fmt.Errorf("%w: batch is neither an array nor a map", ErrBatch)
}
