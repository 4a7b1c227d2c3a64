// The labelrm web console: a single page over the RM's JSON endpoints (/api/...).
// Preact + htm, vendored (vendor/README.txt): no build step, no CDN.
import { html, render, useState, useEffect, useMemo } from "./vendor/htm-preact.mjs";

const POLL_MS = 2000; // live updates: every page re-reads its endpoint this often
const TOKEN_KEY = "labelrm.token";

// ----- data ------------------------------------------------------------------------------

// X-Labelrm-Console: the console takes a change only with it (and this page's Origin):
// no form on another site can send it (rm_server/console/guard.py).
async function api(path, method = "GET") {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = { "X-Labelrm-Console": "1" };
  if (token) headers.Authorization = "Bearer " + token;
  const r = await fetch(path, { method, headers, cache: "no-store" });
  const body = await r.json().catch(() => ({ error: r.statusText }));
  if (!r.ok) {
    const err = new Error(body.error || r.statusText);
    err.status = r.status;
    throw err;
  }
  return body;
}

// Reads `path` now and every POLL_MS; returns {data, error}.
function usePoll(path) {
  const [state, setState] = useState({ data: null, error: null });
  useEffect(() => {
    let live = true;
    let timer = null;
    setState({ data: null, error: null });
    const tick = async () => {
      try {
        const data = await api(path);
        if (live) setState({ data, error: null });
      } catch (error) {
        if (live) setState((s) => ({ data: error.status === 403 || error.status === 404 ? null : s.data, error }));
        if (error.status === 401) window.dispatchEvent(new Event("labelrm-signed-out"));
      }
      if (live) timer = setTimeout(tick, POLL_MS);
    };
    tick();
    return () => { live = false; clearTimeout(timer); };
  }, [path]);
  return state;
}

function useNow(ms = 1000) {
  const [now, setNow] = useState(Date.now());
  useEffect(() => { const t = setInterval(() => setNow(Date.now()), ms); return () => clearInterval(t); }, [ms]);
  return now;
}

// ----- formatting ------------------------------------------------------------------------

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
function bytes(n) {
  let i = 0; let v = n;
  while (Math.abs(v) >= 1024 && i < UNITS.length - 1) { v /= 1024; i++; }
  return (i ? v.toFixed(v < 10 ? 1 : 0) : v) + " " + UNITS[i];
}
function qty(dim, n) {
  if (n === undefined || n === null) return "–";
  if (dim.endsWith("bytes")) return bytes(n);
  if (dim.endsWith("millis")) return (n / 1000).toFixed(n % 1000 ? 1 : 0) + " cores";
  return String(n);
}
const DIM_NAME = { memory_bytes: "memory", cpu_millis: "cpu", instances: "instances" };
const dimName = (d) => DIM_NAME[d] || d.replace(/_/g, " ");
function resText(r) {
  if (!r) return "–";
  const parts = Object.entries(r.dims).map(([d, n]) => dimName(d) + " " + qty(d, n));
  return (r.queue ? "queue " + r.queue + ": " : "") + parts.join(", ");
}
const dim = (r, d) => (r && r.dims[d]) || 0;
// what an EngineConn's agent measured from its cgroup
function usageText(u) {
  if (!u) return "–";
  return `memory ${bytes(u.memory_bytes)} (peak ${bytes(u.memory_peak_bytes)}), cpu ${qty("cpu_millis", u.cpu_millis)}, cpu time ${(u.cpu_time_micros / 1e6).toFixed(1)} s`;
}
const isolationText = (i) => (!i ? "–" : i.mode === "none" ? "none (not contained)" : `${i.mode} (${i.controllers.join(", ")})`);

function ago(iso, now) {
  if (!iso) return "–";
  const s = Math.round((now - Date.parse(iso)) / 1000);
  const a = Math.abs(s);
  const txt = a < 60 ? a + " s" : a < 3600 ? Math.round(a / 60) + " min" : a < 86400 ? Math.round(a / 3600) + " h" : Math.round(a / 86400) + " d";
  return s >= 0 ? txt + " ago" : "in " + txt;
}
function When({ at }) {
  const now = useNow();
  if (!at) return html`<span class="muted">–</span>`;
  return html`<time datetime=${at} title=${new Date(at).toLocaleString() + " (" + at + ")"}>${ago(at, now)}</time>`;
}
const Pill = ({ s }) => html`<span class="pill st-${s}">${s}</span>`;
const Labels = ({ labels }) => Object.entries(labels || {}).map(([k, v]) => html`<span class="pill">${k}=${v}</span>`);
const link = (kind, id) => html`<a href=${"#/" + kind + "/" + encodeURIComponent(id)}>${id}</a>`;

