// Package observe checks the observability stack against a live run:
// kvselect and mock workers on loopback, scraped by a real Prometheus (with the alert rules loaded) while a trace slice goes through
// the picker, the status page open in headless Chromium. It then checks
// every query of the Grafana dashboard against that Prometheus (an error,
// or no data where data is expected, fails the run), checks that every
// alert rule evaluates, asserts the status page shows the workers and the
// decisions, and saves screenshots of the page and of the dashboard's
// panels (drawn from the same query results) under -out.

package observe

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kvselect/kvselect/bench/demo"
	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// optionalPanels are dashboard panels whose series exist only with a
// feature this run does not turn on.
var optionalPanels = map[string]string{
	"Queue":         "flow control is off (--flow-control)",
	"Replica peers": "replica sync is off (--replica-sync-port)",
}

// Config is one run: the demo's processes and trace slice, and the tools.
type Config struct {
	Demo       demo.Config
	Prometheus string // Prometheus binary (Debian: apt install prometheus)
	Chromium   string // Chromium binary, for the status page and the screenshots
	Dashboard  string // Grafana dashboard whose queries are checked
	Alerts     string // Prometheus rules file loaded into the Prometheus
}

// Defaults is the run of `make observe` but shorter: the demo's engines,
// 400 requests, 64 in flight.
func Defaults() Config {
	d := demo.Defaults()
	d.Requests, d.Concurrency, d.Out = 400, 64, "bench/out/observe"
	return Config{Demo: d, Prometheus: "prometheus", Chromium: "chromium",
		Dashboard: "deploy/observability/grafana-dashboard.json", Alerts: "deploy/observability/alerts.yaml"}
}

// panelResult is one dashboard panel's check.
type panelResult struct {
	Title    string        `json:"title"`
	Queries  []queryResult `json:"queries"`
	Optional string        `json:"optional,omitempty"`
	series   []report.Line // the range results, seconds since the run began, for the rendering
}

type queryResult struct {
	Expr   string  `json:"expr"`
	Series int     `json:"series"`
	Value  float64 `json:"value,omitempty"` // the first series' value at the end
	Error  string  `json:"error,omitempty"`
}

// Report is observe.json.
type Report struct {
	Requests    int           `json:"requests"`
	Workers     int           `json:"workers"`
	Panels      []panelResult `json:"panels"`
	Rules       int           `json:"rules"`
	StatusPage  string        `json:"status_page_screenshot"`
	Dashboard   string        `json:"dashboard_screenshot"`
	PageWorkers int           `json:"page_worker_rows"`
	PageDecided int           `json:"page_decision_rows"`
	PagePoints  int           `json:"page_hit_rate_points"`
}

// Run checks every dashboard panel's queries and every alert rule against
// the live run, asserts the status page, saves the screenshots and
// observe.json into c.Demo.Out and prints a table; the error lists every
// check that failed.
func Run(ctx context.Context, c Config, stdout, stderr io.Writer) (*Report, error) {
	dash, alerts, reqs, err := c.prepare()
	if err != nil {
		return nil, err
	}
	out := c.Demo.Out

	fl, err := demo.StartFleet(ctx, c.Demo, reqs, "", stderr)
	if err != nil {
		return nil, err
	}
	defer fl.Stop()
	prom, err := startPrometheus(ctx, c.Prometheus, out, fl, alerts)
	if err != nil {
		return nil, err
	}
	defer prom.stop()
	fmt.Fprintf(stderr, "Prometheus at %s scrapes kvselect and the workers every second; status page: %s/ui/\n", prom.url, fl.KV.REST)
	tab, closeTab, err := openStatusPage(ctx, c.Chromium, fl.KV.REST)
	if err != nil {
		return nil, err
	}
	defer closeTab()
	start, end, err := replayScraped(ctx, fl, prom, c.Demo, reqs, stderr)
	if err != nil {
		return nil, err
	}

	rep := &Report{Requests: len(reqs), Workers: c.Demo.Workers}
	if err := checkStatusPage(tab, out, c.Demo.Workers, rep); err != nil {
		return rep, err
	}
	failures := prom.checkPanels(ctx, dash, start, end, rep)
	n, ruleErrs, err := prom.ruleHealth(ctx)
	if err != nil {
		return rep, err
	}
	rep.Rules = n
	failures = append(failures, ruleErrs...)
	if n == 0 {
		failures = append(failures, "Prometheus loaded no alert rule from "+alerts)
	}
	rep.Dashboard = filepath.Join(out, "dashboard.png")
	if err := renderDashboard(tab, out, rep.Panels, dash, start, end, rep.Dashboard); err != nil {
		return rep, err
	}
	rep.Table(stdout)
	if err := report.WriteJSON(filepath.Join(out, "observe.json"), rep); err != nil {
		return rep, err
	}
	fmt.Fprintf(stdout, "\nwrote %s, %s and %s (logs in %s)\n", rep.StatusPage, rep.Dashboard, filepath.Join(out, "observe.json"), out)
	if len(failures) > 0 {
		return rep, fmt.Errorf("%d dashboard or rule checks failed:\n  %s", len(failures), strings.Join(failures, "\n  "))
	}
	return rep, nil
}

