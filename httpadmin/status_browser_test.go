package httpadmin

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kvselect/kvselect/internal/peerproc"
)

// TestStatusPageAsksForAToken loads the page in headless Chromium from a
// server that wants a read token: the page shows its token form, and once a
// token is entered it renders the worker and the decision the server has.
// Skipped without Chromium unless KVSELECT_REQUIRE_OBSERVE is set (CI).
func TestStatusPageAsksForAToken(t *testing.T) {
	chromium := peerproc.ObserveTool(t, "chromium")
	const token = "ops-token-0123456789abcdefgh"
	srv := startTokenServer(t, token+" read,select,admin name=ops\n")
	call := func(method, path, body string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode/100 != 2 {
			t.Fatalf("%s %s: %d", method, path, res.StatusCode)
		}
	}
	call("POST", "/workers", `{"worker_id":5,"model_name":"model","endpoint":"http://worker-5:8000","block_size":4}`)
	call("POST", "/select_and_reserve", `{"model_name":"model","token_ids":[1,2,3,4,5,6,7,8],"selection_id":"browser-1"}`)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox)...)
	defer cancelAlloc()
	tab, cancelTab := chromedp.NewContext(alloc)
	defer cancelTab()
	if err := chromedp.Do(tab, chromedp.Navigate(srv.URL+"/ui/?interval=200"), chromedp.WaitVisible("#login"),
		chromedp.SendKeys("#token", token), chromedp.Click("#login button")); err != nil {
		t.Fatalf("the page did not ask for a token: %v", err)
	}
	if err := chromedp.Do(tab, chromedp.WaitVisible(`#decisions tr[data-selection-id="browser-1"]`)); err != nil {
		t.Fatalf("no decision row after the token was given: %v", err)
	}
	worker, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.querySelector('#workers tr[data-worker-id="5"]').textContent`))
	if err != nil || !strings.Contains(worker, "http://worker-5:8000") {
		t.Errorf("worker row %q (%v)", worker, err)
	}
	// One worker: nothing could be given up for load.
	givenUp, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.querySelector('#c-givenup').textContent`))
	if err != nil || givenUp != "0.0 %" {
		t.Errorf("cache given up for load %q (%v), want 0.0 %%", givenUp, err)
	}
}
