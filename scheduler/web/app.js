// The scheduler's web view: a single page with three routes, each drawn from
// the JSON endpoints of docs/WEB.md and refreshed by polling.
//   #/              sweeps with progress and ETA
//   #/sweep/NAME    results table, loss vs aspect ratio, live curves, runs
//   #/job/ID        attempts, curves, diagnostics heatmaps
// With a token-protected scheduler every /api/ call sends the token kept in
// sessionStorage; a 401 clears the view and shows the login form.
"use strict";

const POLL_MS = 2000;
const TOKEN_KEY = "depthbench-token";
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#db2777",
                "#65a30d", "#475569", "#ca8a04"];

const STEP_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5,
                    5e5, 1e6];

const $ = (sel, root = document) => root.querySelector(sel);

// ---- small helpers ---------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function fmt(v, digits = 4) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return v.toLocaleString("en-US");
  return Number(v.toPrecision(digits)).toString();
}
function fmtLr(v) { return v === null || v === undefined ? "–" : v.toExponential(1); }
function fmtDuration(s) {
  if (s === null || s === undefined) return "–";
  s = Math.round(s);
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
}
function fmtTime(ms) { return ms ? new Date(ms).toLocaleString() : "–"; }
function stateBadge(state) { return el("span", { class: "state state-" + state, text: state }); }
function esc(s) { return encodeURIComponent(s); }

// ---- API -------------------------------------------------------------------

class Unauthorized extends Error {}

async function api(path) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers["Authorization"] = "Bearer " + token;
  const r = await fetch(path, { headers, cache: "no-store" });
  if (r.status === 401) throw new Unauthorized((await r.json()).error);
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

// ---- sortable tables -------------------------------------------------------
// columns: [{title, value(row) -> sort key, cell(row) -> Node|string, num, cls(row)}]
// The sort order survives re-renders (kept in `state`).

function sortableTable(columns, rows, state, attrs = {}) {
  const sorted = rows.slice();
  if (state.col !== undefined && columns[state.col]) {
    const key = columns[state.col].value;
    const dir = state.dir;
    sorted.sort((a, b) => {
      const x = key(a), y = key(b);
      const xn = x === null || x === undefined, yn = y === null || y === undefined;
      if (xn || yn) return xn === yn ? 0 : xn ? 1 : -1;  // blanks last
      return (x < y ? -1 : x > y ? 1 : 0) * dir;
    });
  }
  const head = el("tr", {}, columns.map((c, i) => {
    const sortable = !!c.value;
    const th = el("th", {
      class: [c.num ? "num" : "", sortable ? "sortable" : ""].join(" ").trim() || null,
      "aria-sort": state.col === i ? (state.dir > 0 ? "ascending" : "descending") : null,
      title: sortable ? "sort" : null,
    }, c.title);
    if (sortable) th.addEventListener("click", () => {
      state.dir = state.col === i ? -state.dir : 1;
      state.col = i;
      state.rerender();
    });
    return th;
  }));
  const body = sorted.map((r) => el("tr", {}, columns.map((c) => {
    const v = c.cell(r);
    return el("td", { class: [c.num ? "num" : "", c.cls ? c.cls(r) : ""].join(" ").trim() || null }, v);
  })));
  return el("div", { class: "scroll" }, el("table", attrs, el("thead", {}, head), el("tbody", {}, body)));
}

function tableState(rerender) { return { col: undefined, dir: 1, rerender }; }

// ---- charts (uPlot) --------------------------------------------------------

function chartWidth(container) { return Math.max(320, Math.min(container.clientWidth || 600, 1232) - 8); }

