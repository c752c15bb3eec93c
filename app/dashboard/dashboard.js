// inflight dashboard: reads /stats and /stats/timeseries every few seconds and draws them.
// No dependencies, no build step. A proxy key, when one is needed, is kept in this closure's
// memory only and sent as an Authorization header; it never goes into the URL or storage.
"use strict";
(() => {
  const REFRESH_MS = 5000;
  const RECENT = 20;
  const SVG = "http://www.w3.org/2000/svg";

  let key = null;
  let timer = null;
  let range = { window: 3600, bucket: 60 };

  class Unauthorized extends Error {}

  const $ = (id) => document.getElementById(id);
  const int = (n) => Math.round(n || 0).toLocaleString("en-US");
  const usd = (n) => {
    const v = n || 0;
    return (v < 0 ? "-$" : "$") + (Math.abs(v) < 1 ? Math.abs(v).toFixed(4) : Math.abs(v).toFixed(2));
  };
  const pct = (x) => (100 * (x || 0)).toFixed(1) + "%";
  const compact = (n) => {
    const v = n || 0;
    for (const [unit, size] of [["G", 1e9], ["M", 1e6], ["k", 1e3]]) {
      if (Math.abs(v) >= size) return (v / size).toFixed(1) + unit;
    }
    return Number.isInteger(v) ? String(v) : v.toFixed(v < 1 ? 4 : 2);
  };

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }

  function svgEl(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
    return node;
  }

  async function get(path) {
    const headers = key ? { Authorization: "Bearer " + key } : {};
    const response = await fetch(path, { headers, cache: "no-store", credentials: "omit" });
    if (response.status === 401) throw new Unauthorized("key required");
    if (!response.ok) throw new Error(path + " answered " + response.status);
    return response.json();
  }

  function setStatus(text) { $("status").textContent = text; }

  function clearBoard() {
    for (const id of ["kpi-requests", "kpi-errors", "kpi-tokens", "kpi-cached", "kpi-saved-tokens",
      "kpi-saved-share", "kpi-actual", "kpi-summaries", "kpi-baseline", "kpi-unpriced",
      "kpi-saved-dollars", "kpi-saved-dollars-share", "kpi-saved-by"]) $(id).textContent = "";
    for (const id of ["compactions", "windows", "summaries", "chart-requests", "chart-tokens",
      "chart-dollars"]) $(id).replaceChildren();
    for (const id of ["models", "recent"]) $(id).tBodies[0].replaceChildren();
  }

  function renderKpis(stats) {
    const cost = stats.cost || {};
    const completed = (stats.by_outcome || {}).completed || 0;
    const tokensIn = stats.tokens_in || 0;
    const saved = stats.tokens_saved || 0;
    $("kpi-requests").textContent = int(stats.requests);
    $("kpi-errors").textContent = int((stats.requests || 0) - completed) + " not completed";
    $("kpi-tokens").textContent = compact(tokensIn) + " / " + compact(stats.tokens_out);
    $("kpi-cached").textContent = compact(stats.tokens_cached) + " read from cache";
    $("kpi-saved-tokens").textContent = int(saved);
    $("kpi-saved-share").textContent = pct(saved / Math.max(1, tokensIn + saved)) + " of prompt tokens";
    $("kpi-actual").textContent = usd(cost.actual);
    $("kpi-summaries").textContent = usd(cost.summaries) + " of it on summaries";
    $("kpi-baseline").textContent = usd(cost.baseline);
    $("kpi-unpriced").textContent = int(cost.unpriced_requests) + " unpriced requests";
    // A compaction event re-writes the cached prefix: it can cost more than not compacting,
    // and then the saving is negative and says so.
    const lost = (cost.saved || 0) < 0;
    $("kpi-saved-dollars").textContent = usd(cost.saved);
    $("kpi-saved-dollars").parentElement.classList.toggle("good", !lost);
    $("kpi-saved-dollars").parentElement.classList.toggle("bad", lost);
    $("kpi-saved-dollars-share").textContent = !cost.baseline ? "" : lost
      ? "compaction cost more: " + pct(-cost.saved / cost.baseline) + " over the baseline"
      : pct(cost.saved / cost.baseline) + " of the baseline";
    // Net of each kind of cut: requests cut to fit the window, and those only cost mode cut.
    $("kpi-saved-by").textContent = usd(cost.saved_by_fit) + " by fit · " +
      usd(cost.saved_by_cost_mode) + " by cost mode";
    // From the ledger: each compaction event's realised net, and the references its cut lost.
    const ledger = stats.ledger || {};
    $("kpi-realised").textContent = usd(ledger.realised_net) + " realised net of " +
      int(ledger.realised_events) + " events over " + int(ledger.realised_turns) + " requests after";
    $("kpi-lost-refs").textContent = (ledger.lost_per_event || 0).toFixed(2);
    $("kpi-refs").textContent = int(ledger.facts_retained) + " retained · " +
      int(ledger.facts_restorable) + " restorable · " + int(ledger.facts_lost) + " lost in " +
      int(ledger.rows_with_facts) + " events";
  }

  function bars(container, entries, format) {
    container.replaceChildren();
    if (!entries.length) { container.append(el("p", "none yet", "empty")); return; }
    const top = Math.max(...entries.map(([, v]) => v), 1e-9);
    for (const [name, value, scale] of entries) {
      const row = el("div", null, "row");
      row.dataset.name = name;
      const track = el("div", null, "track");
      const fill = el("div", null, "fill");
      fill.style.width = (100 * Math.min(1, value / (scale || top))) + "%";
      track.append(fill);
      row.append(el("span", name, "name"), track, el("span", format(value), "num"));
      container.append(row);
    }
  }

  function renderFacts(stats) {
    const facts = $("summaries");
    facts.replaceChildren();
    const s = stats.summaries || {};
    const rows = [["summary calls recorded", int(stats.summary_calls)],
      ["their cost", usd((stats.cost || {}).summaries)]];
    const byReason = (label, counts) => {
      for (const [reason, n] of Object.entries(counts || {}).sort((a, b) => b[1] - a[1])) {
        rows.push([label + ": " + reason, int(n)]);
      }
    };
    if (typeof s.calls === "number") {
      const since = typeof s.since === "number" ? " since " + new Date(s.since * 1000).toLocaleString() : "";
      rows.push(["calls" + since, int(s.calls)], ["failed calls", int(s.failed_calls)]);
      byReason("failed", s.failures);
      rows.push(["timeouts", int(s.timeouts)]);
      rows.push(["fell back to trim", int(Object.values(s.fallbacks || {}).reduce((a, b) => a + b, 0))]);
      byReason("fell back", s.fallbacks);
      const stood = s.stand_ins || {};
      const cut = Object.values(stood).reduce((a, b) => a + b, 0);
      if (cut > 0) {
        const share = Math.round(100 * (stood.summary || 0) / cut);
        rows.push(["compacted requests with a summary", share + " % of " + int(cut)]);
        byReason("served without a summary", {pending: stood.pending || 0, failed: stood.failed || 0});
      }
      const started = (s.background || {}).started || {};
      byReason("background summaries started", started);
    }
    for (const [name, value] of rows) facts.append(el("dt", name), el("dd", value));
  }

  function renderModels(stats) {
    const body = $("models").tBodies[0];
    body.replaceChildren();
    const models = Object.entries(stats.models || {}).sort((a, b) => (b[1].requests || 0) - (a[1].requests || 0));
    for (const [name, m] of models) {
      const cost = m.cost || {};
      const tr = el("tr");
      tr.dataset.model = name;
      tr.append(el("td", name), el("td", int(m.requests), "n"), el("td", int(m.tokens_in), "n"),
        el("td", int(m.tokens_saved), "n"), el("td", usd(cost.actual), "n"),
        el("td", usd(cost.baseline), "n"), el("td", usd(cost.saved), "n"));
      body.append(tr);
    }
  }

  function renderRecent(recent) {
    const body = $("recent").tBodies[0];
    body.replaceChildren();
    for (const r of recent) {
      const tr = el("tr");
      const applied = (r.strategies || []).join(", ") || "none";
      tr.append(el("td", new Date(r.ts * 1000).toLocaleTimeString()), el("td", r.model),
        el("td", int(r.tokens_before) + " → " + int(r.tokens_after), "n"), el("td", applied),
        el("td", int(r.latency_ms) + " ms", "n"), el("td", r.status, "n"),
        el("td", r.cost === null || r.cost === undefined ? "unpriced" : usd(r.cost), "n"));
      body.append(tr);
    }
  }

  function fill(series, since, until, bucket) {
    const byTs = new Map(series.map((b) => [b.ts, b]));
    const points = [];
    for (let ts = since; ts <= until; ts += bucket) points.push(byTs.get(ts) || { ts });
    return points;
  }

  function chart(svg, points, lines) {
    svg.replaceChildren();
    const W = 600, H = 180, L = 48, R = 8, T = 8, B = 20;
    const values = points.flatMap((p) => lines.map((l) => p[l.key] || 0));
    const top = Math.max(...values, 0);
    const x = (i) => L + (points.length > 1 ? (i * (W - L - R)) / (points.length - 1) : 0);
    const y = (v) => H - B - (top > 0 ? (v / top) * (H - T - B) : 0);
    svg.append(svgEl("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }));
    svg.append(svgEl("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }));
    const label = (text, attrs) => { const t = svgEl("text", attrs); t.textContent = text; svg.append(t); };
    label(lines[0].format(top), { x: L - 4, y: T + 8, "text-anchor": "end" });
    label(lines[0].format(0), { x: L - 4, y: H - B, "text-anchor": "end" });
    if (points.length) {
      label(new Date(points[0].ts * 1000).toLocaleTimeString(), { x: L, y: H - 4 });
      label(new Date(points[points.length - 1].ts * 1000).toLocaleTimeString(),
        { x: W - R, y: H - 4, "text-anchor": "end" });
    }
    for (const line of lines) {
      if (line.bars) {
        const width = Math.max(1, (W - L - R) / Math.max(points.length, 1) - 1);
        points.forEach((p, i) => {
          const v = p[line.key] || 0;
          if (v > 0) svg.append(svgEl("rect", { x: x(i) - width / 2, y: y(v), width, height: H - B - y(v), class: "bar" }));
        });
      } else {
        const path = points.map((p, i) => x(i).toFixed(1) + "," + y(p[line.key] || 0).toFixed(1)).join(" ");
        svg.append(svgEl("polyline", { points: path, class: line.cls }));
      }
    }
  }

  function renderCharts(timeseries) {
    const points = fill(timeseries.series || [], timeseries.since, timeseries.until, timeseries.bucket);
    for (const node of document.querySelectorAll(".bucket-label")) node.textContent = timeseries.bucket + " s";
    chart($("chart-requests"), points, [{ key: "requests", bars: true, format: int }]);
    chart($("chart-tokens"), points, [{ key: "tokens_in", cls: "line-in", format: compact },
      { key: "tokens_saved", cls: "line-saved", format: compact }]);
    chart($("chart-dollars"), points, [{ key: "cost_baseline", cls: "line-baseline", format: usd },
      { key: "cost_actual", cls: "line-actual", format: usd }]);
  }

  function render(stats, timeseries) {
    renderKpis(stats);
    renderCharts(timeseries);
    bars($("compactions"), Object.entries(stats.compactions || {}).sort((a, b) => b[1] - a[1]), int);
    const windows = Object.entries(stats.models || {})
      .filter(([, m]) => typeof m.recent_window_share === "number")
      .map(([name, m]) => [name, m.recent_window_share, 1]);
    bars($("windows"), windows, pct);
    renderFacts(stats);
    renderModels(stats);
    renderRecent(timeseries.recent || []);
  }

  function locked(refused) {
    if (timer !== null) { clearInterval(timer); timer = null; }
    key = null;
    clearBoard();
    $("board").hidden = true;
    $("login").hidden = false;
    $("key-error").hidden = !refused;
    setStatus("locked");
    $("key-input").focus();
  }

  async function refresh() {
    const query = "?bucket=" + range.bucket + "&window=" + range.window + "&recent=" + RECENT;
    try {
      const [stats, timeseries] = await Promise.all([get("/stats"), get("/stats/timeseries" + query)]);
      render(stats, timeseries);
      $("login").hidden = true;
      $("board").hidden = false;
      setStatus("updated " + new Date().toLocaleTimeString() + " · refreshes every " + REFRESH_MS / 1000 + " s");
      document.body.dataset.loaded = String(Date.now());
      if (timer === null) timer = setInterval(refresh, REFRESH_MS);
    } catch (error) {
      if (error instanceof Unauthorized) locked(key !== null);
      else setStatus("error: " + error.message);
    }
  }

  function chooseRange(button) {
    range = { window: Number(button.dataset.window), bucket: Number(button.dataset.bucket) };
    for (const other of document.querySelectorAll("#ranges button")) {
      other.classList.toggle("active", other === button);
    }
    if (key !== null || !$("board").hidden) refresh();
  }

  document.addEventListener("DOMContentLoaded", () => {
    for (const button of document.querySelectorAll("#ranges button")) {
      button.addEventListener("click", () => chooseRange(button));
    }
    $("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      key = $("key-input").value.trim() || null;
      $("key-input").value = "";
      refresh();
    });
    refresh();
  });
})();