// used / locked / reserved / protected of `max`, for one dimension
function Bar({ d, max, used, locked, reserved, protectedR }) {
  const m = dim(max, d);
  if (!m) return html`<span class="muted">no maximum</span>`;
  let x = 0;
  const seg = (cls, v) => {
    const w = Math.max(0, Math.min(100 - x, (100 * v) / m));
    const el = html`<span class=${cls} style=${"left:" + x + "%;width:" + w + "%"}></span>`;
    x += w;
    return el;
  };
  const u = dim(used, d), l = dim(locked, d), r = dim(reserved, d), p = dim(protectedR, d);
  const title = `${dimName(d)}: used ${qty(d, u)}, locked ${qty(d, l)}, reserved ${qty(d, r)}, protected ${qty(d, p)} of ${qty(d, m)}`;
  return html`<span class="bar" title=${title}>${seg("used", u)}${seg("locked", l)}${seg("reserved", r)}${seg("protected", p)}</span>`;
}
const Legend = () => html`<div class="legend muted"><span style="background:var(--used)"></span>used<span style="background:var(--locked)"></span>locked<span style="background:var(--reserved)"></span>reserved<span style="background:var(--protected)"></span>protected</div>`;

// ----- a list that filters and sorts -----------------------------------------------------

function Table({ rows, cols, name, empty }) {
  const [filter, setFilter] = useState("");
  const [sort, setSort] = useState({ i: 0, dir: 1 });
  const shown = useMemo(() => {
    const f = filter.trim().toLowerCase();
    const keep = f ? rows.filter((r) => cols.some((c) => String(c.v(r) ?? "").toLowerCase().includes(f)) || JSON.stringify(r).toLowerCase().includes(f)) : rows.slice();
    const c = cols[sort.i];
    keep.sort((a, b) => {
      const x = c.v(a), y = c.v(b);
      return (x === y ? 0 : x === null || x === undefined ? -1 : y === null || y === undefined ? 1 : x < y ? -1 : 1) * sort.dir;
    });
    return keep;
  }, [rows, filter, sort]);
  const head = (c, i) => html`<th onClick=${() => setSort({ i, dir: sort.i === i ? -sort.dir : 1 })}>${c.h}${sort.i === i ? (sort.dir > 0 ? " ▲" : " ▼") : ""}</th>`;
  return html`<div>
    <input class="filter" placeholder="filter…" value=${filter} onInput=${(e) => setFilter(e.target.value)} data-testid=${name + "-filter"}/>
    <span class="muted"> ${shown.length} of ${rows.length}</span>
    <table data-testid=${name + "-table"}><thead><tr>${cols.map(head)}</tr></thead>
      <tbody>${shown.length ? shown.map((r) => html`<tr data-id=${r.id || r.instance || r.label || ""}>${cols.map((c) => html`<td>${c.r ? c.r(r) : c.v(r)}</td>`)}</tr>`) : html`<tr><td colspan=${cols.length} class="muted">${empty || "nothing here"}</td></tr>`}</tbody>
    </table></div>`;
}

function Loading({ state }) {
  if (state.error) return html`<p class="error" data-testid="error">${state.error.status || ""} ${state.error.message}</p>`;
  return html`<p class="muted">loading…</p>`;
}

// ----- pages -----------------------------------------------------------------------------

function Counts({ title, counts, testid }) {
  const entries = Object.entries(counts || {}).sort();
  const total = entries.reduce((s, [, n]) => s + n, 0);
  return html`<div class="card" data-testid=${testid}><h3>${title}</h3><div class="big" data-value=${total}>${total}</div>
    ${entries.map(([s, n]) => html`<div><${Pill} s=${s}/> <span data-state=${s}>${n}</span></div>`)}</div>`;
}

