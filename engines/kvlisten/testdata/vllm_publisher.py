#!/usr/bin/python3
"""A KV-event publisher that behaves like vLLM's ZmqEventPublisher.

Used by kvlisten's interop test (interop_test.go). It encodes batches the way
vLLM's msgspec encoder does (KVEventBatch array_like: [ts, [events], dp_rank];
events either legacy positional arrays with every field present, or tagged maps
with "type" first and trailing None defaults omitted), publishes
[topic, seq (8 bytes big-endian), payload] on a PUB socket, keeps every batch in
a replay ring, and answers replay requests on a ROUTER socket with
[identity, b"", seq, payload] per batch and the end marker seq = -1 with an
empty payload, as vllm/distributed/kv_events.py does.

Protocol with the test (stdin/stdout, one JSON document per line):
  stdout <- {"pub": endpoint, "replay": endpoint} once bound
  stdin  -> "go": publish the workload (batches whose "drop" is true enter the
            ring but are not sent live), then send an empty heartbeat batch
            every 20 ms so the subscriber notices trailing gaps
  stdin EOF: exit
"""

import argparse
import json
import sys
import threading
import time

import msgpack
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)

# vLLM BlockStored / BlockRemoved field declaration order (the KVCacheEvent
# structs in vllm/distributed/kv_events.py); the positional shape follows it.
STORED_FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size",
                 "lora_id", "medium", "lora_name", "extra_keys", "group_idx",
                 "kv_cache_spec_kind", "kv_cache_spec_sliding_window"]
STORED_REQUIRED = 7  # fields without a default: always present in the map shape
REMOVED_FIELDS = ["block_hashes", "medium", "group_idx"]
REMOVED_REQUIRED = 2


def hash_value(h, as_bytes):
    # vLLM sends ints by default; with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 it
    # sends the raw hash bytes, whose last 8 bytes are the int the router uses.
    if h is None:
        return None
    if as_bytes:
        return b"\xab" * 24 + h.to_bytes(8, "big")
    return h


def encode_event(ev, shape, as_bytes):
    kind = ev["type"]
    if kind == "AllBlocksCleared":
        return ["AllBlocksCleared"] if shape == "array" else {"type": "AllBlocksCleared"}
    fields, required = (STORED_FIELDS, STORED_REQUIRED) if kind == "BlockStored" else (REMOVED_FIELDS, REMOVED_REQUIRED)
    values = {}
    for name in fields:
        v = ev.get(name)
        if name == "block_hashes":
            v = [hash_value(h, as_bytes) for h in v]
        elif name == "parent_block_hash":
            v = hash_value(v, as_bytes)
        values[name] = v
    if shape == "array":
        return [kind] + [values[n] for n in fields]
    out = {"type": kind}
    for i, name in enumerate(fields):
        if i >= required and values[name] is None:
            continue  # omit_defaults
        out[name] = values[name]
    return out


def encode_batch(events, dp_rank, shape, as_bytes):
    return msgpack.packb([time.time(), [encode_event(e, shape, as_bytes) for e in events], dp_rank],
                         use_bin_type=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True)
    ap.add_argument("--shape", choices=["array", "map"], default="array")
    ap.add_argument("--bytes-hashes", action="store_true")
    ap.add_argument("--pub", default="tcp://127.0.0.1:*")
    ap.add_argument("--replay", default="tcp://127.0.0.1:*")
    args = ap.parse_args()
    with open(args.workload) as f:
        work = json.load(f)
    topic = work.get("topic", "").encode()
    dp_rank = work.get("dp_rank")

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(args.pub)
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(args.replay)

    ring = []  # (seq, payload); the test's rings never overflow
    lock = threading.Lock()
    stop = threading.Event()

    def serve_replay():
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        while not stop.is_set():
            if not poller.poll(50):
                continue
            frames = router.recv_multipart()
            if len(frames) != 3:
                continue
            ident, start = frames[0], int.from_bytes(frames[2], "big")
            with lock:
                replies = [(s, p) for s, p in ring if s >= start]
            for s, p in replies:
                router.send_multipart([ident, b"", s.to_bytes(8, "big"), p])
            router.send_multipart([ident, b"", END_SEQ, b""])

    def publish(payload, live):
        with lock:
            seq = len(ring)
            ring.append((seq, payload))
            if live:
                pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])

    replay = threading.Thread(target=serve_replay, daemon=True)
    replay.start()
    print(json.dumps({"pub": pub.getsockopt_string(zmq.LAST_ENDPOINT),
                      "replay": router.getsockopt_string(zmq.LAST_ENDPOINT)}), flush=True)

    def heartbeat():
        while not stop.wait(0.02):
            publish(encode_batch([], dp_rank, args.shape, args.bytes_hashes), True)

    for line in sys.stdin:
        if line.strip() == "go":
            for b in work["batches"]:
                publish(encode_batch(b["events"], dp_rank, args.shape, args.bytes_hashes), not b.get("drop"))
            threading.Thread(target=heartbeat, daemon=True).start()
    stop.set()
    replay.join()
    pub.close()
    router.close()
    ctx.term()


if __name__ == "__main__":
    main()
