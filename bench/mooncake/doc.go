// Package mooncake replays Mooncake FAST'25 request traces against a KV-cache
// index, in the spirit of Dynamo's mooncake_bench.
//
// A trace is a JSONL file (optionally gzip-compressed) with one request per
// line: an arrival timestamp, token counts and hash_ids, the ids of the
// request's 512-token KV blocks; requests sharing a prefix of ids share a KV
// prefix. [LoadTrace] reads such a file.
//
// Requests are assigned to N synthetic workers. Each worker runs a mock
// engine ([Engine]) with a fixed pool of blocks, prefix caching and LRU
// eviction of leaf blocks, which turns every request into the KV events a
// vLLM-like engine would publish: [Removed] for the blocks evicted to make
// room, then [Stored] for the blocks the request added. Every block carries
// two hashes (see [Block]): Local, the content hash a router computes from
// the prompt (equal for equal hash ids on every worker), and Ext, the
// engine's own chained block hash, which differs between workers just as it
// does between vLLM engines started with different hash seeds.
//
// [Replay] (or [Prepare] followed by [Workload.Run]) first simulates all
// engines to pre-generate the events, so that simulation cost is excluded
// from timing, then walks the trace in order and, for each request, times
// one [Target.Match] of the request's local hashes followed by the
// application of that request's events. [MapTarget] is a small, obviously
// correct reference [Target] built from maps, used to check the engines and
// the driver, and as a baseline.
package mooncake