function totals(labels) {
  // The cluster: every ECM's record (source "ecm"); per dimension.
  const out = {};
  for (const r of labels.filter((x) => x.source === "ecm")) {
    for (const [field, res] of [["max", r.max], ["used", r.used], ["locked", r.locked], ["reserved", r.reserved], ["protected", r.protected], ["left", r.left]]) {
      if (!res) continue;
      for (const [d, n] of Object.entries(res.dims)) {
        out[d] = out[d] || { max: 0, used: 0, locked: 0, reserved: 0, protected: 0, left: 0 };
        out[d][field] += n;
      }
    }
  }
  return out;
}

function load(r) {
  // the largest share of its maximum any dimension of a label uses
  if (!r.max) return 0;
  return Math.max(0, ...Object.entries(r.max.dims).map(([d, m]) => (m ? (dim(r.used, d) + dim(r.locked, d) + dim(r.reserved, d)) / m : 0)));
}

function Overview() {
  const st = usePoll("/api/overview");
  if (!st.data) return html`<${Loading} state=${st}/>`;
  const o = st.data;
  const t = totals(o.labels);
  const loaded = o.labels.filter((r) => r.max).sort((a, b) => load(b) - load(a)).slice(0, 8);
  const users = Object.entries(o.tickets_by_user).sort((a, b) => b[1] - a[1]).slice(0, 8);
  return html`<h1>Overview</h1>
  <div class="cards">
    <${Counts} title="Nodes" counts=${o.nodes} testid="nodes-by-state"/>
    <${Counts} title=${o.scope === "all" ? "EngineConns" : "My EngineConns"} counts=${o.engine_conns} testid="ecs-by-state"/>
    <${Counts} title=${o.scope === "all" ? "Demands" : "My demands"} counts=${o.demands} testid="demands-by-state"/>
    <div class="card"><h3>Waiting applies</h3><div class="big" data-testid="waiting-applies">${o.waiting_applies}</div></div>
    <div class="card"><h3>RM replicas · database</h3><div class="big">${o.replicas.length}</div>
      ${o.replicas.map((r) => html`<div class="muted">${r.host} pid ${r.pid}, up since <${When} at=${r.started_at}/></div>`)}
      <div>database: <span class="ok">${o.database}</span></div></div>
    ${o.consistency && html`<div class="card" data-testid="consistency"><h3>Consistency</h3>
      <div class=${"big " + (o.consistency.mismatches.length ? "bad" : "ok")} data-testid="mismatches">${o.consistency.mismatches.length}</div> mismatches
      <div class="muted"><span data-testid="labels-checked">${o.consistency.labels_checked}</span> labels, <span data-testid="tickets-checked">${o.consistency.tickets_checked}</span> tickets checked</div></div>`}
  </div>
  <h2>Cluster resources (all nodes)</h2><${Legend}/>
  <table class="dims" data-testid="totals"><thead><tr><th>dimension</th><th>total</th><th>used</th><th>locked</th><th>reserved</th><th>protected</th><th>left</th><th></th></tr></thead><tbody>
    ${Object.entries(t).map(([d, v]) => html`<tr data-dim=${d}><td>${dimName(d)}</td>
      ${["max", "used", "locked", "reserved", "protected", "left"].map((f) => html`<td data-field=${f} data-value=${v[f]}>${qty(d, v[f])}</td>`)}
      <td><${Bar} d=${d} max=${{ dims: { [d]: v.max } }} used=${{ dims: { [d]: v.used } }} locked=${{ dims: { [d]: v.locked } }} reserved=${{ dims: { [d]: v.reserved } }} protectedR=${{ dims: { [d]: v.protected } }}/></td></tr>`)}
  </tbody></table>
  <div class="cards" style="margin-top:12px">
    <div class="card" style="flex:2"><h3>Most loaded labels</h3>
      ${loaded.length ? loaded.map((r) => html`<div data-testid="loaded-label"><b>${Math.round(load(r) * 100)}%</b> <a href="#/resources">${r.label}</a>
        <div>${Object.keys(r.max.dims).map((d) => html`<span class="muted">${dimName(d)} </span><${Bar} d=${d} max=${r.max} used=${r.used} locked=${r.locked} reserved=${r.reserved} protectedR=${r.protected}/> `)}</div></div>`) : html`<span class="muted">no label has a maximum</span>`}</div>
    ${o.scope === "all" && html`<div class="card" style="flex:1"><h3>Most live tickets by user</h3>
      ${users.length ? users.map(([u, n]) => html`<div>${u}: ${n}</div>`) : html`<span class="muted">no live tickets</span>`}</div>`}
  </div>`;
}