// A line chart of named series over a shared x; `series` is
// [{label, points: Map(x -> y)}]. Returns {update(series)}.
function lineChart(container, { xLabel, yLabel, logX = false, height = 260, points = true }) {
  let plot = null, labels = "";
  const draw = (series) => {
    const xs = [...new Set(series.flatMap((s) => [...s.points.keys()]))].sort((a, b) => a - b);
    const data = [xs, ...series.map((s) => xs.map((x) => (s.points.has(x) ? s.points.get(x) : null)))];
    const newLabels = series.map((s) => s.label).join("\u0001");
    const total = series.reduce((n, s) => n + s.points.size, 0);
    container.dataset.points = String(total);
    container.dataset.series = String(series.length);
    if (plot && newLabels === labels) { plot.setData(data); return; }
    if (plot) plot.destroy();
    labels = newLabels;
    const opts = {
      width: chartWidth(container), height,
      scales: { x: { time: false, distr: logX ? 3 : 1 } },
      // Steps are whole numbers: no ticks between them.
      axes: [logX ? { label: xLabel } : { label: xLabel, incrs: STEP_INCRS },
             { label: yLabel, size: 60 }],
      series: [{ label: xLabel, value: (u, v) => fmt(v) }].concat(series.map((s, i) => ({
        label: s.label, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true,
        // A series of few points (an evaluation at the end) shows them.
        points: { show: points || s.points.size <= 3, size: 7 }, value: (u, v) => fmt(v),
      }))),
    };
    plot = new uPlot(opts, data, container);
  };
  // Follow the container's width (window resized, columns stacked). The
  // resize waits for the next frame: resizing inside the observer's callback
  // would change the layout it is reporting ("ResizeObserver loop" errors).
  let pending = false;
  const resized = new ResizeObserver(() => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      if (plot && Math.abs(plot.width - chartWidth(container)) > 2) {
        plot.setSize({ width: chartWidth(container), height });
      }
    });
  });
  resized.observe(container);
  return { update: draw, destroy: () => { resized.disconnect(); if (plot) plot.destroy(); } };
}

// Heatmap of a matrix (rows x cols) on a canvas, blue (low) to red (high).
function heatmap(title, matrix, { rowLabel = "row", colLabel = "col" } = {}) {
  const rows = matrix.length, cols = rows ? matrix[0].length : 0;
  const cell = Math.max(6, Math.min(44, Math.floor(300 / Math.max(rows, cols, 1))));
  const canvas = el("canvas", { width: cols * cell, height: rows * cell, role: "img",
                                "aria-label": title });
  const vals = matrix.flat().filter((v) => v !== null && Number.isFinite(v));
  const lo = vals.length ? Math.min(...vals) : 0, hi = vals.length ? Math.max(...vals) : 1;
  const ctx = canvas.getContext("2d");
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const v = matrix[r][c];
      if (v === null || !Number.isFinite(v)) { ctx.fillStyle = "#e5e7eb"; }
      else {
        const t = hi > lo ? (v - lo) / (hi - lo) : 0.5;
        const red = Math.round(59 + t * (220 - 59)), green = Math.round(130 - t * 90),
              blue = Math.round(246 - t * 200);
        ctx.fillStyle = `rgb(${red},${green},${blue})`;
      }
      ctx.fillRect(c * cell, r * cell, cell, cell);
    }
  }
  canvas.title = `${title}: ${rowLabel} down, ${colLabel} across; ${fmt(lo)} (blue) .. ${fmt(hi)} (red)`;
  return el("div", { class: "heatmap" }, el("figure", {},
    el("figcaption", {}, `${title} (${rows}\u00d7${cols}; ${fmt(lo, 3)} .. ${fmt(hi, 3)})`), canvas));
}

// ---- routing and polling ---------------------------------------------------

let current = null;  // {tick, destroy}
let timer = null;
let generation = 0;

function setStatus(text) { $("#status").textContent = text; }

function showLogin(message) {
  if (current && current.destroy) current.destroy();
  current = null;
  clearTimeout(timer);
  $("#view").replaceChildren();  // no data stays on the page
  $("#crumbs").replaceChildren();
  $("#login").hidden = false;
  $("#logout").hidden = true;
  const err = $("#login-error");
  err.hidden = !message;
  err.textContent = message || "";
  setStatus("");
  $("#token").focus();
}

async function run(gen) {
  if (gen !== generation || !current) return;
  try {
    await current.tick();
    if (gen !== generation) return;
    setStatus("updated " + new Date().toLocaleTimeString());
  } catch (e) {
    if (gen !== generation) return;
    if (e instanceof Unauthorized) {
      const hadToken = !!sessionStorage.getItem(TOKEN_KEY);
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin(hadToken ? "The token was not accepted: " + e.message : "");
      return;
    }
    setStatus("error: " + e.message);
  }
  timer = setTimeout(() => run(gen), POLL_MS);
}