// prepare checks c, finds the tools on PATH, creates c.Demo.Out and makes
// it absolute, and returns the dashboard, the alert rules' absolute path
// (Prometheus reads it from a configuration file in a temporary directory)
// and the trace slice.
func (c *Config) prepare() (dash *grafanaDashboard, alerts string, reqs []mooncake.Request, err error) {
	if c.Demo.Workers < 1 || c.Demo.Requests < 1 {
		return nil, "", nil, errors.New("-workers and -requests must be positive")
	}
	for _, b := range []*string{&c.Prometheus, &c.Chromium} {
		p, err := exec.LookPath(*b)
		if err != nil {
			return nil, "", nil, fmt.Errorf("%s: %w", *b, err)
		}
		*b = p
	}
	if dash, err = readDashboard(c.Dashboard); err != nil {
		return nil, "", nil, err
	}
	if alerts, err = filepath.Abs(c.Alerts); err != nil {
		return nil, "", nil, err
	}
	if reqs, err = c.Demo.Slice.Load(); err != nil {
		return nil, "", nil, err
	}
	if err := os.MkdirAll(c.Demo.Out, 0o755); err != nil {
		return nil, "", nil, err
	}
	if c.Demo.Out, err = filepath.Abs(c.Demo.Out); err != nil {
		return nil, "", nil, err
	}
	return dash, alerts, reqs, nil
}

// openStatusPage opens kvselect's status page at rest in a headless
// Chromium; closeTab closes the tab and the browser.
func openStatusPage(ctx context.Context, chromium, rest string) (tab context.Context, closeTab func(), err error) {
	browser, cancelBrowser := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1400, 1000))...)
	tab, cancelTab := chromedp.NewContext(browser)
	closeTab = func() {
		cancelTab()
		cancelBrowser()
	}
	if err := chromedp.Do(tab, chromedp.Navigate(rest+"/ui/?interval=500")); err != nil {
		closeTab()
		return nil, nil, fmt.Errorf("chromium: opening the status page: %w", err)
	}
	return tab, closeTab, nil
}

// replayScraped replays the trace slice through the picker once Prometheus
// has scraped twice, and returns the window the queries are checked over:
// from the first request to two scrapes after the last.
func replayScraped(ctx context.Context, fl *fleet.Fleet, prom *promProcess, d demo.Config, reqs []mooncake.Request, stderr io.Writer) (start, end time.Time, err error) {
	if err := prom.waitScraped(ctx, 2, 60*time.Second); err != nil {
		return start, end, err
	}
	start = time.Now()
	ph, err := demo.Replay(ctx, fl, demo.Via{}, d, demo.PolicyKVSelect, reqs, stderr)
	if err != nil {
		return start, end, err
	}
	if ph.Errors > 0 {
		return start, end, fmt.Errorf("%d of %d requests failed (logs in %s)", ph.Errors, ph.Requests, d.Out)
	}
	// Two more scrapes, so the last requests are in Prometheus; the
	// instant queries read that moment.
	time.Sleep(2500 * time.Millisecond)
	return start, time.Now(), nil
}

