package mockworker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// Disaggregated prefill/decode, as vLLM with a KV connector behind llm-d's
// routing sidecar serves it. The exchange (llm-d's "nixlv2" connector):
//
//  1. A request reaches the decode worker with Config.PrefillerHeader naming
//     a prefill worker (host:port), set by the endpoint picker.
//  2. The decode worker sends the same request to the prefill worker with
//     "stream": false, no stream_options, max_tokens (and
//     max_completion_tokens, if given) 1, and
//     "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false,
//     "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null}.
//  3. The prefill worker prefills (its prefix cache keeps the blocks and its
//     KV events say so), generates one token and answers with
//     "kv_transfer_params": {"do_remote_prefill": true, "do_remote_decode": false,
//     "remote_engine_id": ..., "remote_block_ids": [...], "remote_host": ..., "remote_port": ...}.
//  4. The decode worker serves the original request with those parameters:
//     it pulls the blocks it does not cache (Config.KVTransferPerBlock each),
//     caches them, and decodes.
//
// A request that arrives with kv_transfer_params.do_remote_prefill already
// set (a caller that did step 2 itself) is served as in step 4.

// kvTransferParams reads the flags of a request's kv_transfer_params.
func kvTransferParams(raw map[string]any) (remotePrefill, remoteDecode bool) {
	return raw["do_remote_prefill"] == true, raw["do_remote_decode"] == true
}

// sidecar wraps a completions or chat handler with the decode side of the
// exchange: a request naming a prefill worker has its prompt prefilled there
// first, then goes to next with the returned kv_transfer_params.
func (w *Worker) sidecar(next http.HandlerFunc) http.HandlerFunc {
	return func(rw http.ResponseWriter, req *http.Request) {
		addr := req.Header.Get(w.cfg.PrefillerHeader)
		if addr == "" {
			next(rw, req)
			return
		}
		if w.cfg.Role == RolePrefill {
			writeError(rw, badRequest("%s: this is a prefill worker; it does not decode for another prefill worker", w.cfg.PrefillerHeader))
			return
		}
		if _, _, ok := splitHostPort(addr); !ok {
			writeError(rw, badRequest("%s: %q is not host:port", w.cfg.PrefillerHeader, addr))
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(rw, req.Body, maxBody))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				writeError(rw, &apiError{http.StatusRequestEntityTooLarge, "BadRequestError", fmt.Sprintf("request body exceeds %d bytes", maxBody)})
				return
			}
			writeError(rw, badRequest("reading the body: %v", err))
			return
		}
		var fields map[string]any
		d := json.NewDecoder(bytes.NewReader(body))
		d.UseNumber() // token ids and limits pass through unchanged
		if err := d.Decode(&fields); err != nil {
			writeError(rw, badRequest("invalid JSON body: %v", err))
			return
		}
		params, err := w.remotePrefill(req.Context(), addr, req.URL.Path, fields)
		if err != nil {
			// The prefill stage runs before any byte of the answer, so even a
			// streaming request gets a plain 502 here, not an SSE error.
			w.log.Warn("remote prefill failed", "prefiller", addr, "path", req.URL.Path, "err", err)
			writeError(rw, &apiError{http.StatusBadGateway, "BadGatewayError", err.Error()})
			return
		}
		fields["kv_transfer_params"] = params
		decode, err := json.Marshal(fields)
		if err != nil {
			writeError(rw, fmt.Errorf("re-encoding the request: %w", err))
			return
		}
		r2 := req.Clone(req.Context())
		r2.Header.Del(w.cfg.PrefillerHeader)
		r2.Body, r2.ContentLength = io.NopCloser(bytes.NewReader(decode)), int64(len(decode))
		next(rw, r2)
	}
}

