// Package engines is the interop suite against an inference engine simulator
// kvselect's authors did not write: llm-d-inference-sim
// (github.com/llm-d/llm-d-inference-sim), which publishes real KV events the
// way llm-d deploys vLLM — its PUB socket dials one collector, topic
// kv@<ip>:<port>@<model>, batches numbered from 1, array batches that name
// parent 0 for "no parent" — and serves the OpenAI API with its own prefix
// cache accounting (cached_tokens) to check kvselect's index against.
//
// The simulator comes from KVSELECT_LLMD_SIM; without it the tests skip
// (KVSELECT_REQUIRE_LLMD_SIM=1 or KVSELECT_REQUIRE_PEERS=1 makes that a
// failure, as CI does). kvselect runs as a real process, built by TestMain
// (or KVSELECT_BIN).
package engines
