// kvselect status page: polls GET /ui/api/status and renders it. No
// dependencies; every value reaches the DOM through textContent.
"use strict";

const params = new URLSearchParams(location.search);
const interval = Math.max(200, Number(params.get("interval")) || 2000);
const history = []; // {t, hit, rate}: one point per poll, for the sparkline
const maxHistory = 90;
let previous = null; // the last poll's totals

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c == null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function pill(text, cls) { return el("span", { class: "pill " + cls }, text); }
function pct(x) { return (100 * x).toFixed(1) + " %"; }
function fixed(x, d) { return Number(x).toFixed(d); }
function fill(id, rows) { const b = document.querySelector("#" + id + " tbody"); b.replaceChildren(...rows); }

function totals(doc) {
  let decisions = 0, prompt = 0, cached = 0, best = 0;
  for (const r of doc.routing) { decisions += r.decisions; prompt += r.prompt_tokens; cached += r.cached_tokens; best += r.best_cached_tokens || 0; }
  return { t: Date.parse(doc.time), decisions, prompt, cached, best };
}

function listenerSummary(w) {
  const st = w.kv_events_status ? Object.values(w.kv_events_status) : [];
  if (!st.length) return { node: el("span", { class: "muted" }, w.kv_events_endpoint ? "not attached" : "none"), ok: null };
  const bad = st.filter((s) => !s.connected || !s.complete);
  const lost = st.reduce((n, s) => n + (s.lost_batches || 0), 0);
  const node = bad.length ? pill(bad.length + "/" + st.length + " incomplete" + (lost ? ", " + lost + " lost" : ""), "bad")
                          : pill(st.length + " connected", "ok");
  return { node, ok: bad.length === 0 };
}

function render(doc) {
  const now = totals(doc);
  if (previous && now.t > previous.t) {
    const dp = now.prompt - previous.prompt, dc = now.cached - previous.cached;
    const dd = now.decisions - previous.decisions;
    history.push({ hit: dp > 0 ? dc / dp : null, rate: dd / ((now.t - previous.t) / 1000) });
    if (history.length > maxHistory) history.shift();
  }
  previous = now;

  const schedulable = doc.workers.filter((w) => !(w.not_schedulable_reasons || []).length).length;
  document.getElementById("c-workers").textContent = schedulable + " / " + doc.workers.length;
  let active = 0;
  for (const p of doc.loads) for (const l of p.loads) active += l.active_requests;
  document.getElementById("c-active").textContent = active;
  const last = history.length ? history[history.length - 1] : null;
  document.getElementById("c-rate").textContent = last ? fixed(last.rate, 1) : "–";
  const lastHit = [...history].reverse().find((h) => h.hit != null);
  document.getElementById("c-hit").textContent =
    (lastHit ? pct(lastHit.hit) : "–") + " · " + (now.prompt ? pct(now.cached / now.prompt) : "–");
  document.getElementById("c-givenup").textContent = now.prompt ? pct(Math.max(now.best - now.cached, 0) / now.prompt) : "–";
  let listeners = 0, healthy = 0;
  for (const w of doc.workers) {
    const s = listenerSummary(w);
    if (s.ok !== null) { listeners++; if (s.ok) healthy++; }
  }
  document.getElementById("c-listeners").textContent = listeners ? healthy + " / " + listeners + " complete" : "none";
  document.getElementById("c-peers").textContent = doc.replica_sync ? String(doc.peers.length) : "off";

  fill("workers", doc.workers.sort((a, b) => a.worker_id - b.worker_id).map((w) => {
    const reasons = w.not_schedulable_reasons || [];
    const health = (w.health && w.health.state) || "healthy";
    return el("tr", { "data-worker-id": String(w.worker_id) },
      el("td", {}, w.worker_id),
      el("td", {}, w.model_name + " / " + w.routing_group),
      el("td", {}, w.endpoint || "–"),
      el("td", {}, pill(w.lifecycle || "–", w.lifecycle === "schedulable" ? "ok" : "warn")),
      el("td", {}, pill(health, health === "healthy" ? "ok" : "bad")),
      el("td", {}, listenerSummary(w).node),
      el("td", { class: reasons.length ? "bad" : "muted" }, reasons.join("; ") || "–"));
  }));

  let maxPrefill = 1, maxDecode = 1;
  for (const p of doc.loads) for (const l of p.loads) {
    maxPrefill = Math.max(maxPrefill, l.potential_prefill_tokens);
    maxDecode = Math.max(maxDecode, l.potential_decode_blocks);
  }
  const loadRows = [];
  for (const p of doc.loads) for (const l of p.loads) {
    loadRows.push(el("tr", {},
      el("td", {}, p.model_name + " / " + p.routing_group),
      el("td", {}, l.worker_id), el("td", {}, l.dp_rank),
      el("td", { class: "num" }, l.active_requests),
      el("td", {}, String(l.potential_prefill_tokens), el("span", { class: "bar", style: "width:" + Math.round(120 * l.potential_prefill_tokens / maxPrefill) + "px" })),
      el("td", {}, String(l.potential_decode_blocks), el("span", { class: "bar", style: "width:" + Math.round(120 * l.potential_decode_blocks / maxDecode) + "px" }))));
  }
  fill("loads", loadRows);

  fill("decisions", doc.decisions.map((d) => {
    const share = d.isl_tokens ? Math.min(d.cached_tokens, d.isl_tokens) / d.isl_tokens : 0;
    const ru = d.runner_up;
    return el("tr", { "data-selection-id": d.selection_id || "" },
      el("td", {}, new Date(d.time).toLocaleTimeString()),
      el("td", {}, (d.selection_id || "–").slice(0, 18)),
      el("td", {}, d.model + " / " + d.routing_group),
      el("td", {}, d.worker_id + ":" + d.dp_rank + (d.prefill_worker_id != null ? " (prefill " + d.prefill_worker_id + ")" : "")),
      el("td", {}, d.cached_tokens + " / " + d.isl_tokens + " (" + pct(share) + ")"),
      el("td", { class: "num" }, fixed(d.cost, 3)),
      el("td", {}, ru ? ru.worker_id + ":" + ru.dp_rank + " at " + fixed(ru.cost, 3) + " (+" + fixed(ru.cost - d.cost, 3) + ")" : "none"),
      el("td", { class: "num" }, d.candidates),
      el("td", { class: "num" }, fixed(d.queue_wait_ms, 1) + " ms"));
  }));

  const peers = document.getElementById("peers");
  peers.textContent = doc.replica_sync ? (doc.peers.length ? doc.peers.join(", ") : "no peers connected") : "replica sync off";
  if (doc.collector) peers.textContent += " · KV events collector: " + JSON.stringify(doc.collector);

  drawSpark();
  document.getElementById("updated").textContent = "updated " + new Date(doc.time).toLocaleTimeString() + " · every " + interval + " ms";
}