// checkPanels runs every panel's queries over [start, end] into rep and
// returns the failures: a query's error, or no data from a panel this run
// should feed.
func (p *promProcess) checkPanels(ctx context.Context, dash *grafanaDashboard, start, end time.Time, rep *Report) []string {
	var failures []string
	for _, panel := range dash.Panels {
		pr := p.checkPanel(ctx, panel, start, end)
		pr.Optional = optionalPanels[panel.Title]
		for _, q := range pr.Queries {
			switch {
			case q.Error != "":
				failures = append(failures, fmt.Sprintf("panel %q: %s: %s", panel.Title, q.Expr, q.Error))
			case q.Series == 0 && pr.Optional == "":
				failures = append(failures, fmt.Sprintf("panel %q: no data for %s", panel.Title, q.Expr))
			}
		}
		rep.Panels = append(rep.Panels, pr)
	}
	return failures
}

// checkStatusPage waits until the page shows every worker, some decisions
// and a few hit-rate points, then saves a screenshot.
func checkStatusPage(tab context.Context, out string, workers int, rep *Report) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		counts, err := chromedp.Run(tab, chromedp.Evaluate[[]int](`[document.querySelectorAll("#workers tbody tr").length,
			document.querySelectorAll("#decisions tbody tr").length,
			Number(document.getElementById("spark").getAttribute("data-points") || 0)]`))
		if err != nil {
			return fmt.Errorf("chromium: reading the status page: %w", err)
		}
		rep.PageWorkers, rep.PageDecided, rep.PagePoints = counts[0], counts[1], counts[2]
		if rep.PageWorkers == workers && rep.PageDecided > 0 && rep.PagePoints >= 2 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("status page: %d worker rows (want %d), %d decision rows, %d hit-rate points after 30 s", rep.PageWorkers, workers, rep.PageDecided, rep.PagePoints)
		}
		time.Sleep(250 * time.Millisecond)
	}
	png, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
	if err != nil {
		return fmt.Errorf("chromium: screenshot: %w", err)
	}
	rep.StatusPage = filepath.Join(out, "status-page.png")
	return os.WriteFile(rep.StatusPage, png, 0o644)
}

// ---- the dashboard ----

type grafanaDashboard struct {
	Title  string         `json:"title"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaPanel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	GridPos struct {
		X, Y, W, H int
	} `json:"gridPos"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
}

func readDashboard(path string) (*grafanaDashboard, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d grafanaDashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(d.Panels) == 0 {
		return nil, fmt.Errorf("%s: no panels", path)
	}
	return &d, nil
}

// promQL fills in Grafana's template variables the way a dashboard with
// "All" selected does.
func promQL(expr string) string {
	return strings.NewReplacer("$__rate_interval", "10s", "$model", ".*", "$job", "kvselect").Replace(expr)
}

// ---- Prometheus ----

type promProcess struct {
	url  string
	hc   *http.Client
	stop func()
}