// remotePrefill runs step 2 against the prefill worker at addr and returns
// the kv_transfer_params of its answer, with do_remote_prefill set.
func (w *Worker) remotePrefill(ctx context.Context, addr, path string, fields map[string]any) (map[string]any, error) {
	pre := make(map[string]any, len(fields)+1)
	for k, v := range fields {
		pre[k] = v
	}
	pre["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	pre["stream"] = false
	delete(pre, "stream_options")
	pre["max_tokens"] = 1
	if _, ok := pre["max_completion_tokens"]; ok {
		pre["max_completion_tokens"] = 1
	}
	body, err := json.Marshal(pre)
	if err != nil {
		return nil, fmt.Errorf("prefill request for %s: %w", addr, err)
	}
	ctx, cancel := context.WithTimeout(ctx, w.cfg.PrefillTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("prefill worker %s: %w", addr, err)
	}
	req.Header.Set("content-type", "application/json")
	resp, err := w.prefillClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("prefill worker %s: %w", addr, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("prefill worker %s: reading the answer: %w", addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("prefill worker %s answered %s: %s", addr, resp.Status, bytes.TrimSpace(answer))
	}
	var out struct {
		KVTransferParams map[string]any `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(answer, &out); err != nil {
		return nil, fmt.Errorf("prefill worker %s: answer is not JSON: %w", addr, err)
	}
	params := out.KVTransferParams
	if params == nil {
		// Not a KV connector's answer: pull the prompt by its blocks all the
		// same, as a decode without transfer metadata would recompute it.
		params = map[string]any{}
	}
	params["do_remote_prefill"], params["do_remote_decode"] = true, false
	return params, nil
}

func (w *Worker) prefillClient() *http.Client {
	w.pdOnce.Do(func() {
		w.pdClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}}
	})
	return w.pdClient
}

// transferParams is the prefill side's answer (step 3): where the decode
// side pulls the prompt's blocks from.
func (w *Worker) transferParams(req *http.Request, res Result) map[string]any {
	// Every block the prompt occupies, the partial last one included, as the
	// decode side pulls them (pullKV). The mock's pool has no block numbers,
	// so the ids are the blocks' positions: plausible, and opaque to any
	// decode side (vLLM's are indices into the prefill engine's pool).
	ids := make([]int, (res.PromptTokens+w.cfg.BlockSize-1)/w.cfg.BlockSize)
	for i := range ids {
		ids[i] = i
	}
	addr := w.cfg.AdvertiseAddr
	if addr == "" {
		addr = req.Host
	}
	host, port := addr, 0
	if h, p, ok := splitHostPort(addr); ok {
		host, port = h, p
	}
	return map[string]any{"do_remote_prefill": true, "do_remote_decode": false,
		"remote_engine_id": "mockworker-" + strconv.FormatUint(w.cfg.WorkerID, 10) + "-dp" + strconv.Itoa(res.DPRank),
		"remote_block_ids": ids, "remote_host": host, "remote_port": port, "tp_size": 1}
}

// splitHostPort splits host:port ([v6]:port too) with a numeric port.
func splitHostPort(hp string) (string, int, bool) {
	h, ps, err := net.SplitHostPort(hp)
	if err != nil || h == "" {
		return "", 0, false
	}
	p, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return "", 0, false
	}
	return h, int(p), true
}

// pullKV is a remote prefill's decode side: the blocks of the uncached
// prompt tokens come over the wire, one KVTransferPerBlock each.
func (w *Worker) pullKV(ctx context.Context, r *rank, uncached int) error {
	blocks := (uncached + w.cfg.BlockSize - 1) / w.cfg.BlockSize
	if err := w.cfg.Clock.Sleep(ctx, time.Duration(float64(w.cfg.KVTransferPerBlock)*float64(blocks)/w.cfg.Speedup)); err != nil {
		return err
	}
	r.mu.Lock()
	r.transferredBlocks += uint64(blocks)
	r.remotePrefills++
	r.mu.Unlock()
	return nil
}

// computePrefill is the prefill of the uncached prompt tokens. With
// PrefillStallsDecode it runs chunk by chunk, each chunk holding the rank's
// engine step so that no running sequence decodes meanwhile.
func (w *Worker) computePrefill(ctx context.Context, r *rank, uncached int, remoteDecode bool) error {
	per := float64(w.cfg.PrefillPerToken) / w.cfg.Speedup
	var err error
	if !w.cfg.PrefillStallsDecode {
		err = w.cfg.Clock.Sleep(ctx, time.Duration(per*float64(uncached)))
	} else {
		for left := uncached; left > 0 && err == nil; {
			chunk := min(left, w.cfg.MaxNumBatchedTokens)
			r.step.Lock()
			err = w.cfg.Clock.Sleep(ctx, time.Duration(per*float64(chunk)))
			r.step.Unlock()
			left -= chunk
		}
	}
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.computedPrefill += uint64(uncached)
	if remoteDecode {
		r.remoteDecodes++
	}
	r.mu.Unlock()
	return nil
}

// decodeStep waits one inter-token latency; with PrefillStallsDecode it
// shares the rank's engine step, so a prefill chunk waits for it and it
// waits for a prefill chunk.
func (w *Worker) decodeStep(ctx context.Context, r *rank, itl time.Duration) error {
	if !w.cfg.PrefillStallsDecode {
		return w.cfg.Clock.Sleep(ctx, itl)
	}
	r.step.RLock()
	defer r.step.RUnlock()
	return w.cfg.Clock.Sleep(ctx, itl)
}

// PDCounts are one rank's disaggregation counters.
type PDCounts struct {
	DPRank            int
	ComputedPrefill   uint64 // prompt tokens prefilled here
	TransferredBlocks uint64 // KV blocks pulled from prefill workers
	RemotePrefills    uint64 // decodes whose prompt a prefill worker computed
	RemoteDecodes     uint64 // prefill stages served for another worker's decode
}

// PDCounts returns every rank's disaggregation counters.
func (w *Worker) PDCounts() []PDCounts {
	out := make([]PDCounts, 0, len(w.ranks))
	for _, r := range w.ranks {
		r.mu.Lock()
		out = append(out, PDCounts{DPRank: r.global, ComputedPrefill: r.computedPrefill, TransferredBlocks: r.transferredBlocks,
			RemotePrefills: r.remotePrefills, RemoteDecodes: r.remoteDecodes})
		r.mu.Unlock()
	}
	return out
}