function drawSpark() {
  const svg = document.getElementById("spark");
  const ns = "http://www.w3.org/2000/svg";
  const pts = history.map((h, i) => [i, h.hit]).filter((p) => p[1] != null);
  const nodes = [];
  for (const y of [0, 0.5, 1]) {
    const line = document.createElementNS(ns, "line");
    line.setAttribute("x1", 0); line.setAttribute("x2", 600);
    line.setAttribute("y1", 76 - 72 * y); line.setAttribute("y2", 76 - 72 * y);
    line.setAttribute("stroke", "#e2e5ea");
    nodes.push(line);
  }
  if (pts.length > 0) {
    const step = 600 / Math.max(1, maxHistory - 1);
    const poly = document.createElementNS(ns, "polyline");
    poly.setAttribute("points", pts.map(([i, v]) => (i * step).toFixed(1) + "," + (76 - 72 * v).toFixed(1)).join(" "));
    poly.setAttribute("fill", "none"); poly.setAttribute("stroke", "#2f6fde"); poly.setAttribute("stroke-width", "2");
    poly.setAttribute("vector-effect", "non-scaling-stroke");
    nodes.push(poly);
  }
  svg.replaceChildren(...nodes);
  svg.setAttribute("data-points", String(pts.length));
}

// With authentication on, the data needs a read-scope token: asked for once,
// kept in this tab's sessionStorage, sent as a bearer token.
const login = document.getElementById("login");
login.addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem("kvselect-token", document.getElementById("token").value.trim());
  login.hidden = true;
});

async function poll() {
  const err = document.getElementById("error");
  try {
    const headers = {};
    const token = sessionStorage.getItem("kvselect-token");
    if (token) headers.Authorization = "Bearer " + token;
    const res = await fetch("api/status?decisions=30", { cache: "no-store", headers });
    if (res.status === 401 || res.status === 403) {
      login.hidden = false;
      throw new Error("GET /ui/api/status: " + res.status + (token ? " (the token was refused)" : " (a token is needed)"));
    }
    if (!res.ok) throw new Error("GET /ui/api/status: " + res.status + " " + (await res.text()));
    render(await res.json());
    err.hidden = true;
  } catch (e) {
    err.textContent = String(e.message || e);
    err.hidden = false;
  }
  setTimeout(poll, interval);
}

poll();
