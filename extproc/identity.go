package extproc

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// Request headers that identify a request to the picker: the public
// contract documented in the README ("ext_proc endpoint picker").
const (
	HeaderBlockHashes          = "x-kvselect-block-hashes"           // comma-separated decimal LocalBlockHashes
	HeaderSequenceHashes       = "x-kvselect-sequence-hashes"        // comma-separated decimal sequence hashes
	HeaderISLTokens            = "x-kvselect-isl-tokens"             // decimal input length
	HeaderTokenIDs             = "x-kvselect-token-ids"              // comma-separated decimal token ids
	HeaderModelName            = "x-kvselect-model-name"             // partition model (else the body's model)
	HeaderRoutingGroup         = "x-kvselect-routing-group"          // partition routing group
	HeaderSessionID            = "x-kvselect-session-id"             // session affinity key (a default of Options.SessionHeaders)
	HeaderLoraName             = "x-kvselect-lora-name"              // LoRA adapter (block-hash salt)
	HeaderCacheSalt            = "x-kvselect-cache-salt"             // cache namespace (block-hash salt)
	HeaderExpectedOutputTokens = "x-kvselect-expected-output-tokens" // expected output length
	HeaderSelectionID          = "x-kvselect-selection-id"           // booking id (else x-request-id, else generated)
	HeaderRequestID            = "x-request-id"
)

// Headers the picker sets on the request to the worker.
const (
	// HeaderDestination is protocol 004's destination: primary ip:port and
	// the ordered fallbacks, comma-separated.
	HeaderDestination = "x-gateway-destination-endpoint"
	// HeaderWorkerID and HeaderDPRank name the chosen (worker, dp rank).
	HeaderWorkerID = "x-kvselect-worker-id"
	HeaderDPRank   = "x-kvselect-dp-rank"
	// HeaderDynamoWorker and HeaderDynamoDPRank are the names Dynamo's
	// frontend reads for the same pins (nvext.rs apply_header_routing_overrides).
	HeaderDynamoWorker = "x-worker-instance-id"
	HeaderDynamoDPRank = "x-dp-rank"
	// HeaderEngineDPRank is the data-parallel rank header vLLM and SGLang
	// servers honour.
	HeaderEngineDPRank = "x-data-parallel-rank"
	// HeaderPrefiller names the prefill worker (host:port) of a remote
	// prefill decision: the header llm-d's P/D routing sidecar on the decode
	// pod reads (llm-d-inference-scheduler's pd-sidecar), so it prefills
	// there before decoding locally. Options.PrefillHeader renames it.
	HeaderPrefiller = "x-prefiller-host-port"
	// HeaderPrefillEndpoint is kvselect's own name for the same host:port.
	HeaderPrefillEndpoint = "x-kvselect-prefill-endpoint"
)

// Protocol 004 metadata and the GIE conformance hooks.
const (
	MetadataLB          = "envoy.lb"
	MetadataSubsetHint  = "envoy.lb.subset_hint"
	KeySubset           = "x-gateway-destination-endpoint-subset"
	KeyServed           = "x-gateway-destination-endpoint-served"
	HeaderTestPick      = "test-epp-endpoint-selection"
	HeaderTestServed    = "x-conformance-test-served-endpoint"
	HeaderEchoSetHeader = "x-echo-set-header"
)

// maxHeaderList bounds the elements of one list header (hashes, token ids).
const maxHeaderList = 1 << 20

// identity is what the request headers say about the request, and the
// gateway's subset hint (metadata).
type identity struct {
	model, group, session, lora, salt string
	selectionID, requestID            string
	blockHashes, seqHashes            []int64
	isl                               *uint64
	tokens                            []uint32
	expected                          *uint32
	hashPath                          bool // any of the three hash headers was sent
	testPick                          string
	path, method, authority           string
	// contentLength is the request's content-length header (0 when
	// absent or not a number): what the body buffer is sized to.
	contentLength                    int64
	objective, tenant, priority      string // flow control (flow.go)
	sloTTFT, sloTPOT                 string // latency objectives, ms (flow.go)
	sloTTFTLegacy, sloTPOTLegacy     string
	traceparent, tracestate, baggage string // W3C trace context (observe.go)
	modelRewrite, modelRewriteLegacy string // rewrite.go

	// session is the first value of sessions, the values of the session
	// headers (Options.SessionHeaders) entry by entry; parentSession and
	// sessionFinal are Dynamo's (session.go).
	sessions                      [MaxSessionHeaders]string
	parentSession, sessionFinal   string
	objectiveLegacy, tenantLegacy string // deprecated names (flow.go)
	deprecated                    uint8  // deprecated names sent: sent* bits (flow.go)

	// The endpoints of the gateway's subset hint (envoy.lb.subset_hint
	// metadata), when hasSubset.
	subset    []string
	hasSubset bool
}