const NODE_COLS = [
  { h: "instance", v: (n) => n.instance, r: (n) => link("nodes", n.instance) },
  { h: "state", v: (n) => n.state, r: (n) => html`<${Pill} s=${n.state}/>` },
  { h: "labels", v: (n) => Object.entries(n.labels).map((e) => e.join("=")).join(","), r: (n) => html`<${Labels} labels=${n.labels}/>` },
  { h: "total", v: (n) => dim(n.total, "memory_bytes"), r: (n) => resText(n.total) },
  { h: "use", v: (n) => dim(n.used, "memory_bytes") + dim(n.locked, "memory_bytes"), r: (n) => Object.keys(n.total.dims).map((d) => html`<div><${Bar} d=${d} max=${n.total} used=${n.used} locked=${n.locked} protectedR=${n.protected}/> <span class="muted">${dimName(d)}</span></div>`) },
  { h: "left", v: (n) => dim(n.left, "memory_bytes"), r: (n) => resText(n.left) },
  { h: "EngineConns", v: (n) => n.live_engine_conns },
  { h: "isolation", v: (n) => (n.isolation ? n.isolation.mode : ""), r: (n) => isolationText(n.isolation) },
  { h: "last heartbeat", v: (n) => n.last_heartbeat_at, r: (n) => html`<${When} at=${n.last_heartbeat_at}/>` },
  { h: "drain", v: (n) => (n.draining ? "draining" : ""), r: (n) => (n.draining ? html`<${Pill} s="DRAINING"/>` : "") },
];

function Nodes() {
  const st = usePoll("/api/nodes");
  if (!st.data) return html`<${Loading} state=${st}/>`;
  return html`<h1>Nodes</h1><${Legend}/><${Table} name="nodes" rows=${st.data.nodes} cols=${NODE_COLS} empty="no ECM registered"/>`;
}

const EC_COLS = [
  { h: "id", v: (e) => e.id, r: (e) => link("engineconns", e.id) },
  { h: "user", v: (e) => e.user },
  { h: "engine", v: (e) => e.engine },
  { h: "state", v: (e) => e.state, r: (e) => html`<${Pill} s=${e.state}/>` },
  { h: "node", v: (e) => e.node, r: (e) => (e.node ? link("nodes", e.node) : "–") },
  { h: "resources", v: (e) => dim(e.resource, "memory_bytes"), r: (e) => resText(e.resource) },
  { h: "measured", v: (e) => (e.measured ? e.measured.memory_bytes : 0), r: (e) => (e.measured ? bytes(e.measured.memory_bytes) + ", " + qty("cpu_millis", e.measured.cpu_millis) : "–") },
  { h: "age", v: (e) => e.created_at, r: (e) => html`<${When} at=${e.created_at}/>` },
  { h: "holder", v: (e) => e.holder },
];

function Node({ id }) {
  const st = usePoll("/api/nodes/" + encodeURIComponent(id));
  if (!st.data) return html`<${Loading} state=${st}/>`;
  const n = st.data.node;
  return html`<h1>Node ${n.instance} <${Pill} s=${n.state}/></h1>
  <div class="cards">
    <div class="card"><h3>Labels</h3><${Labels} labels=${n.labels}/><div data-testid="isolation">isolation: ${isolationText(n.isolation)}</div></div>
    <div class="card"><h3>Capacity</h3><${Legend}/>${Object.keys(n.total.dims).map((d) => html`<div><${Bar} d=${d} max=${n.total} used=${n.used} locked=${n.locked} protectedR=${n.protected}/> ${dimName(d)}: ${qty(d, dim(n.used, d))} used, ${qty(d, dim(n.locked, d))} locked of ${qty(d, dim(n.total, d))}</div>`)}
      <div class="muted">left: ${resText(n.left)}</div></div>
    <div class="card"><h3>Liveness</h3><div>last heartbeat <${When} at=${n.last_heartbeat_at}/></div><div>registered <${When} at=${n.registered_at}/></div><div>state changed <${When} at=${n.updated_at}/></div></div>
  </div>
  <h2>EngineConns on this node</h2><${Table} name="node-ecs" rows=${st.data.engine_conns} cols=${EC_COLS} empty="no EngineConn on this node"/>
  <h2>History</h2><${Table} name="node-history" rows=${history(st.data.engine_conns)} cols=${HISTORY_COLS} empty="nothing happened here yet"/>`;
}

