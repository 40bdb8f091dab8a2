package extproc_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/httpadmin"
	"github.com/kvselect/kvselect/selection/kvhash"
)

// The same prompt picks the same worker through REST /select and through
// ext_proc, in every form ext_proc accepts token identities: both fronts
// only translate into the one selection.Service.
func TestRESTAndExtProcPickTheSameWorker(t *testing.T) {
	h := start(t, setup{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: httpadmin.New(h.svc, httpadmin.Options{})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	base := "http://" + ln.Addr().String()

	post := func(path string, body any) map[string]any {
		t.Helper()
		raw, _ := json.Marshal(body)
		res, err := http.Post(base+path, "application/json", bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(res.Body).Decode(&out); err != nil || res.StatusCode/100 != 2 {
			t.Fatalf("POST %s: %d %v %v", path, res.StatusCode, out, err)
		}
		return out
	}
	del := func(id string) {
		req, _ := http.NewRequest("DELETE", base+"/reservations/"+id, nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("DELETE %s: %v %v", id, res, err)
		}
		res.Body.Close()
	}

	for k := 1; k <= 4; k++ {
		tokens := make([]uint32, 32)
		for i := range tokens {
			tokens[i] = uint32(k*1000 + i)
		}
		// Teach the approximate index that worker k holds the prompt, over
		// REST, then release the booking: the cache entry stays.
		id := fmt.Sprintf("seed-%d", k)
		post("/reservations", map[string]any{"selection_id": id, "model_name": model, "worker_id": k, "dp_rank": 0, "token_ids": tokens})
		del(id)

		rest := post("/select", map[string]any{"model_name": model, "token_ids": tokens})
		restWorker := strconv.Itoa(int(rest["worker_id"].(float64)))
		if restWorker != strconv.Itoa(k) {
			t.Fatalf("REST picked %s for the prompt cached on %d", restWorker, k)
		}

		strs := make([]string, len(tokens))
		for i, v := range tokens {
			strs[i] = strconv.Itoa(int(v))
		}
		locals := kvhash.LocalBlockHashes(tokens, "", "", kvhash.BlockOptions{BlockSize: blockSize})
		seqs := kvhash.SequenceHashes(locals)
		u64s := func(v []uint64) string {
			out := make([]string, len(v))
			for i, x := range v {
				out[i] = strconv.FormatUint(x, 10)
			}
			return strings.Join(out, ",")
		}
		forms := map[string]*envoysim.Request{
			"body prompt": {Body: fmt.Appendf(nil, `{"model":%q,"prompt":[%s]}`, model, strings.Join(strs, ","))},
			"nvext token data": {Body: fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"user","content":"x"}],"nvext":{"token_data":[%s]}}`,
				model, strings.Join(strs, ","))},
			"header token ids": {Headers: []envoysim.Header{{Key: extproc.HeaderModelName, Value: model}, {Key: extproc.HeaderTokenIDs, Value: strings.Join(strs, ",")}}},
			"header hashes": {Headers: []envoysim.Header{{Key: extproc.HeaderModelName, Value: model},
				{Key: extproc.HeaderBlockHashes, Value: u64s(locals)}, {Key: extproc.HeaderSequenceHashes, Value: u64s(seqs)},
				{Key: extproc.HeaderISLTokens, Value: "32"}}},
		}
		for name, req := range forms {
			req.Modes = envoysim.GIE
			x, d := h.start(t, req)
			if d.Immediate != nil {
				t.Fatalf("%s: immediate %d %s", name, d.Immediate.Status, d.Immediate.Body)
			}
			if got := workerIDOf(d); got != restWorker {
				t.Fatalf("prompt %d as %s: ext_proc picked worker %s, REST /select worker %s", k, name, got, restWorker)
			}
			x.Close()
			h.idle(t)
		}
	}
}
