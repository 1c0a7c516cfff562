// lodestar dashboard: one page, four views chosen by the path (/, /runs/ID, /sessions/ID, /sessions/ID/calls/N).
// Plain JS, no build step: it fetches the JSON under /api and draws with uPlot (vendored, served locally).
// Text from the run is only ever set as textContent (never parsed as HTML).
"use strict";

const REFRESH_MS = 3000;
const main = document.getElementById("main");
let timer = null;
let plots = [];

function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "style") node.style.cssText = value;
    else node.setAttribute(key, value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

const fmt = (value, digits = 3) =>
  value === null || value === undefined ? "–" : typeof value === "number" ? +value.toFixed(digits) + "" : String(value);
const secs = (value) => (value ? value.toFixed(2) + " s" : "–");
const link = (href, text) => h("a", { href }, text);
const shortId = (id) => (id.length > 18 ? id.slice(0, 18) + "…" : id);

async function api(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(`${response.status}: ${body.error || response.statusText}`);
  return body;
}

function show(...nodes) {
  main.replaceChildren(...nodes.flat(Infinity).filter((node) => node !== null && node !== undefined));
}

function crumbs(...items) {
  const node = document.getElementById("crumbs");
  node.replaceChildren(...items.flatMap((item) => [" / ", item]));
}

function live(running) {
  document.getElementById("live").textContent = running ? "live: refreshing every 3 s" : "";
}

function table(id, headers, rows) {
  return h("table", { id },
    h("thead", {}, h("tr", {}, headers.map((name, i) => h("th", { class: i === 0 ? "l" : null }, name)))),
    h("tbody", {}, rows));
}

// -- runs ------------------------------------------------------------------------------------------

function runCells(run) {
  const g = run.groups, s = run.sessions;
  return [
    h("td", { class: "l" }, link(`/runs/${run.run_id}`, run.run_id), run.name ? h("div", { class: "muted" }, run.name) : null),
    h("td", { class: `state-${run.state}` }, run.state),
    h("td", {}, h("span", { class: "bar" }, h("span", { style: `width:${Math.round(run.progress * 100)}%` })),
      ` ${g.complete}/${run.tasks}`),
    h("td", {}, run.policy_version), h("td", {}, run.steps), h("td", {}, fmt(run.reward_mean)),
    h("td", {}, g.delivered), h("td", {}, g.trained), h("td", {}, g.stale), h("td", {}, g.no_signal),
    h("td", {}, s.scored), h("td", {}, s.timed_out), h("td", {}, s.running), h("td", {}, s.pending),
    h("td", {}, s.failed), h("td", {}, s.cancelled), h("td", {}, run.infra_failures),
  ];
}

const RUN_HEADERS = ["run", "state", "groups complete", "policy", "steps", "reward mean", "delivered", "trained",
  "stale", "no signal", "scored", "timed out", "running", "pending", "failed", "cancelled", "infra failures"];

async function showRuns() {
  crumbs("runs");
  const { runs } = await api("/api/runs");
  const rows = runs.map((run) => h("tr", { "data-run-id": run.run_id }, runCells(run)));
  show(h("h1", {}, "Runs"),
    runs.length ? table("runs-table", RUN_HEADERS, rows) : h("p", { class: "muted" }, "no runs yet"));
  live(runs.some((run) => run.state === "running"));
  return runs.some((run) => run.state === "running");
}

// -- one run ---------------------------------------------------------------------------------------

const COLORS = ["#3b7be0", "#e0663b", "#1b9e77", "#8a6fd1", "#c9a227"];

function chart(title, steps, names, values) {
  const box = h("div", { class: "chart", "data-title": title }, h("div", { class: "title" }, title));
  const series = [{ label: "step" }, ...names.map((name, i) => ({ label: name, stroke: COLORS[i % COLORS.length],
    width: 1.5, points: { show: steps.length < 60 } }))];
  const plot = new uPlot({ width: 380, height: 190, series, scales: { x: { time: false } },
    axes: [{ label: "step" }, {}] }, [steps, ...values], box);
  box.setAttribute("data-points", String(plot.data[0].length));
  plots.push(plot);
  return box;
}

function sampleCell(sample) {
  const advantage = sample.advantage;
  const kind = advantage > 0 ? "sample pos" : advantage < 0 ? "sample neg" : "sample";
  return h("div", { class: kind, "data-session-id": sample.session_id },
    link(`/sessions/${sample.session_id}`, `#${sample.sample}`), ` ${sample.status}`,
    h("div", {}, "reward ", fmt(sample.reward)),
    h("div", {}, "adv ", fmt(advantage)),
    sample.failures ? h("div", { class: "error" }, `${sample.failures} failed attempts`) : null);
}

async function showRun(runId) {
  const [detail, curves] = await Promise.all([api(`/api/runs/${runId}`), api(`/api/runs/${runId}/curves`)]);
  const run = detail.run;
  crumbs(link("/", "runs"), `run ${runId}`);
  plots.forEach((plot) => plot.destroy());
  plots = [];
  const charts = curves.charts.map((c) => chart(c.title, curves.steps, c.series, c.values));
  const failures = detail.failures.map((f) => h("tr", {}, h("td", { class: "l" }, f.cause), h("td", {}, f.count),
    h("td", { class: "l" }, f.sessions.map((id) => [link(`/sessions/${id}`, shortId(id)), " "]))));
  const groups = detail.groups.map((g) => h("tr", { "data-group-id": g.group_id },
    h("td", { class: "l" }, g.task_id), h("td", {}, g.status + (g.dropped ? " (stale)" : "")),
    h("td", {}, g.delivery_seq || "–"), h("td", {}, g.signal ? "yes" : "no"), h("td", {}, fmt(g.reward_mean)),
    h("td", { class: "l" }, h("div", { class: "samples" }, g.samples.map(sampleCell)))));
  show(
    h("h1", {}, `Run ${run.run_id} `, h("span", { class: `state-${run.state}` }, run.state)),
    table("run-summary", RUN_HEADERS, [h("tr", { "data-run-id": run.run_id }, runCells(run))]),
    h("p", { class: "muted" }, "mean seconds per stage: ",
      Object.entries(run.stage_seconds_mean).map(([k, v]) => `${k} ${v.toFixed(2)}`).join(", ") || "–"),
    h("h2", {}, `Training curves (${curves.steps.length} steps)`),
    charts.length ? h("div", { class: "charts", id: "charts" }, charts)
      : h("p", { class: "muted" }, "no metrics.jsonl for this run (yet): is --runs-dir the trainer's run_dir?"),
    h("h2", {}, `Infrastructure failures (${detail.failed_attempts} attempts)`),
    failures.length ? table("failures-table", ["cause", "attempts", "sessions"], failures)
      : h("p", { class: "muted" }, "none"),
    h("h2", {}, `Groups (${detail.groups.length}); advantage: ${detail.advantage}`),
    table("groups-table", ["task", "status", "delivered as", "signal", "reward mean", "samples"], groups));
  live(run.state === "running");
  return run.state === "running";
}

// -- one session -----------------------------------------------------------------------------------

function stageBar(stages) {
  const parts = ["init", "ready", "run", "post"].filter((k) => stages[k] > 0);
  const total = parts.reduce((sum, k) => sum + stages[k], 0) || 1;
  return h("div", { class: "stages" }, parts.map((k) =>
    h("span", { class: `st-${k}`, style: `width:${(100 * stages[k]) / total}%`, title: `${k} ${secs(stages[k])}` },
      `${k} ${stages[k].toFixed(1)}s`)));
}

function chainText(chain) {
  if (chain.continued_from !== null) return [`continues #${chain.continued_from} (${chain.reused_tokens} reused)`];
  const broken = chain.start === "drift";
  return [h("span", { class: broken ? "chainbreak" : null }, `new chain (${chain.start})`)];
}

async function showSession(sessionId, params) {
  const offset = Number(params.get("offset") || 0), limit = Number(params.get("limit") || 50);
  const view = await api(`/api/sessions/${sessionId}?offset=${offset}&limit=${limit}`);
  const s = view.session, r = view.result;
  crumbs(link("/", "runs"), link(`/runs/${s.run_id}`, `run ${s.run_id}`), `session ${sessionId}`);
  const starts = view.calls.map((c) => c.started_at).filter(Boolean);
  const t0 = Math.min(...starts), t1 = Math.max(...view.calls.map((c) => c.finished_at || 0));
  const span = t1 > t0 ? t1 - t0 : 1;
  const calls = view.calls.map((c) => h("tr", { "data-sequence": c.sequence },
    h("td", { class: "l" }, link(`/sessions/${sessionId}/calls/${c.sequence}`, `#${c.sequence}`)),
    h("td", { class: "l" }, h("div", { class: "timeline" }, c.started_at ? h("span", {
      style: `left:${(100 * (c.started_at - t0)) / span}%;width:${(100 * ((c.finished_at || c.started_at) - c.started_at)) / span}%` })
      : null)),
    h("td", {}, c.started_at ? secs(c.finished_at - c.started_at) : "–"), h("td", {}, fmt(c.first_token_ms, 0)),
    h("td", {}, c.prompt_tokens), h("td", {}, c.completion_tokens), h("td", {}, fmt(c.logprob_mean)),
    h("td", {}, c.finish_reason), h("td", {}, c.policy_version), h("td", { class: "l" }, chainText(c.chain)),
    h("td", { class: "l" }, c.dialect)));
  const pager = h("p", { class: "pager" },
    offset > 0 ? link(`?offset=${Math.max(offset - limit, 0)}&limit=${limit}`, "← previous") : null,
    h("span", {}, view.call_count ? `calls ${offset + 1}–${offset + view.calls.length} of ${view.call_count}` : "no calls"),
    offset + limit < view.call_count ? link(`?offset=${offset + limit}&limit=${limit}`, "next →") : null);
  const attempts = view.attempts.map((a) => h("tr", {}, h("td", { class: "l" }, a.attempt), h("td", {}, a.node_id),
    h("td", {}, a.outcome), h("td", { class: "l error" }, a.error),
    h("td", { class: "l" }, Object.entries(a.stage_seconds).map(([k, v]) => `${k} ${v.toFixed(2)}`).join(", "))));
  show(
    h("h1", {}, `Session ${sessionId}`),
    h("p", {}, `task ${s.task_id}, sample ${s.sample}, group ${s.group_id}: ${s.status}`,
      s.reward !== null ? `, reward ${fmt(s.reward)}` : "", s.outcome !== "unspecified" ? ` (${s.outcome})` : ""),
    r ? stageBar(r.stages) : null,
    r ? h("p", {}, `harness ${r.harness || "?"}, exit code ${r.exit_code}, node ${r.node_id}, attempt ${r.attempt}`,
      r.error ? h("span", { class: "error" }, ` error: ${r.error}`) : "") : h("p", { class: "muted" }, "no result yet"),
    h("h2", {}, "Attempts"), table("attempts-table", ["attempt", "node", "outcome", "error", "stage seconds"], attempts),
    h("h2", {}, `Calls (${view.call_count})`), pager,
    table("calls-table", ["call", "timeline", "duration", "first token ms", "prompt", "sampled", "mean logprob",
      "finish", "policy", "chain", "dialect"], calls),
    ...(r ? [h("h2", {}, "Verifier"), h("pre", { id: "verifier" }, JSON.stringify(r.verifier_details, null, 1)),
      h("h2", {}, "Final answer"), h("pre", {}, r.final_answer || "–"),
      h("h2", {}, "Harness stdout (tail)"), h("pre", { id: "stdout" }, r.stdout_tail || "–"),
      h("h2", {}, "Harness stderr (tail)"), h("pre", { id: "stderr" }, r.stderr_tail || "–")] : []));
  live(s.status === "running" || s.status === "pending");
  return s.status === "running" || s.status === "pending";
}

// -- one call --------------------------------------------------------------------------------------

function message(m) {
  const parts = [...m.content, ...(m.tool_result ? m.tool_result.content : [])];
  return h("div", { class: `msg ${m.role}` },
    h("div", { class: "role" }, m.role, m.tool_result ? ` (result of ${m.tool_result.name || m.tool_result.tool_call_id})` : ""),
    parts.map((p) => h("div", { class: `part ${p.kind}` }, p.text)),
    m.tool_calls.map((t) => h("div", { class: "part" }, `→ ${t.name}(${t.arguments})`)));
}

const sampling = (params) => Object.entries(params).map(([k, v]) => `${k}=${fmt(v)}`).join(" ") || "–";

function shade(logprob) {
  // p = exp(logprob): 1 -> white, 0 -> deep red.
  const p = Math.exp(logprob), light = Math.round(55 + 45 * p);
  return `background:hsl(4,85%,${light}%)`;
}

function tokenSpan(token, cls, decoded, withLogprob) {
  const text = decoded ? token.text : `${token.id} `;
  const title = withLogprob ? `id ${token.id}  logprob ${token.logprob.toFixed(4)}  p ${Math.exp(token.logprob).toFixed(3)}`
    : `id ${token.id}`;
  return h("span", { class: `tok ${cls}`, title, style: withLogprob ? shade(token.logprob) : null,
    "data-logprob": withLogprob ? token.logprob.toFixed(4) : null }, text);
}

async function showCall(sessionId, sequence) {
  const c = await api(`/api/sessions/${sessionId}/calls/${sequence}`);
  crumbs(link("/", "runs"), link(`/sessions/${sessionId}`, `session ${sessionId}`), `call #${sequence}`);
  const shared = Math.max(c.prompt_shared - c.prompt_cut, 0);
  const prompt = c.prompt.map((t, i) => tokenSpan(t, i < shared ? "shared" : "new", c.decoded, false));
  const sampled = c.sampled.map((t) => tokenSpan(t, "sampled", c.decoded, true));
  const nav = h("p", { class: "pager" },
    sequence > 0 ? link(`/sessions/${sessionId}/calls/${sequence - 1}`, "← previous call") : null,
    h("span", {}, `call #${sequence} of ${c.call_count}`),
    sequence + 1 < c.call_count ? link(`/sessions/${sessionId}/calls/${sequence + 1}`, "next call →") : null);
  const chainLine = c.chain.continued_from !== null
    ? h("p", { id: "chain" }, "chain: extends ", link(`/sessions/${sessionId}/calls/${c.chain.continued_from}`,
      `call #${c.chain.continued_from}`), `: its first ${c.chain.reused_tokens} prompt tokens are that call's tokens`)
    : h("p", { id: "chain" }, "chain: ", chainText(c.chain));
  show(
    h("h1", {}, `Call #${sequence}`), nav, chainLine,
    h("p", {}, `${c.dialect}, policy ${c.policy_version}, finish ${c.finish_reason}, ${c.prompt_tokens} prompt + `,
      `${c.completion_tokens} sampled tokens, mean logprob ${fmt(c.logprob_mean)}; sampling `,
      sampling(c.sampling), " (asked ", sampling(c.requested_sampling), ")"),
    h("h2", {}, "Sampled tokens, shaded by logprob"),
    h("p", { class: "legend" }, h("span", { style: shade(0) }, "p = 1"), h("span", { style: shade(Math.log(0.5)) }, "p = 0.5"),
      h("span", { style: shade(Math.log(0.05)) }, "p = 0.05"), c.decoded ? "" : " (token ids: start with --model to decode)"),
    h("div", { class: "tokens", id: "sampled-tokens" }, sampled),
    c.completion_cut ? h("p", { class: "muted" }, `… ${c.completion_cut} more sampled tokens not shown`) : null,
    h("h2", {}, "Reply as the harness got it"), message(c.completion),
    h("h2", {}, `Conversation (${c.messages.length} messages; tools: ${c.tools.join(", ") || "none"})`),
    h("div", { id: "conversation" }, c.messages.map(message)),
    h("h2", {}, "Prompt tokens"),
    h("p", { class: "legend" }, h("span", { class: "tok shared" }, "from the chained call"),
      h("span", { class: "tok new" }, "new in this call"),
      c.prompt_cut ? ` (first ${c.prompt_cut} tokens not shown)` : ""),
    h("div", { class: "tokens", id: "prompt-tokens" }, prompt),
    h("details", {}, h("summary", {}, "Request body as received"), h("pre", {}, c.original_request)));
  live(false);
  return false;
}

// -- routing ---------------------------------------------------------------------------------------

async function render() {
  const path = location.pathname, params = new URLSearchParams(location.search);
  let m;
  if ((m = path.match(/^\/sessions\/([^/]+)\/calls\/(\d+)$/))) return showCall(decodeURIComponent(m[1]), Number(m[2]));
  if ((m = path.match(/^\/sessions\/([^/]+)$/))) return showSession(decodeURIComponent(m[1]), params);
  if ((m = path.match(/^\/runs\/([^/]+)$/))) return showRun(decodeURIComponent(m[1]));
  return showRuns();
}

async function refresh() {
  clearTimeout(timer);
  try {
    if (await render()) timer = setTimeout(refresh, REFRESH_MS);
    document.body.setAttribute("data-ready", "1");
  } catch (error) {
    show(h("p", { class: "error", id: "error" }, String(error.message || error)));
    document.body.setAttribute("data-ready", "1");
  }
}

refresh();
