// Package index is kvselect's KV overlap index: for a prompt's LocalBlockHashes
// it answers, per (worker, data-parallel rank), how many leading blocks the
// worker holds on the device and how far the host-pinned, disk and external
// tiers continue that prefix — Dynamo's find_matches
// (lib/kv-router/src/indexer/radix_tree.rs at commit abcafe20) followed by the
// continuation walk of its lower-tier indexers.
//
// Tree is the data structure of one partition (a content-keyed radix tree with
// per-worker engine-hash handles, pointer-free pages, interned owner sets);
// Index wraps it with the partition's lock, the approximate (TTL) mode and the
// predicted-TTL side index; Partitions holds one Index per (model name, routing
// group) with its frozen block size; Dump, Snapshot, DecodeDump and Restore
// implement the /dump recovery format. The package does no I/O, starts no
// goroutine and reads no clock: callers pass the time in. docs/kv-index.md has the
// design and the semantics that deliberately differ from Dynamo.
package index