// a node's history: the start, readiness and end of each EngineConn it ran
function history(ecs) {
  const out = [];
  for (const e of ecs) {
    out.push({ id: e.id + ":c", at: e.created_at, what: "EngineConn " + e.id + " requested by " + e.user, ec: e.id });
    if (e.ready_at) out.push({ id: e.id + ":r", at: e.ready_at, what: "EngineConn " + e.id + " ready", ec: e.id });
    if (e.ended_at) out.push({ id: e.id + ":e", at: e.ended_at, what: `EngineConn ${e.id} ended ${e.state}${e.reason ? ": " + e.reason : ""}`, ec: e.id });
  }
  return out.sort((a, b) => (a.at < b.at ? 1 : -1));
}
const HISTORY_COLS = [
  { h: "when", v: (x) => x.at, r: (x) => html`<${When} at=${x.at}/>` },
  { h: "event", v: (x) => x.what },
];

function EngineConns() {
  const st = usePoll("/api/engineconns");
  if (!st.data) return html`<${Loading} state=${st}/>`;
  return html`<h1>EngineConns</h1><${Table} name="ecs" rows=${st.data.engine_conns} cols=${EC_COLS} empty="no EngineConn"/>`;
}

function EngineConn({ id }) {
  const st = usePoll("/api/engineconns/" + encodeURIComponent(id));
  if (!st.data) return html`<${Loading} state=${st}/>`;
  const e = st.data.engine_conn;
  const events = [["requested", e.created_at], ["ready", e.ready_at], ["ended (" + e.state + ")", e.ended_at]].filter((x) => x[1]);
  const live = ["STARTING", "IDLE", "BUSY"].includes(e.state);
  return html`<h1>EngineConn ${e.id} <${Pill} s=${e.state}/> ${live && html`<${Kill} id=${e.id}/>`}</h1>
  <div class="cards">
    <div class="card"><h3>Owner</h3>${e.user} · ${e.engine}<div><${Labels} labels=${e.labels}/></div></div>
    <div class="card"><h3>Placement</h3>node ${e.node ? link("nodes", e.node) : "–"} · pid ${e.pid || "–"}<div class="muted">${e.address}</div><div>ticket ${e.ticket_id || "–"}</div><div>launch attempts ${e.launch_attempts}</div></div>
    <div class="card" data-testid="ec-resources"><h3>Resources</h3><div>requested: ${resText(e.resource)}</div><div>granted: ${resText(e.granted)}</div><div>measured: ${usageText(e.measured)} ${e.measured_at && html`<${When} at=${e.measured_at}/>`}</div></div>
    <div class="card"><h3>Holder</h3>${e.holder || "–"} ${e.hold_expires_at && html`<div>until <${When} at=${e.hold_expires_at}/></div>`}</div>
  </div>
  <h2>History</h2>${events.map(([w, at]) => html`<div>${w} <${When} at=${at}/></div>`)}${e.reason && html`<div class="muted">reason: ${e.reason}</div>`}
  <h2>ECM choice</h2><${Table} name="choices" rows=${e.ecm_choices} cols=${CHOICE_COLS} empty="no choice recorded"/>
  ${e.log_tail && html`<h2>Log tail</h2><pre data-testid="log-tail">${e.log_tail}</pre>`}`;
}
// KillEngineConn, through the same policy as the RPC (the owner or an admin)
function Kill({ id }) {
  const [msg, setMsg] = useState("");
  const kill = async () => {
    if (!confirm("Kill EngineConn " + id + "?")) return;
    try { await api("/api/engineconns/" + encodeURIComponent(id) + "/kill", "POST"); setMsg("kill sent"); }
    catch (e) { setMsg(e.message); }
  };
  return html`<button data-testid="kill" onClick=${kill}>kill</button> <small class="muted">${msg}</small>`;
}

