package extproc

import (
	"cmp"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/kvselect/kvselect/selection"
)

// selectInput is what one request asks of the selection, read from its
// headers, body and subset hint alone: the request to book, and what the
// pick does around the booking (pick in request.go).
type selectInput struct {
	// req is held by value: the caller's copy stays off the heap (the
	// selection does not keep it).
	req selection.SelectRequest
	// body is the parsed request body; its text goes to the tokenizer when
	// tokenize is set.
	body parsedBody
	// tokenize: the prompt is the body's text, which a tokenizer may turn
	// into the engine's ids (tokenize.go).
	tokenize bool
	// fromRequestID: the selection id is the client's x-request-id, which
	// is not guaranteed unique; a conflict books under a generated id.
	fromRequestID bool
	// restrict limits the candidates to the workers at some endpoints; nil
	// leaves every worker of the partition.
	restrict *restriction
	// unknownObjective is the InferenceObjective the request names and no
	// table defines; the request has priority 0, and the caller counts it.
	unknownObjective string
}

// restriction is a list of endpoints the pick is limited to.
type restriction struct {
	entries []string // ip or ip:port
	what    string   // where the list came from, for the 503 when nothing matches
}

// readSelectInput builds the selection input of a request from what its
// headers said (id) and its body (nil when the pick does not wait for one).
// The prompt is identified, first to last (README "ext_proc endpoint
// picker"), by the hash headers, the token-ids header, the body's token ids,
// the body's text, else the method and path. An error is the client's 400.
func readSelectInput(id *identity, body []byte, opts *Options) (selectInput, error) {
	return readSelectInputEarly(id, body, nil, opts)
}

// readSelectInputEarly is readSelectInput going on from the ids early read
// while the body arrived (nil: none).
func readSelectInputEarly(id *identity, body []byte, early *earlyIDs, opts *Options) (selectInput, error) {
	pb, err := parseBodyEarly(body, id.path, early)
	if err != nil {
		return selectInput{}, err
	}
	in := selectInput{body: pb, req: selection.SelectRequest{Fallbacks: opts.Fallbacks, Disaggregated: opts.Disaggregate, FromPicker: true}}
	req := &in.req
	req.ModelName = cmp.Or(id.model, pb.model, opts.DefaultModel)
	req.RoutingGroup = id.group
	if id.lora != "" {
		req.LoraName = &id.lora
	}
	if id.salt != "" {
		req.CacheSalt = &id.salt
	}
	switch {
	case id.hashPath:
		req.BlockHashes, req.SequenceHashes, req.ISLTokens = id.blockHashes, id.seqHashes, id.isl
	case id.tokens != nil:
		req.TokenIDs = id.tokens
	case pb.tokens != nil:
		req.TokenIDs = pb.tokens
	case pb.text != "":
		req.PromptText = pb.text
		in.tokenize = true
	default:
		// Nothing identifies a prompt (a GET, an empty body): a minimal
		// text prompt books a one-token request, so the pick is still
		// load-aware and the booking is freed like any other.
		req.PromptText = cmp.Or(id.method+" "+id.path, "/")
	}
	req.ExpectedOutputTokens = id.expected
	if req.ExpectedOutputTokens == nil {
		req.ExpectedOutputTokens = pb.osl
	}
	if m := pb.maxOutput; m != nil && req.ExpectedOutputTokens != nil && *m < *req.ExpectedOutputTokens {
		// The engine stops at the request's limit: no more output is to
		// be expected. The limit alone is no expectation (most requests
		// stop well before it), so it sets none.
		req.ExpectedOutputTokens = m
	}
	session := sessionFields(id, pb.session, req)
	if in.unknownObjective, err = flowFields(id, opts, session, req); err != nil {
		return selectInput{}, err
	}
	if req.SLOTTFTMs, err = sloHeader(HeaderSLOTTFT, id.sloTTFT, HeaderSLOTTFTLegacy, id.sloTTFTLegacy); err != nil {
		return selectInput{}, err
	}
	if req.SLOTPOTMs, err = sloHeader(HeaderSLOTPOT, id.sloTPOT, HeaderSLOTPOTLegacy, id.sloTPOTLegacy); err != nil {
		return selectInput{}, err
	}
	req.RequestBytes = len(body)
	switch {
	case opts.TestPickHeader && id.testPick != "":
		// GIE conformance: the test header wins over the subset hint, as
		// in the reference picker the conformance suite was written for.
		in.restrict = &restriction{entries: strings.Split(id.testPick, ","), what: HeaderTestPick}
	case id.hasSubset:
		in.restrict = &restriction{entries: id.subset, what: "subset hint"}
	}
	switch {
	case id.selectionID != "":
		req.SelectionID = &id.selectionID
	case id.requestID != "":
		req.SelectionID, in.fromRequestID = &id.requestID, true
	}
	return in, nil
}

// identitySource names what identified the prompt, for the parse span.
func identitySource(req *selection.SelectRequest) string {
	switch {
	case req.BlockHashes != nil || req.SequenceHashes != nil:
		return "hash_headers"
	case req.TokenIDs != nil:
		return "token_ids"
	default:
		return "text"
	}
}

// sloHeader reads a latency objective in milliseconds: the header's
// current name, else its older one; nil when neither was sent. The value
// must be a positive number.
func sloHeader(name, v, legacyName, legacy string) (*float64, error) {
	if v == "" {
		name, v = legacyName, legacy
	}
	if v == "" {
		return nil, nil
	}
	ms, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || !(ms > 0) || math.IsInf(ms, 0) {
		return nil, fmt.Errorf("header %s: %q is not a positive number of milliseconds", name, v)
	}
	return &ms, nil
}