// startPrometheus runs Prometheus scraping kvselect and the workers every
// second with rules loaded, its data in a temporary directory and its log
// in out.
func startPrometheus(ctx context.Context, bin, out string, fl *fleet.Fleet, rules string) (*promProcess, error) {
	port, err := peerproc.FreePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kvbench-prometheus-")
	if err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: kvselect
    static_configs: [{targets: [%q]}]
  - job_name: mock-workers
    static_configs: [{targets: [%s]}]
`, rules, strings.TrimPrefix(fl.KV.REST, "http://"), quoteAll(fl.Workers))
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	proc := fleet.NewProcess("prometheus", bin, out, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(port), "--log.level=warn")
	if err := proc.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p := &promProcess{url: "http://127.0.0.1:" + strconv.Itoa(port), hc: &http.Client{Timeout: 30 * time.Second},
		stop: func() { proc.Stop(10 * time.Second); os.RemoveAll(dir) }}
	if err := fleet.WaitOK(ctx, p.hc, p.url+"/-/ready", 60*time.Second); err != nil {
		p.stop()
		return nil, fmt.Errorf("prometheus did not become ready: %w (log in %s)", err, proc.Log)
	}
	return p, nil
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, ", ")
}

type promResponse struct {
	Status string `json:"status"`
	Error  string `json:"error"`
	Data   struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  []any             `json:"value"`
			Values [][]any           `json:"values"`
		} `json:"result"`
		Groups []struct {
			Rules []struct {
				Name      string `json:"name"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"data"`
}

func (p *promProcess) get(ctx context.Context, path string, q url.Values) (*promResponse, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+path+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	res, err := p.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	var out promResponse
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("GET %s: %d: %w", path, res.StatusCode, err)
	}
	if out.Status != "success" {
		return &out, errors.New(out.Error)
	}
	return &out, nil
}

// waitScraped waits until Prometheus has scraped kvselect n times, so that
// the run's first requests already fall in its data.
func (p *promProcess) waitScraped(ctx context.Context, n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		r, err := p.get(ctx, "/api/v1/query", url.Values{"query": {`count_over_time(up{job="kvselect"}[5m])`}})
		if err == nil && len(r.Data.Result) == 1 && len(r.Data.Result[0].Value) == 2 {
			if v, _ := strconv.Atoi(fmt.Sprint(r.Data.Result[0].Value[1])); v >= n {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("prometheus did not scrape kvselect %d times within %v (last error %v)", n, limit, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkPanel runs each of a panel's queries at the end of the run (instant)
// and over the run (range, for the rendering).
func (p *promProcess) checkPanel(ctx context.Context, panel grafanaPanel, start, end time.Time) panelResult {
	pr := panelResult{Title: panel.Title}
	for _, t := range panel.Targets {
		expr := promQL(t.Expr)
		qr := queryResult{Expr: expr}
		inst, err := p.get(ctx, "/api/v1/query", url.Values{"query": {expr}, "time": {unixSeconds(end)}})
		if err != nil {
			qr.Error = err.Error()
			pr.Queries = append(pr.Queries, qr)
			continue
		}
		qr.Series = len(inst.Data.Result)
		if qr.Series > 0 && len(inst.Data.Result[0].Value) == 2 {
			qr.Value, _ = strconv.ParseFloat(fmt.Sprint(inst.Data.Result[0].Value[1]), 64)
		}
		pr.Queries = append(pr.Queries, qr)
		rng, err := p.get(ctx, "/api/v1/query_range", url.Values{"query": {expr}, "start": {unixSeconds(start)},
			"end": {unixSeconds(end)}, "step": {"1"}})
		if err != nil {
			continue
		}
		for _, r := range rng.Data.Result {
			s := report.Line{Name: legend(t.LegendFormat, r.Metric)}
			for _, v := range r.Values {
				ts, _ := v[0].(float64)
				f, err := strconv.ParseFloat(fmt.Sprint(v[1]), 64)
				if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
					continue
				}
				s.X, s.Y = append(s.X, ts-float64(start.UnixMilli())/1000), append(s.Y, f)
			}
			pr.series = append(pr.series, s)
		}
	}
	return pr
}

func unixSeconds(t time.Time) string {
	return strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64)
}

func legend(format string, metric map[string]string) string {
	out := format
	for k, v := range metric {
		out = strings.ReplaceAll(out, "{{"+k+"}}", v)
	}
	return out
}

// ruleHealth reports how many rules Prometheus loaded and which failed to
// evaluate.
func (p *promProcess) ruleHealth(ctx context.Context) (int, []string, error) {
	r, err := p.get(ctx, "/api/v1/rules", url.Values{})
	if err != nil {
		return 0, nil, err
	}
	n := 0
	var bad []string
	for _, g := range r.Data.Groups {
		for _, rule := range g.Rules {
			n++
			if rule.Health != "ok" {
				bad = append(bad, fmt.Sprintf("rule %s: health %q %s", rule.Name, rule.Health, rule.LastError))
			}
		}
	}
	return n, bad, nil
}

// ---- output ----

// Table prints the status page's figures and every panel query's result.
func (rep *Report) Table(w io.Writer) {
	fmt.Fprintf(w, "status page: %d worker rows, %d decision rows, %d hit-rate points\n", rep.PageWorkers, rep.PageDecided, rep.PagePoints)
	fmt.Fprintf(w, "alert rules loaded and evaluating: %d\n\n", rep.Rules)
	fmt.Fprintf(w, "%-28s %7s %14s  %s\n", "panel", "series", "value at end", "note")
	for _, p := range rep.Panels {
		for i, q := range p.Queries {
			title := p.Title
			if i > 0 {
				title = ""
			}
			note := q.Error
			if q.Series == 0 && note == "" {
				note = "no data: " + cmp.Or(p.Optional, "MISSING")
			}
			fmt.Fprintf(w, "%-28s %7d %14.4g  %s\n", title, q.Series, q.Value, note)
		}
	}
}

// renderDashboard draws each panel's range results as an SVG chart placed by
// its grid position, in an HTML page Chromium screenshots: the dashboard's
// layout and data, not Grafana's look (no Grafana runs here).
func renderDashboard(tab context.Context, dir string, panels []panelResult, dash *grafanaDashboard, start, end time.Time, png string) error {
	var b strings.Builder
	b.WriteString(`<!doctype html><html><head><meta charset="utf-8"><style>
body{font:12px system-ui,sans-serif;margin:12px}
.grid{display:grid;grid-template-columns:repeat(24,1fr);grid-auto-rows:34px;gap:6px}
.p{border:1px solid #ddd;border-radius:3px;padding:4px 8px;overflow:hidden}
.p svg{width:100%;height:100%}.t{font-weight:600}.v{font-size:26px;color:#009E73}.l{color:#555}
</style></head><body>`)
	fmt.Fprintf(&b, "<h2>%s — %s to %s (rendered from Prometheus by kvbench observe)</h2><div class=grid>",
		html.EscapeString(dash.Title), start.Format("15:04:05"), end.Format("15:04:05"))
	for i, p := range panels {
		gp := dash.Panels[i].GridPos
		fmt.Fprintf(&b, `<div class=p style="grid-column:%d/span %d;grid-row:%d/span %d">`, gp.X+1, gp.W, gp.Y+1, gp.H)
		unit := dash.Panels[i].FieldConfig.Defaults.Unit
		switch {
		case dash.Panels[i].Type == "stat":
			v := "no data"
			if len(p.Queries) > 0 && p.Queries[0].Series > 0 {
				v = formatUnit(p.Queries[0].Value, unit)
			}
			fmt.Fprintf(&b, "<div class=t>%s</div><div class=v>%s</div>", html.EscapeString(p.Title), html.EscapeString(v))
		case len(p.series) == 0:
			fmt.Fprintf(&b, "<div class=t>%s</div><div class=l>no data (%s)</div>", html.EscapeString(p.Title),
				html.EscapeString(cmp.Or(p.Optional, "missing")))
		default:
			c := report.Chart{Title: p.Title, Unit: unitLabel(unit), Lines: p.series, XLabel: "seconds since the run began"}
			if err := report.RenderChart(&b, c, gp.W*56, gp.H*40-20); err != nil {
				return err
			}
		}
		b.WriteString("</div>")
	}
	b.WriteString("</div></body></html>")
	page := filepath.Join(dir, "dashboard.html")
	if err := os.WriteFile(page, []byte(b.String()), 0o644); err != nil {
		return err
	}
	if err := chromedp.Do(tab, chromedp.Navigate("file://"+page)); err != nil {
		return fmt.Errorf("chromium: dashboard page: %w", err)
	}
	shot, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
	if err != nil {
		return fmt.Errorf("chromium: dashboard screenshot: %w", err)
	}
	return os.WriteFile(png, shot, 0o644)
}

// unitLabel names a Grafana unit in a chart title.
func unitLabel(unit string) string {
	switch unit {
	case "percentunit":
		return "fraction"
	case "reqps":
		return "per second"
	case "s", "bytes":
		return unit
	}
	return ""
}

func formatUnit(v float64, unit string) string {
	switch unit {
	case "percentunit":
		return fmt.Sprintf("%.1f%%", 100*v)
	case "s":
		switch {
		case v < 1e-3:
			return fmt.Sprintf("%.0f µs", v*1e6)
		case v < 1:
			return fmt.Sprintf("%.1f ms", v*1e3)
		}
		return fmt.Sprintf("%.2f s", v)
	case "reqps":
		return fmt.Sprintf("%.3g/s", v)
	case "bytes":
		return fmt.Sprintf("%.0f MiB", v/(1<<20))
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}
