package llmd

import (
	_ "github.com/kvselect/kvselect/bench/mooncake"
	_ "github.com/llm-d/llm-d-kv-cache-manager/pkg/kvcache"
	_ "github.com/llm-d/llm-d-kv-cache-manager/pkg/kvcache/kvblock"
)