const CHOICE_COLS = [
  { h: "node", v: (c) => c.node, r: (c) => link("nodes", c.node) },
  { h: "eligible", v: (c) => (c.eligible ? "yes" : "no") },
  { h: "score", v: (c) => c.score, r: (c) => c.score.toFixed(3) },
  { h: "reasons", v: (c) => c.reasons.join("; ") },
];

function Resources() {
  const st = usePoll("/api/resources");
  if (!st.data) return html`<${Loading} state=${st}/>`;
  const rows = st.data.labels;
  const cols = [
    { h: "label", v: (r) => r.label },
    { h: "source", v: (r) => r.source },
    { h: "use", v: load, r: (r) => (r.max ? Object.keys(r.max.dims).map((d) => html`<div><${Bar} d=${d} max=${r.max} used=${r.used} locked=${r.locked} reserved=${r.reserved} protectedR=${r.protected}/> ${dimName(d)}</div>`) : html`<span class="muted">no maximum</span>`) },
    { h: "used", v: (r) => dim(r.used, "memory_bytes"), r: (r) => resText(r.used) },
    { h: "locked", v: (r) => dim(r.locked, "memory_bytes"), r: (r) => resText(r.locked) },
    { h: "max", v: (r) => dim(r.max, "memory_bytes"), r: (r) => resText(r.max) },
    { h: "left", v: (r) => dim(r.left, "memory_bytes"), r: (r) => resText(r.left) },
    { h: "tickets", v: (r) => r.live_tickets },
    { h: "limit that applies", v: (r) => r.limit || "", r: (r) => r.limit || html`<span class="muted">–</span>` },
  ];
  return html`<h1>Resources and limits</h1><${Legend}/>
  <${Table} name="resources" rows=${rows} cols=${cols} empty="no label has a record"/>
  <div class="cards" style="margin-top:12px">
    <${Groups} title="By user" groups=${st.data.by_user} testid="by-user"/>
    <${Groups} title="By engine type" groups=${st.data.by_engine_type} testid="by-engine-type"/>
  </div>
  ${rows.some((r) => r.source === "external") && html`<h2>External queues</h2><${Table} name="queues" rows=${rows.filter((r) => r.source === "external")} cols=${cols.slice(0, 8)}/>`}
  ${st.data.providers && html`<h2>External providers</h2><${Table} name="providers" rows=${st.data.providers.map((p) => ({ ...p, id: p.name }))} cols=${PROVIDER_COLS} empty="no external provider"/>`}
  ${st.data.limits && html`<h2>Label limits</h2><${Table} name="limits" rows=${st.data.limits} cols=${LIMIT_COLS} empty="no limit set"/>`}`;
}
const PROVIDER_COLS = [
  { h: "name", v: (p) => p.name },
  { h: "type", v: (p) => p.type },
  { h: "cluster label", v: (p) => "cluster=" + p.cluster },
  { h: "addresses", v: (p) => p.addresses.join(" ") },
  { h: "auth", v: (p) => p.auth },
];
const LIMIT_COLS = [
  { h: "pattern", v: (l) => l.pattern },
  { h: "maximum", v: (l) => dim(l.max, "memory_bytes"), r: (l) => resText(l.max) },
  { h: "set", v: (l) => l.updated_at, r: (l) => html`<${When} at=${l.updated_at}/>` },
];
// live tickets' locked and used, summed per user or per engine type (from the server)
function Groups({ title, groups, testid }) {
  const rows = Object.entries(groups || {}).sort();
  return html`<div class="card" style="flex:1" data-testid=${testid}><h3>${title}</h3>
    ${rows.length ? html`<table><thead><tr><th></th><th>tickets</th><th>locked</th><th>used</th></tr></thead><tbody>
      ${rows.map(([k, g]) => html`<tr data-id=${k}><td>${k}</td><td>${g.tickets}</td><td>${resText({ dims: g.locked })}</td><td>${resText({ dims: g.used })}</td></tr>`)}</tbody></table>`
    : html`<span class="muted">no live ticket</span>`}</div>`;
}

