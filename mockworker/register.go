package mockworker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Registration is the POST /workers body a worker sends to kvselect (or to
// Dynamo's selection service; the fields are those of Dynamo's WorkerRequest).
type Registration struct {
	WorkerID     uint64 `json:"worker_id"`
	ModelName    string `json:"model_name"`
	RoutingGroup string `json:"routing_group,omitempty"`
	// Role is kvselect's worker role, sent unless the worker is aggregated
	// (the record then stays Dynamo's).
	Role              string            `json:"role,omitempty"`
	Endpoint          string            `json:"endpoint"`
	KVEventsEndpoints map[string]string `json:"kv_events_endpoints,omitempty"`
	// KVEventsTopic is kvselect's field for an engine that dials its
	// collector under a topic other than llm-d's kv@<host>:<port>@<model>.
	KVEventsTopic         string `json:"kv_events_topic,omitempty"`
	ReplayEndpoint        string `json:"replay_endpoint,omitempty"`
	BlockSize             int    `json:"block_size"`
	DataParallelStartRank int    `json:"data_parallel_start_rank"`
	DataParallelSize      int    `json:"data_parallel_size"`
	MaxNumBatchedTokens   int    `json:"max_num_batched_tokens"`
	TotalKVBlocks         int    `json:"total_kv_blocks"`
}

// Registration describes the worker to kvselect. endpoint is the worker's
// HTTP base URL as clients should reach it; advertiseHost, when not empty,
// replaces the host of the KV event endpoints (which are dialable loopback
// addresses when the sockets bound every interface). A replay endpoint is
// only sent for a single-rank worker, the only case the selection service
// accepts: the replay protocol carries no rank, so a multi-rank worker with one
// stays incomplete.
//
// A worker that dials a collector (Config.KVEventsCollector) registers no KV
// events endpoint: the collector's owner feeds the worker from the messages
// whose topic names it, llm-d's kv@<host>:<port>@<model> matching endpoint's
// host and port, or else the topic sent as kv_events_topic.
func (w *Worker) Registration(endpoint, routingGroup, advertiseHost string) Registration {
	reg := Registration{
		WorkerID:              w.cfg.WorkerID,
		ModelName:             w.cfg.Model,
		RoutingGroup:          routingGroup,
		Endpoint:              endpoint,
		BlockSize:             w.cfg.BlockSize,
		DataParallelStartRank: w.cfg.DPStartRank,
		DataParallelSize:      w.cfg.DPSize,
		MaxNumBatchedTokens:   w.cfg.MaxNumBatchedTokens,
		TotalKVBlocks:         w.cfg.NumBlocks,
	}
	if w.cfg.Role != RoleBoth {
		reg.Role = w.cfg.Role
	}
	eps := w.Endpoints()
	collector := w.cfg.KVEventsCollector != ""
	if len(eps) > 0 && !collector {
		reg.KVEventsEndpoints = make(map[string]string, len(eps))
	}
	for _, e := range eps {
		if !collector {
			reg.KVEventsEndpoints[strconv.Itoa(e.DPRank)] = withHost(e.KVEvents, advertiseHost)
		}
		if len(eps) == 1 && e.Replay != "" {
			reg.ReplayEndpoint = withHost(e.Replay, advertiseHost)
		}
	}
	if collector && len(eps) > 0 && w.cfg.EventsTopic != LLMDTopic(hostPortOf(endpoint), w.cfg.Model) {
		reg.KVEventsTopic = w.cfg.EventsTopic
	}
	return reg
}

// hostPortOf is the host:port of an http(s) URL, "" when it has none.
func hostPortOf(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || u.Port() == "" {
		return ""
	}
	return u.Host
}

// withHost swaps the host of a tcp:// endpoint.
func withHost(ep, host string) string {
	if host == "" || !strings.HasPrefix(ep, "tcp://") {
		return ep
	}
	i := strings.LastIndexByte(ep, ':')
	if strings.Contains(host, ":") && !strings.HasPrefix(host, "[") {
		host = "[" + host + "]"
	}
	return "tcp://" + host + ep[i:]
}

// Register upserts the worker in a kvselect REST API at baseURL.
func Register(ctx context.Context, client *http.Client, baseURL string, reg Registration) error {
	body, err := json.Marshal(reg)
	if err != nil {
		return fmt.Errorf("mockworker: encode registration: %w", err)
	}
	return call(ctx, client, http.MethodPost, strings.TrimRight(baseURL, "/")+"/workers", body, http.StatusCreated, http.StatusOK)
}

// Deregister deletes the worker from a kvselect REST API; an unknown worker is
// not an error.
func Deregister(ctx context.Context, client *http.Client, baseURL string, workerID uint64) error {
	return call(ctx, client, http.MethodDelete,
		strings.TrimRight(baseURL, "/")+"/workers/"+strconv.FormatUint(workerID, 10), nil, http.StatusOK, http.StatusNotFound)
}

func call(ctx context.Context, client *http.Client, method, url string, body []byte, ok ...int) error {
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("mockworker: %s %s: %w", method, url, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("mockworker: %s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	for _, s := range ok {
		if resp.StatusCode == s {
			return nil
		}
	}
	return fmt.Errorf("mockworker: %s %s: %w", method, url,
		&StatusError{Code: resp.StatusCode, Body: strings.TrimSpace(string(msg))})
}

// StatusError is an answer of the kvselect API with an unexpected status: a
// rejection rather than an unreachable server.
type StatusError struct {
	Code int
	Body string // the start of the response body
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Code, http.StatusText(e.Code), e.Body)
}