// readHeaders fills id from Envoy's header map; sessionHeaders is the
// ordered session header list (Options.SessionHeaders). Envoy lower-cases
// keys and may carry the value in raw_value (preferred) or value.
func readHeaders(hm *corev3.HeaderMap, id *identity, sessionHeaders []string) error {
	var errs []error
	for _, h := range hm.GetHeaders() {
		k := h.GetKey()
		if len(k) < 5 {
			continue
		}
		if i := sessionIndex(sessionHeaders, k); i >= 0 {
			// Not exclusive: x-request-id, say, may name the session
			// and still be the selection id.
			id.sessions[i] = headerValue(h)
		}
		switch k {
		case ":path":
			id.path = headerValue(h)
		case ":method":
			id.method = headerValue(h)
		case ":authority":
			id.authority = headerValue(h)
		case HeaderRequestID:
			id.requestID = headerValue(h)
		case HeaderTestPick:
			id.testPick = headerValue(h)
		case HeaderModelName:
			id.model = headerValue(h)
		case HeaderRoutingGroup:
			id.group = headerValue(h)
		case HeaderDynamoParentSessionID:
			id.parentSession = headerValue(h)
		case HeaderDynamoSessionFinal:
			id.sessionFinal = headerValue(h)
		case HeaderLoraName:
			id.lora = headerValue(h)
		case HeaderCacheSalt:
			id.salt = headerValue(h)
		case HeaderSelectionID:
			id.selectionID = headerValue(h)
		case HeaderObjective:
			id.objective = headerValue(h)
		case HeaderFairnessID:
			id.tenant = headerValue(h)
		case HeaderPriority:
			id.priority = headerValue(h)
		case HeaderSLOTTFT:
			id.sloTTFT = headerValue(h)
		case HeaderSLOTPOT:
			id.sloTPOT = headerValue(h)
		case HeaderObjectiveLegacy:
			id.objectiveLegacy = headerValue(h)
			id.deprecated |= sentObjectiveLegacy
		case HeaderFairnessIDLegacy:
			id.tenantLegacy = headerValue(h)
			id.deprecated |= sentFairnessIDLegacy
		case HeaderSLOTTFTLegacy:
			id.sloTTFTLegacy = headerValue(h)
			id.deprecated |= sentSLOTTFTLegacy
		case HeaderSLOTPOTLegacy:
			id.sloTPOTLegacy = headerValue(h)
			id.deprecated |= sentSLOTPOTLegacy
		case HeaderModelRewrite:
			id.modelRewrite = headerValue(h)
		case HeaderModelRewriteLegacy:
			id.modelRewriteLegacy = headerValue(h)
			id.deprecated |= sentModelRewriteLegacy
		case "traceparent":
			id.traceparent = headerValue(h)
		case "tracestate":
			id.tracestate = headerValue(h)
		case "baggage":
			id.baggage = headerValue(h)
		case HeaderBlockHashes:
			v, err := parseHashes(headerValue(h))
			id.blockHashes, id.hashPath = v, true
			errs = appendErr(errs, k, err)
		case HeaderSequenceHashes:
			v, err := parseHashes(headerValue(h))
			id.seqHashes, id.hashPath = v, true
			errs = appendErr(errs, k, err)
		case HeaderISLTokens:
			v, err := strconv.ParseUint(strings.TrimSpace(headerValue(h)), 10, 64)
			id.isl, id.hashPath = &v, true
			errs = appendErr(errs, k, err)
		case "content-length":
			// Only sizes the body buffer: a wrong value costs a
			// reallocation, never a refusal.
			if n, err := strconv.ParseInt(headerValue(h), 10, 64); err == nil && n > 0 {
				id.contentLength = n
			}
		case HeaderTokenIDs:
			v, err := parseTokens(headerValue(h))
			id.tokens = v
			errs = appendErr(errs, k, err)
		case HeaderExpectedOutputTokens:
			v, err := strconv.ParseUint(strings.TrimSpace(headerValue(h)), 10, 32)
			e := uint32(v)
			id.expected = &e
			errs = appendErr(errs, k, err)
		}
	}
	for _, v := range id.sessions {
		if v = strings.TrimSpace(v); v != "" {
			id.session = v
			break
		}
	}
	return errors.Join(errs...)
}

func appendErr(errs []error, header string, err error) []error {
	if err == nil {
		return errs
	}
	var ne *strconv.NumError
	if errors.As(err, &ne) {
		err = fmt.Errorf("%q is not a valid number", ne.Num)
	}
	return append(errs, fmt.Errorf("header %s: %w", header, err))
}

func headerValue(h *corev3.HeaderValue) string {
	if raw := h.GetRawValue(); len(raw) > 0 {
		return string(raw)
	}
	return h.GetValue()
}

// parseHashes reads comma-separated decimal hashes. A hash is a 64-bit
// pattern: either spelling works, signed (as Dynamo's JSON sends them) or
// unsigned.
func parseHashes(s string) ([]int64, error) {
	out := make([]int64, 0, strings.Count(s, ",")+1)
	err := eachElement(s, func(e string) error {
		if strings.HasPrefix(e, "-") {
			v, err := strconv.ParseInt(e, 10, 64)
			out = append(out, v)
			return err
		}
		v, err := strconv.ParseUint(e, 10, 64)
		out = append(out, int64(v))
		return err
	})
	return out, err
}

func parseTokens(s string) ([]uint32, error) {
	out := make([]uint32, 0, strings.Count(s, ",")+1)
	err := eachElement(s, func(e string) error {
		v, err := strconv.ParseUint(e, 10, 32)
		out = append(out, uint32(v))
		return err
	})
	return out, err
}

func eachElement(s string, fn func(string) error) error {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil
	}
	n := 0
	for e := range strings.SplitSeq(s, ",") {
		if n++; n > maxHeaderList {
			return fmt.Errorf("more than %d elements", maxHeaderList)
		}
		if err := fn(strings.TrimSpace(e)); err != nil {
			return err
		}
	}
	return nil
}