const TICKET_COLS = [
  { h: "id", v: (t) => t.id },
  { h: "user", v: (t) => t.user },
  { h: "state", v: (t) => t.state, r: (t) => html`<${Pill} s=${t.state}/>` },
  { h: "labels", v: (t) => Object.values(t.labels).join(","), r: (t) => html`<${Labels} labels=${t.labels}/>` },
  { h: "locked", v: (t) => dim(t.locked, "memory_bytes"), r: (t) => resText(t.locked) },
  { h: "used", v: (t) => dim(t.used, "memory_bytes"), r: (t) => resText(t.used) },
  { h: "EngineConn", v: (t) => t.engine_conn_id, r: (t) => (t.engine_conn_id ? link("engineconns", t.engine_conn_id) : "–") },
  { h: "created", v: (t) => t.created_at, r: (t) => html`<${When} at=${t.created_at}/>` },
];

function Tickets() {
  const st = usePoll("/api/tickets");
  if (!st.data) return html`<${Loading} state=${st}/>`;
  return html`<h1>Tickets</h1><${Table} name="tickets" rows=${st.data.tickets} cols=${TICKET_COLS} empty="no live ticket"/>`;
}

const DEMAND_COLS = [
  { h: "id", v: (d) => d.id },
  { h: "user", v: (d) => d.user },
  { h: "state", v: (d) => d.state, r: (d) => html`<${Pill} s=${d.state}/>` },
  { h: "resource", v: (d) => dim(d.resource, "memory_bytes"), r: (d) => resText(d.resource) },
  { h: "planned start", v: (d) => d.plan_start, r: (d) => html`<${When} at=${d.plan_start}/>` },
  { h: "deadline", v: (d) => d.deadline, r: (d) => html`<${When} at=${d.deadline}/>` },
  { h: "after", v: (d) => d.order_by.join(",") },
  { h: "reason", v: (d) => d.waiting || d.reason },
];

function Demands() {
  const st = usePoll("/api/demands");
  if (!st.data) return html`<${Loading} state=${st}/>`;
  const ds = st.data.demands;
  const byLabel = {};
  for (const d of ds) {
    const l = d.charged_labels[0] || "(none)";
    (byLabel[l] = byLabel[l] || []).push(d);
  }
  return html`<h1>Demands</h1><${Table} name="demands" rows=${ds} cols=${DEMAND_COLS} empty="no demand"/>
  <h2>Timeline per label</h2>
  <div class="legend muted"><span class="" style="background:#dfe7f7"></span>window<span style="background:var(--used)"></span>planned<span style="background:var(--ok)"></span>allocated<span style="background:var(--bad)"></span>deadline<span style="background:#8e5bd8"></span>OrderBy</div>
  ${Object.entries(byLabel).map(([l, items]) => html`<h2 class="muted">${l}</h2><${Timeline} items=${items}/>`)}`;
}

// Windows, planned starts and durations, allocations, deadlines and OrderBy arrows on one
// time axis; one row per demand.
function Timeline({ items }) {
  const now = useNow(5000);
  const t = (iso) => (iso ? Date.parse(iso) : null);
  const points = [now];
  for (const d of items) for (const x of [d.window[0], d.window[1], d.plan_start, d.plan_end, d.deadline, d.allocated_at, d.ended_at]) if (x) points.push(t(x));
  const lo = Math.min(...points), hi = Math.max(...points, lo + 60000);
  const W = 900, L = 160, ROW = 24, H = items.length * ROW + 30;
  const x = (ms) => L + ((ms - lo) / (hi - lo)) * (W - L - 10);
  const row = {};
  items.forEach((d, i) => (row[d.id] = i));
  const y = (i) => 10 + i * ROW;
  return html`<svg width=${W} height=${H} data-testid="timeline" role="img">
    ${items.map((d, i) => {
      const ps = t(d.plan_start), pe = t(d.plan_end) || (d.duration_s ? ps + d.duration_s * 1000 : ps + 1000);
      return html`<g>
        <text x="4" y=${y(i) + 13}>${d.id} (${d.state})</text>
        ${d.window[0] && html`<rect class="tl-window" x=${x(t(d.window[0]))} y=${y(i)} width=${Math.max(2, x(t(d.window[1]) || hi) - x(t(d.window[0])))} height="18"><title>window</title></rect>`}
        <rect class=${d.allocated_at ? "tl-alloc" : "tl-plan"} x=${x(ps)} y=${y(i) + 4} width=${Math.max(3, x(pe) - x(ps))} height="10"><title>planned ${new Date(ps).toLocaleString()}${d.duration_s ? ", " + d.duration_s + " s" : ""}</title></rect>
        ${d.deadline && html`<line class="tl-deadline" x1=${x(t(d.deadline))} x2=${x(t(d.deadline))} y1=${y(i)} y2=${y(i) + 18}><title>deadline</title></line>`}
        ${d.order_by.filter((p) => p in row).map((p) => {
          const src = items[row[p]];
          const sx = x(t(src.plan_end) || t(src.plan_start));
          return html`<path class="tl-arrow" d=${`M${sx},${y(row[p]) + 9} C${sx + 20},${y(row[p]) + 9} ${x(ps) - 20},${y(i) + 9} ${x(ps)},${y(i) + 9}`}><title>after ${p}</title></path>`;
        })}
      </g>`;
    })}
    <line class="tl-now" x1=${x(now)} x2=${x(now)} y1="0" y2=${H - 16}/>
    <text x=${L} y=${H - 2}>${new Date(lo).toLocaleString()}</text>
    <text x=${W - 10} y=${H - 2} text-anchor="end">${new Date(hi).toLocaleString()}</text>
  </svg>`;
}