function route() {
  generation++;
  clearTimeout(timer);
  if (current && current.destroy) current.destroy();
  $("#login").hidden = true;
  $("#logout").hidden = !sessionStorage.getItem(TOKEN_KEY);
  const view = $("#view");
  view.replaceChildren();
  const hash = location.hash.replace(/^#/, "") || "/";
  let m;
  if ((m = hash.match(/^\/sweep\/(.+)$/))) current = sweepPage(view, decodeURIComponent(m[1]));
  else if ((m = hash.match(/^\/job\/(\d+)$/))) current = jobPage(view, Number(m[1]));
  else current = sweepsPage(view);
  run(generation);
}

function crumbs(...parts) {
  $("#crumbs").replaceChildren(...parts.flatMap((p, i) => (i ? [" / ", p] : [p])));
}

// ---- #/ : sweeps -----------------------------------------------------------

function sweepsPage(view) {
  crumbs(el("a", { href: "#/" }, "sweeps"));
  const box = el("div", { id: "sweeps" });
  view.append(el("h1", {}, "Sweeps"), box);
  let last = null, token = "", next = "";
  const state = tableState(() => render());
  const render = () => {
    if (!last) return;
    const columns = [
      { title: "Sweep", value: (s) => s.name, cell: (s) => el("a", { href: "#/sweep/" + esc(s.name) }, s.name) },
      { title: "State", value: (s) => s.state, cell: (s) => stateBadge(s.state) },
      { title: "Progress", value: (s) => (s.total_jobs ? s.done_jobs / s.total_jobs : 0),
        cell: (s) => el("span", {}, el("span", { class: "progress" },
          el("span", { style: `width:${s.total_jobs ? (100 * s.done_jobs) / s.total_jobs : 0}%` })),
          ` ${s.done_jobs}/${s.total_jobs}`) },
      { title: "Jobs by state", cell: (s) => el("span", { class: "chips" },
          Object.entries(s.job_counts).map(([k, n]) => el("span", { class: "state state-" + k }, `${k} ${n}`))) },
      { title: "Jobs/min", num: true, value: (s) => s.jobs_per_minute, cell: (s) => fmt(s.jobs_per_minute, 3) },
      { title: "ETA", num: true, value: (s) => s.eta_s, cell: (s) => (s.state === "running" ? fmtDuration(s.eta_s) : "done") },
      { title: "Designs", cell: (s) => s.architectures.join(", ") },
      { title: "Created", value: (s) => s.created_ms, cell: (s) => fmtTime(s.created_ms) },
    ];
    const pager = el("div", { class: "pager" },
      token ? el("button", { class: "small", onclick: () => { token = ""; current.tick(); } }, "first page") : null,
      next ? el("button", { class: "small", onclick: () => { token = next; current.tick(); } }, "next page") : null);
    box.replaceChildren(last.sweeps.length
      ? sortableTable(columns, last.sweeps, state, { id: "sweeps-table" })
      : el("p", { class: "muted" }, "No sweeps yet: submit one with ",
           el("code", {}, "depthbench submit SPEC.yaml"), "."), pager);
  };
  return {
    async tick() {
      last = await api("/api/sweeps?page_size=100" + (token ? "&page_token=" + esc(token) : ""));
      next = last.next_page_token;
      render();
    },
  };
}

// ---- #/sweep/NAME ----------------------------------------------------------

function sweepPage(view, name) {
  crumbs(el("a", { href: "#/" }, "sweeps"), el("a", { href: "#/sweep/" + esc(name) }, name));
  const summary = el("div", { id: "sweep-summary" });
  const results = el("div", { id: "results" });
  const figure = el("div", { class: "chart", id: "aspect-chart" });
  const curves = el("div", { class: "chart", id: "live-chart" });
  const curvesNote = el("p", { class: "muted" });
  const runsBox = el("div", { id: "runs" });
  view.append(el("h1", {}, "Sweep ", el("code", {}, name)), summary,
    el("h2", {}, "Results (best LR highlighted)"), results,
    el("div", { class: "grid2" },
      el("div", {}, el("h2", {}, "Validation loss vs aspect ratio d/L (best LR)"), figure),
      el("div", {}, el("h2", {}, "Training loss of selected runs (live)"), curvesNote, curves)),
    el("h2", {}, "Runs"), runsBox);

  const figChart = lineChart(figure, { xLabel: "aspect ratio d/L", yLabel: "val loss", logX: true });
  const liveChart = lineChart(curves, { xLabel: "step", yLabel: "training loss", points: false });
  const resultsState = tableState(() => renderResults());
  const runsState = tableState(() => renderRuns());
  let res = null, runs = null, runsToken = "", runsNext = "";
  const selected = new Set();   // job ids picked by the user
  let autoSelect = true;        // until the user picks, follow running runs
  const curveData = new Map();  // job id -> {since, points: Map(step -> loss), label}

  const renderResults = () => {
    if (!res) return;
    const lrCols = res.lrs.map((lr) => ({
      title: "LR " + fmtLr(lr), num: true,
      value: (r) => { const c = r.lrs.find((l) => l.lr === lr); return c ? c.val_loss : null; },
      cls: (r) => "lr" + (r.best_lr === lr ? " best" : ""),
      cell: (r) => {
        const c = r.lrs.find((l) => l.lr === lr);
        if (!c) return "";
        const parts = [];
        if (c.val_loss !== null) parts.push(fmt(c.val_loss));
        if (c.diverged_runs) parts.push(el("span", { class: "mark-diverged", title: `${c.diverged_runs} run(s) diverged` }, " diverged"));
        if (c.failed_runs) parts.push(el("span", { class: "mark-failed", title: `${c.failed_runs} run(s) failed` }, " failed"));
        if (!parts.length) parts.push(el("span", { class: "muted" }, "…"));
        return el("span", {}, parts);
      },
    }));
    const d = (r, k) => (r.diagnostics ? r.diagnostics[k] : null);
    const columns = [
      { title: "Design", value: (r) => r.arch, cell: (r) => r.arch },
      { title: "L", num: true, value: (r) => r.layers, cell: (r) => r.layers },
      { title: "d", num: true, value: (r) => r.d_model, cell: (r) => r.d_model },
      { title: "d/L", num: true, value: (r) => r.aspect_ratio, cell: (r) => fmt(r.aspect_ratio, 3) },
      { title: "Params", num: true, value: (r) => r.params, cell: (r) => fmt(r.params) },
      ...lrCols,
      { title: "Best LR", num: true, value: (r) => r.best_lr, cell: (r) => fmtLr(r.best_lr) },
      { title: "Best val loss", num: true, value: (r) => r.best_val_loss,
        cell: (r) => (r.best_job_id ? el("a", { href: "#/job/" + r.best_job_id }, fmt(r.best_val_loss)) : "–") },
      { title: "R_causal", num: true, value: (r) => d(r, "r_causal"), cell: (r) => fmt(d(r, "r_causal"), 3) },
      { title: "R_perm", num: true, value: (r) => d(r, "r_perm"), cell: (r) => fmt(d(r, "r_perm"), 3) },
      { title: "D_eff/L", num: true, value: (r) => d(r, "deff_over_l"), cell: (r) => fmt(d(r, "deff_over_l"), 3) },
      { title: "Diagnosed", value: (r) => r.diagnosed_job_id,
        cell: (r) => (r.diagnosed_job_id ? el("a", { href: "#/job/" + r.diagnosed_job_id }, "job " + r.diagnosed_job_id) : "–") },
      { title: "Done", value: (r) => (r.complete ? 1 : 0), cell: (r) => (r.complete ? "yes" : "running") },
    ];
    results.replaceChildren(res.rows.length
      ? sortableTable(columns, res.rows, resultsState, { id: "results-table" })
      : el("p", { class: "muted" }, "No result rows yet."));
    figChart.update(Object.entries(res.loss_vs_aspect_ratio).map(([arch, pts]) => ({
      label: arch,
      points: new Map(pts.filter((p) => p.val_loss !== null).map((p) => [p.aspect_ratio, p.val_loss])),
    })));
  };

  const renderRuns = () => {
    if (!runs) return;
    const columns = [
      { title: "Plot", cell: (r) => el("input", { type: "checkbox", checked: selected.has(r.job_id),
          "aria-label": "plot job " + r.job_id,
          onchange: (e) => { autoSelect = false; if (e.target.checked) selected.add(r.job_id); else selected.delete(r.job_id); current.tick(); } }) },
      { title: "Job", num: true, value: (r) => r.job_id, cell: (r) => el("a", { href: "#/job/" + r.job_id }, String(r.job_id)) },
      { title: "Design", value: (r) => r.arch, cell: (r) => r.arch },
      { title: "L", num: true, value: (r) => r.layers, cell: (r) => r.layers },
      { title: "d", num: true, value: (r) => r.d_model, cell: (r) => r.d_model },
      { title: "LR", num: true, value: (r) => r.lr, cell: (r) => fmtLr(r.lr) },
      { title: "Seed", num: true, value: (r) => r.seed, cell: (r) => r.seed },
      { title: "State", value: (r) => r.state, cell: (r) => stateBadge(r.state) },
      { title: "Val loss", num: true, value: (r) => r.val_loss, cell: (r) => fmt(r.val_loss),
        cls: (r) => (r.is_best ? "best" : "") },
      { title: "Steps", num: true, value: (r) => r.final_step, cell: (r) => fmt(r.final_step) },
    ];
    const pager = el("div", { class: "pager" },
      runsToken ? el("button", { class: "small", onclick: () => { runsToken = ""; current.tick(); } }, "first page") : null,
      runsNext ? el("button", { class: "small", onclick: () => { runsToken = runsNext; current.tick(); } }, "next page") : null,
      el("span", { class: "muted" }, `${runs.runs.length} runs on this page`));
    runsBox.replaceChildren(sortableTable(columns, runs.runs, runsState, { id: "runs-table" }), pager);
  };

  const pollCurves = async () => {
    let anyRunning = false;
    if (autoSelect && runs) {
      const running = runs.runs.filter((r) => r.state === "running" || r.state === "leased").map((r) => r.job_id);
      anyRunning = running.length > 0;
      if (running.length) {
        // Keep showing runs that finished while selected, add the new ones.
        for (const id of running) if (selected.size < 6) selected.add(id);
      } else if (!selected.size && res) {
        res.rows.forEach((r) => { if (r.best_job_id && selected.size < 6) selected.add(r.best_job_id); });
      }
    }
    for (const id of [...curveData.keys()]) if (!selected.has(id)) curveData.delete(id);
    for (const id of selected) {
      let c = curveData.get(id);
      if (!c) {
        const run = runs && runs.runs.find((r) => r.job_id === id);
        c = { since: 0, points: new Map(), label: run ? `#${id} ${run.arch} L${run.layers} lr ${fmtLr(run.lr)}` : `#${id}` };
        curveData.set(id, c);
      }
      for (let i = 0; i < 20; i++) {  // follow `more` for long histories
        const p = await api(`/api/jobs/${id}/points?names=loss&since=${c.since}`);
        const s = p.series.loss;
        if (s) s.step.forEach((step, k) => c.points.set(step, s.value[k]));
        c.since = p.next_since;
        if (!p.more) break;
      }
    }
    curvesNote.textContent = !selected.size ? "Tick runs below to plot their training loss."
      : !autoSelect ? "The runs ticked below."
      : anyRunning ? "Following the runs that train now (tick runs below to choose)."
      : "No run trains now: the runs followed before, or each group's best (tick runs below to choose).";
    liveChart.update([...curveData.values()].map((c) => ({ label: c.label, points: c.points })));
  };

  return {
    async tick() {
      const s = await api("/api/sweeps/" + esc(name));
      summary.replaceChildren(el("p", {}, stateBadge(s.state), ` ${s.done_jobs} of ${s.total_jobs} jobs done; `,
        Object.entries(s.job_counts).map(([k, n]) => `${k} ${n}`).join(", "),
        s.state === "running" ? `; ${fmt(s.jobs_per_minute, 3)} jobs/min, ETA ${fmtDuration(s.eta_s)}` : ""));
      res = await api("/api/sweeps/" + esc(name) + "/results");
      renderResults();
      runs = await api(`/api/sweeps/${esc(name)}/runs?page_size=100` + (runsToken ? "&page_token=" + esc(runsToken) : ""));
      runsNext = runs.next_page_token;
      renderRuns();
      await pollCurves();
    },
    destroy() { figChart.destroy(); liveChart.destroy(); },
  };
}

// ---- #/job/ID --------------------------------------------------------------

function jobPage(view, id) {
  crumbs(el("a", { href: "#/" }, "sweeps"), el("span", { id: "job-crumb" }, "job " + id));
  const info = el("div", { id: "job-info" });
  const attempts = el("div", { id: "attempts" });
  const chart = el("div", { class: "chart", id: "job-chart" });
  const diag = el("div", { id: "diagnostics" });
  view.append(el("h1", {}, "Job ", String(id)), info,
    el("h2", {}, "Attempts"), attempts,
    el("h2", {}, "Loss"), chart,
    el("h2", {}, "Diagnostics"), diag);
  const lc = lineChart(chart, { xLabel: "step", yLabel: "loss", points: false });
  const series = { loss: new Map(), val_loss: new Map() };
  let since = 0, diagShown = false, job = null;
  const attemptsState = tableState(() => renderAttempts());
  const renderAttempts = () => {
    if (!job) return;
    attempts.replaceChildren(job.attempts.length ? sortableTable([
      { title: "#", num: true, value: (a) => a.number, cell: (a) => a.number },
      { title: "Worker", value: (a) => a.worker_id, cell: (a) => a.worker_id },
      { title: "Started", value: (a) => a.start_ms, cell: (a) => fmtTime(a.start_ms) },
      { title: "Duration", num: true, value: (a) => (a.end_ms ? a.end_ms - a.start_ms : null),
        cell: (a) => (a.end_ms ? fmtDuration((a.end_ms - a.start_ms) / 1000) : "running") },
      { title: "Outcome", value: (a) => a.outcome, cell: (a) => stateBadge(a.outcome) },
      { title: "Resumed from", num: true, value: (a) => a.resumed_from_step, cell: (a) => fmt(a.resumed_from_step) },
      { title: "Reason", cls: () => "reason", cell: (a) => a.reason || "" },
    ], job.attempts, attemptsState, { id: "attempts-table" }) : el("p", { class: "muted" }, "Not started yet."));
  };
  return {
    async tick() {
      job = await api("/api/jobs/" + id);
      $("#job-crumb").replaceChildren(el("a", { href: "#/sweep/" + esc(job.sweep) }, job.sweep), " / job " + id);
      info.replaceChildren(el("dl", { class: "kv" },
        el("dt", {}, "state"), el("dd", {}, stateBadge(job.state), job.is_best ? " best LR of its group" : ""),
        el("dt", {}, "kind"), el("dd", {}, job.kind, job.parent_job_id ? [" of ", el("a", { href: "#/job/" + job.parent_job_id }, "job " + job.parent_job_id)] : ""),
        el("dt", {}, "design, shape"), el("dd", {}, `${job.arch}, L=${job.layers}, d=${job.d_model}`),
        el("dt", {}, "learning rate, seed"), el("dd", {}, `${fmtLr(job.lr)}, ${job.seed}`),
        el("dt", {}, "val loss"), el("dd", {}, fmt(job.val_loss)),
        el("dt", {}, "attempts"), el("dd", {}, `${job.attempts_used} of ${job.max_attempts}`),
        el("dt", {}, "reason"), el("dd", {}, job.reason || "–")));
      renderAttempts();
      for (let i = 0; i < 20; i++) {
        const p = await api(`/api/jobs/${id}/points?names=loss,val_loss&since=${since}`);
        for (const [name, s] of Object.entries(p.series)) {
          s.step.forEach((step, k) => series[name].set(step, s.value[k]));
        }
        since = p.next_since;
        if (!p.more) break;
      }
      lc.update([{ label: "training loss", points: series.loss }, { label: "val loss", points: series.val_loss }]);
      chart.dataset.state = job.state;
      if (!diagShown) {
        const d = await api(`/api/jobs/${id}/diagnostics`);
        const data = d.data || {};
        const maps = [];
        if (data.angular && Array.isArray(data.angular.matrix)) maps.push(heatmap("angular distance [l][n]", data.angular.matrix, { rowLabel: "l", colLabel: "n" }));
        if (data.causal && Array.isArray(data.causal.matrix)) maps.push(heatmap(`causal [s][l], R_causal ${fmt(data.causal.r_causal, 3)}`, data.causal.matrix, { rowLabel: "s", colLabel: "l" }));
        if (data.permutation && Array.isArray(data.permutation.matrix)) maps.push(heatmap(`permutation [l1][l2], R_perm ${fmt(data.permutation.r_perm, 3)}`, data.permutation.matrix, { rowLabel: "l1", colLabel: "l2" }));
        if (maps.length) {
          const s = d.summary || {};
          diag.replaceChildren(el("p", {}, `Of job ${d.diagnosed_job_id}: R_causal ${fmt(s.r_causal, 3)}, R_perm ${fmt(s.r_perm, 3)}, D_eff/L ${fmt(s.deff_over_l, 3)}; kinds: ${(s.kinds || []).join(", ")}`),
            el("div", { class: "heatmaps" }, maps));
          diagShown = true;
        } else {
          diag.replaceChildren(el("p", { class: "muted" }, job.kind === "train"
            ? "None: diagnostics run on each group's best-LR run once the group is complete."
            : "None reported yet."));
        }
      }
    },
    destroy() { lc.destroy(); },
  };
}

// ---- start -----------------------------------------------------------------

$("#login-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("#token").value.trim());
  $("#token").value = "";
  route();
});
$("#logout").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); showLogin(""); });
window.addEventListener("hashchange", route);
route();