// ----- shell: sign-in, navigation, routing -----------------------------------------------

function SignIn({ onDone, message }) {
  const [token, setToken] = useState("");
  const [err, setErr] = useState(message || "");
  const submit = async (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, token.trim());
    try {
      onDone(await api("/api/me"));
    } catch (e) {
      sessionStorage.removeItem(TOKEN_KEY);
      setErr(e.message);
    }
  };
  return html`<form class="signin" onSubmit=${submit}><h1>labelrm console</h1>
    <p>Sign in with your labelrm token (<code>rmctl token add</code>); it stays in this tab only.</p>
    <input type="password" name="token" autocomplete="off" placeholder="lrm_…" value=${token} onInput=${(e) => setToken(e.target.value)}/>
    <button type="submit">Sign in</button>${err && html`<p class="error">${err}</p>`}</form>`;
}

const PAGES = [["overview", "Overview"], ["nodes", "Nodes"], ["engineconns", "EngineConns"], ["resources", "Resources"], ["tickets", "Tickets"], ["demands", "Demands"]];

function useRoute() {
  const get = () => (location.hash.replace(/^#\/?/, "") || "overview").split("/").map(decodeURIComponent);
  const [route, setRoute] = useState(get());
  useEffect(() => { const f = () => setRoute(get()); addEventListener("hashchange", f); return () => removeEventListener("hashchange", f); }, []);
  return route;
}

function App() {
  const [me, setMe] = useState(undefined);
  const [msg, setMsg] = useState("");
  const route = useRoute();
  useEffect(() => {
    api("/api/me").then(setMe, (e) => { setMe(null); if (e.status !== 401) setMsg(e.message); });
    const out = () => { setMe(null); setMsg("signed out: the token is not valid (any more)"); };
    addEventListener("labelrm-signed-out", out);
    return () => removeEventListener("labelrm-signed-out", out);
  }, []);
  if (me === undefined) return html`<p class="muted">connecting…</p>`;
  if (me === null) return html`<${SignIn} onDone=${setMe} message=${msg}/>`;
  const [page, id] = route;
  const signOut = () => { sessionStorage.removeItem(TOKEN_KEY); setMe(null); setMsg(""); };
  const body =
    page === "nodes" && id ? html`<${Node} id=${id}/>`
    : page === "nodes" ? html`<${Nodes}/>`
    : page === "engineconns" && id ? html`<${EngineConn} id=${id}/>`
    : page === "engineconns" ? html`<${EngineConns}/>`
    : page === "resources" ? html`<${Resources}/>`
    : page === "tickets" ? html`<${Tickets}/>`
    : page === "demands" ? html`<${Demands}/>`
    : html`<${Overview}/>`;
  return html`<header><b>labelrm</b><nav>${PAGES.map(([p, t]) => html`<a href=${"#/" + p} class=${page === p ? "on" : ""}>${t}</a>`)}</nav>
    <span class="who" data-testid="who">${me.user}${me.admin ? " (admin)" : ""}</span>${me.auth && html`<button onClick=${signOut}>sign out</button>`}</header>
    <main>${body}</main>`;
}

render(html`<${App}/>`, document.getElementById("app"));
