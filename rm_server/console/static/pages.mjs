// The console's pages. Lists page on the server (lib.mjs List); a page of one object
// polls its own endpoint; ids link to their pages.
import { html, useState, useEffect, useRef } from "./vendor/htm-preact.mjs";
import {
  api, usePoll, href, link, bytes, qty, dimName, resText, dim, fmt, utc, When, Pill, Labels,
  Loading, Bar, Legend, UsageChart, List, Rows, usageText, isolationText,
} from "./lib.mjs";
import { Timeline } from "./timeline.mjs";

// ----- overview ----------------------------------------------------------------------------

// A count per state, each a link to the list filtered on that state.
function Counts({ title, counts, testid, page, total }) {
  const entries = Object.entries(counts || {}).sort();
  const sum = entries.reduce((s, [, n]) => s + n, 0);
  return html`<div class="card" data-testid=${testid}><h3>${title}</h3>
    <a class="big" href=${href([page], total)} data-value=${sum}>${fmt(sum)}</a>
    ${entries.map(([s, n]) => html`<div><a href=${href([page], { state: s })} data-state=${s}><${Pill} s=${s}/> <span>${fmt(n)}</span></a></div>`)}</div>`;
}

export function Overview() {
  const st = usePoll("/api/overview");
  if (!st.data) return html`<${Loading} state=${st}/>`;
  const o = st.data;
  const mine = o.scope === "all" ? "" : "My ";
  const users = Object.entries(o.tickets_by_user).sort((a, b) => b[1] - a[1]).slice(0, 8);
  const c = o.consistency;
  return html`<h1>Overview</h1>
  <div class="cards">
    <${Counts} title="Nodes" counts=${o.nodes} testid="nodes-by-state" page="nodes" total=${{ state: "all" }}/>
    <${Counts} title=${mine + "EngineConns"} counts=${o.engine_conns} testid="ecs-by-state" page="engineconns" total=${{ state: "all" }}/>
    <${Counts} title=${mine + "live tickets"} counts=${o.tickets} testid="tickets-by-state" page="tickets"/>
    <${Counts} title=${mine + "demands"} counts=${o.demands} testid="demands-by-state" page="demands"/>
    <div class="card"><h3>Waiting applies</h3><div class="big" data-testid="waiting-applies">${fmt(o.waiting_applies)}</div></div>
    <div class="card"><h3>RM replicas · database</h3><div class="big">${o.replicas.length}</div>
      ${o.replicas.map((r) => html`<div class="muted">${r.host} pid ${r.pid}, up since <${When} at=${r.started_at}/></div>`)}
      <div>database: <span class="ok">${o.database}</span></div></div>
    ${c && html`<div class="card" data-testid="consistency"><h3>Consistency</h3>
      <div class=${"big " + (c.mismatches.length ? "bad" : "ok")} data-testid="mismatches">${c.mismatches.length}</div> mismatches
      <div class="muted"><span data-testid="labels-checked">${c.labels_checked}</span> labels, <span data-testid="tickets-checked">${c.tickets_checked}</span> tickets checked <${When} at=${c.checked_at}/></div>
      ${c.mismatches.slice(0, 5).map((m) => html`<div class="bad">${m.label} ${m.field}: ${m.detail}</div>`)}</div>`}
  </div>
  <h2>Cluster resources (all nodes)</h2><${Legend}/>
  <table class="dims" data-testid="totals"><thead><tr><th>dimension</th><th>total</th><th>used</th><th>locked</th><th>reserved</th><th>protected</th><th>left</th><th></th></tr></thead><tbody>
    ${Object.entries(o.totals).map(([d, v]) => html`<tr data-dim=${d}><td>${dimName(d)}</td>
      ${["max", "used", "locked", "reserved", "protected", "left"].map((f) => html`<td data-field=${f} data-value=${v[f]}>${qty(d, v[f])}</td>`)}
      <td><${Bar} d=${d} max=${{ dims: { [d]: v.max } }} used=${{ dims: { [d]: v.used } }} locked=${{ dims: { [d]: v.locked } }} reserved=${{ dims: { [d]: v.reserved } }} protectedR=${{ dims: { [d]: v.protected } }}/></td></tr>`)}
  </tbody></table>
  <div class="cards" style="margin-top:12px">
    <div class="card" style="flex:2"><h3>Most loaded labels · last hour</h3>
      ${o.loaded.length ? o.loaded.map((r) => html`<div class="loaded" data-testid="loaded-label" data-id=${r.label}><b>${Math.round(r.load * 100)}%</b> <a href=${href(["resources"], { q: r.label })}>${r.label}</a>
        <div>${Object.keys(r.max.dims).map((d) => html`<span class="muted">${dimName(d)} </span><${Bar} d=${d} max=${r.max} used=${r.used} locked=${r.locked} reserved=${r.reserved} protectedR=${r.protected}/> `)}
        <${UsageChart} usage=${r.usage} max=${r.max} now=${sumRes(r.used, r.locked)}/></div></div>`) : html`<span class="muted">no label with a maximum holds anything</span>`}</div>
    ${o.scope === "all" && html`<div class="card" style="flex:1"><h3>Most live tickets by user</h3>
      ${users.length ? users.map(([u, n]) => html`<div><a href=${href(["tickets"], { user: u })} data-testid="top-user">${u}</a>: ${fmt(n)}</div>`) : html`<span class="muted">no live tickets</span>`}</div>`}
  </div>`;
}

function sumRes(a, b) {
  const dims = {};
  for (const r of [a, b]) for (const [d, n] of Object.entries((r && r.dims) || {})) dims[d] = (dims[d] || 0) + n;
  return { dims };
}

// ----- nodes -------------------------------------------------------------------------------

const bars = (n) => Object.keys(n.total.dims).map((d) => html`<div><${Bar} d=${d} max=${n.total} used=${n.used} locked=${n.locked} reserved=${n.reserved} protectedR=${n.protected}/> <span class="muted">${dimName(d)}</span></div>`);

const NODE_COLS = [
  { h: "instance", sort: "instance", r: (n) => link("nodes", n.instance) },
  { h: "state", sort: "state", r: (n) => html`<${Pill} s=${n.state}/>` },
  { h: "labels", r: (n) => html`<${Labels} labels=${n.labels}/>` },
  { h: "total", sort: "total", r: (n) => resText(n.total) },
  { h: "use", r: bars },
  { h: "left", sort: "left", f: "left", val: (n) => dim(n.left, "memory_bytes"), r: (n) => resText(n.left) },
  { h: "EngineConns", sort: "engineconns", r: (n) => html`<a href=${href(["engineconns"], { node: n.instance })}>${n.live_engine_conns}</a>` },
  { h: "isolation", r: (n) => isolationText(n.isolation) },
  { h: "last heartbeat", sort: "heartbeat", r: (n) => html`<${When} at=${n.last_heartbeat_at}/>` },
  { h: "cordon", f: "cordon", r: (n) => (n.cordoned ? html`<${Pill} s="CORDONED"/> <span class="muted">${n.cordon_reason}</span>` : "") },
];

export function Nodes({ route }) {
  return html`<h1>Nodes</h1><${Legend}/>
    <${List} name="nodes" path="/api/nodes" route=${route} cols=${NODE_COLS} facets=${["all", "RUNNING", "DRAINING", "LOST"]} empty="no ECM registered" rest="rmctl node list"/>`;
}

const EC_COLS = [
  { h: "id", sort: "id", r: (e) => link("engineconns", e.id) },
  { h: "user", sort: "user", r: (e) => e.user },
  { h: "engine", sort: "engine", r: (e) => e.engine },
  { h: "state", sort: "state", r: (e) => html`<${Pill} s=${e.state}/>` },
  { h: "node", sort: "node", r: (e) => (e.node ? link("nodes", e.node) : "–") },
  { h: "resources", sort: "memory", r: (e) => resText(e.resource) },
  { h: "measured", r: (e) => (e.measured ? bytes(e.measured.memory_bytes) + ", " + qty("cpu_millis", e.measured.cpu_millis) : html`<span class="muted">–</span>`) },
  { h: "created", sort: "created", r: (e) => html`<${When} at=${e.created_at}/>` },
  { h: "ended", sort: "ended", r: (e) => html`<${When} at=${e.ended_at}/>` },
  { h: "reason", sort: "reason", f: "reason", r: (e) => e.reason || html`<span class="muted">–</span>` },
];

export function Node({ id }) {
  const st = usePoll("/api/nodes/" + encodeURIComponent(id));
  if (!st.data) return html`<${Loading} state=${st}/>`;
  const { node: n, engine_conns: ecs, events } = st.data;
  const live = ecs.filter((e) => !e.ended_at);
  const ended = ecs.filter((e) => e.ended_at);
  return html`<h1>Node ${n.instance} <${Pill} s=${n.state}/> ${n.cordoned && html`<${Pill} s="CORDONED"/>`}</h1>
  ${st.data.may_act && html`<${NodeActions} n=${n}/>`}
  ${n.cordoned && html`<p data-testid="cordon-status">Cordoned: ${n.cordon_reason || "no reason given"}. It takes no new work;
    ${n.live_engine_conns ? ` draining: ${n.live_engine_conns} EngineConn${n.live_engine_conns > 1 ? "s" : ""} still running.` : " drained: no EngineConn left."}</p>`}
  <div class="cards">
    <div class="card"><h3>Labels</h3><${Labels} labels=${n.labels}/><div data-testid="isolation">isolation: ${isolationText(n.isolation)}</div></div>
    <div class="card" data-testid="capacity"><h3>Capacity</h3><${Legend}/>${Object.keys(n.total.dims).map((d) => html`<div data-dim=${d}><${Bar} d=${d} max=${n.total} used=${n.used} locked=${n.locked} reserved=${n.reserved} protectedR=${n.protected}/> ${dimName(d)}: ${qty(d, dim(n.used, d))} used, ${qty(d, dim(n.locked, d))} locked, ${qty(d, dim(n.reserved, d))} reserved of ${qty(d, dim(n.total, d))}</div>`)}
      <div>left: <span data-testid="node-left" data-value=${dim(n.left, "memory_bytes")}>${resText(n.left)}</span></div></div>
    <div class="card"><h3>Liveness</h3><div>last heartbeat <${When} at=${n.last_heartbeat_at}/></div><div>registered <${When} at=${n.registered_at}/></div><div>state changed <${When} at=${n.updated_at}/></div></div>
  </div>
  <h2>EngineConns on this node <a class="muted small" href=${href(["engineconns"], { node: n.instance, state: "all" })}>(all of them)</a></h2>
  <${Rows} name="node-ecs" rows=${live} cols=${EC_COLS} empty="no live EngineConn on this node"/>
  <h2>Ended here recently</h2><${Rows} name="node-ended" rows=${ended} cols=${EC_COLS} empty="none ended here lately"/>
  <h2>Events</h2>${events ? html`<${Rows} name="node-events" rows=${events} cols=${EVENT_COLS} empty="no recorded state"/>` : html`<p class="muted">A node's recorded states are shown to admins (ListEvents).</p>`}`;
}

const EVENT_COLS = [
  { h: "when (UTC)", r: (e) => html`<span title=${e.at}>${utc(Date.parse(e.at))}</span>` },
  { h: "state", r: (e) => html`<${Pill} s=${e.state}/>` },
  { h: "reason", r: (e) => e.reason || html`<span class="muted">–</span>` },
];

// A POST action behind a confirmation (or a question whose answer it sends as the
// reason); says what came back.
function Action({ testid, label, path, confirm: question, ask }) {
  const [msg, setMsg] = useState("");
  const act = async () => {
    let target = path;
    if (ask) {
      const reason = prompt(ask, "");
      if (reason === null) return;
      target += "?" + new URLSearchParams({ reason }).toString();
    } else if (!confirm(question)) return;
    try { await api(target, "POST"); setMsg(label + " done"); } catch (e) { setMsg(e.message); }
  };
  return html`<button data-testid=${testid} onClick=${act}>${label}</button> <small class="muted" data-testid=${testid + "-result"}>${msg}</small> `;
}

// A node's actions (admins), as rmctl names them: cordon (no new work, what runs goes
// on), drain (a cordon watched until no EngineConn is left), uncordon, decommission (it
// leaves once its last EngineConn ended: DecommissionEcm).
function NodeActions({ n }) {
  const base = "/api/nodes/" + encodeURIComponent(n.instance);
  return html`<div class="actions" data-testid="node-actions">
    ${!n.cordoned && html`<${Action} testid="cordon" label="cordon" path=${base + "/cordon"} ask=${"Cordon " + n.instance + ": no new work goes there, what runs goes on. Why?"}/>`}
    ${!n.cordoned && html`<${Action} testid="drain" label="drain" path=${base + "/cordon?reason=" + encodeURIComponent("drained from the web console")} confirm=${"Drain " + n.instance + "? No new work goes there; this page shows its EngineConns until none is left."}/>`}
    ${(n.cordoned || n.draining) && html`<${Action} testid="uncordon" label="uncordon" path=${base + "/uncordon"} confirm=${"Uncordon " + n.instance + "? It takes new work again" + (n.draining ? " and stays registered." : ".")}/>`}
    ${n.state === "RUNNING" && html`<${Action} testid="decommission" label="decommission" path=${base + "/decommission"} confirm=${"Decommission " + n.instance + "? It takes no new EngineConns and leaves once its last one has ended."}/>`}
  </div>`;
}

// ----- EngineConns -------------------------------------------------------------------------

export function EngineConns({ route }) {
  const node = route.query.get("node");
  return html`<h1>EngineConns${node ? " on " + node : ""}</h1>
    <${List} name="ecs" path="/api/engineconns" route=${route} cols=${EC_COLS} facets=${["live", "ended", "all", "STARTING", "IDLE", "BUSY", "SHUTTING_DOWN", "SUCCEEDED", "FAILED", "LOST"]} defaultState="live" empty="no EngineConn here" rest="rmctl engineconn list -A"/>`;
}

export function EngineConn({ id }) {
  const st = usePoll("/api/engineconns/" + encodeURIComponent(id));
  if (!st.data) return html`<${Loading} state=${st}/>`;
  const e = st.data.engine_conn;
  const live = ["STARTING", "IDLE", "BUSY"].includes(e.state);
  return html`<h1>EngineConn ${e.id} <${Pill} s=${e.state}/> ${live && html`<${Action} testid="kill" label="kill" path=${"/api/engineconns/" + encodeURIComponent(e.id) + "/kill"} confirm=${"Kill EngineConn " + e.id + "?"}/>`}</h1>
  <div class="cards">
    <div class="card"><h3>Owner</h3>${e.user} · ${e.engine}<div><${Labels} labels=${e.labels}/></div></div>
    <div class="card"><h3>Placement</h3>node ${e.node ? link("nodes", e.node) : "–"} · pid ${e.pid || "–"}<div class="muted">${e.address}</div><div>ticket ${e.ticket_id ? link("tickets", e.ticket_id) : "–"}</div><div>launch attempts ${e.launch_attempts}</div></div>
    <div class="card" data-testid="ec-resources"><h3>Resources</h3><div>requested: ${resText(e.resource)}</div><div>granted: ${resText(e.granted)}</div><div>measured: ${usageText(e.measured)} ${e.measured_at && html`<${When} at=${e.measured_at}/>`}</div></div>
    <div class="card"><h3>Holder</h3>${e.holder || "–"} ${e.hold_expires_at && html`<div>until <${When} at=${e.hold_expires_at}/></div>`}</div>
  </div>
  ${e.reason && html`<p data-testid="ec-reason">reason: ${e.reason}</p>`}
  <h2>Events</h2><${Rows} name="ec-events" rows=${st.data.events} cols=${EVENT_COLS} empty="no recorded state"/>
  <h2>ECM choice</h2><${Rows} name="choices" rows=${e.ecm_choices} cols=${CHOICE_COLS} empty="no choice recorded"/>
  <h2>Logs</h2><${Logs} ec=${e}/>`;
}

const CHOICE_COLS = [
  { h: "node", r: (c) => link("nodes", c.node) },
  { h: "eligible", r: (c) => (c.eligible ? "yes" : "no") },
  { h: "score", r: (c) => c.score.toFixed(3) },
  { h: "reasons", r: (c) => c.reasons.join("; ") },
];

const LOG_KEEP = 256 * 1024; // characters of each log a page keeps
// Its log files as they grow (Nomad's `alloc logs -f`): polls what was appended since
// the last read, while "follow" is on and the EngineConn lives.
function Logs({ ec }) {
  const [follow, setFollow] = useState(false);
  const [logs, setLogs] = useState({ files: {}, where: "", available: null });
  const offsets = useRef({});
  const live = !["SUCCEEDED", "FAILED", "LOST"].includes(ec.state);
  useEffect(() => {
    let alive = true;
    let timer = null;
    const tick = async () => {
      const q = new URLSearchParams(offsets.current).toString();
      try {
        const r = await api("/api/engineconns/" + encodeURIComponent(ec.id) + "/logs" + (q ? "?" + q : ""));
        if (!alive) return;
        setLogs((prev) => {
          const files = { ...prev.files };
          for (const [name, f] of Object.entries(r.files || {})) {
            const restart = f.from === 0 && (offsets.current[name] || 0) > f.size;
            files[name] = ((restart ? "" : files[name] || "") + f.text).slice(-LOG_KEEP);
            offsets.current[name] = f.to;
          }
          return { files, where: r.where, available: r.files !== null };
        });
        if (follow && r.live) timer = setTimeout(tick, 1000);
      } catch (e) {
        if (alive) setLogs((prev) => ({ ...prev, error: e.message }));
      }
    };
    tick();
    return () => { alive = false; clearTimeout(timer); };
  }, [ec.id, follow]);
  if (logs.available === false) {
    return html`<div class="muted" data-testid="logs-elsewhere">The log files are ${logs.where}: not readable from the RM's host. ${ec.log_tail ? "The RM kept their tail:" : ""}</div>
      ${ec.log_tail && html`<pre data-testid="log-tail">${ec.log_tail}</pre>`}`;
  }
  const names = Object.keys(logs.files);
  return html`<div>${live && html`<label><input type="checkbox" data-testid="follow-logs" checked=${follow} onChange=${(e) => setFollow(e.target.checked)}/> follow</label>`}
    <span class="muted"> ${logs.where}</span>${logs.error && html`<span class="error"> ${logs.error}</span>`}
    ${names.length ? names.map((n) => html`<h3 class="muted">${n}</h3><pre data-testid="logs" data-file=${n}>${logs.files[n]}</pre>`) : html`<p class="muted">no log written yet</p>`}</div>`;
}

// ----- resources ---------------------------------------------------------------------------

const useBars = (r) => (r.max ? Object.keys(r.max.dims).map((d) => html`<div><${Bar} d=${d} max=${r.max} used=${r.used} locked=${r.locked} reserved=${r.reserved} protectedR=${r.protected}/> ${dimName(d)}</div>`) : html`<span class="muted">no maximum</span>`);

const RESOURCE_COLS = [
  { h: "label", sort: "label", r: (r) => r.label },
  { h: "source", sort: "source", r: (r) => r.source },
  { h: "use", sort: "use", r: useBars },
  { h: "last hour", r: (r, d) => html`<${UsageChart} usage=${d.usage[r.label]} max=${r.max} now=${sumRes(r.used, r.locked)}/>` },
  { h: "used", sort: "used", r: (r) => resText(r.used) },
  { h: "locked", sort: "locked", r: (r) => resText(r.locked) },
  { h: "reserved", f: "reserved", val: (r) => dim(r.reserved, "memory_bytes"), r: (r) => resText(r.reserved) },
  { h: "max", sort: "max", r: (r) => resText(r.max) },
  { h: "left", sort: "left", f: "left", val: (r) => (r.left ? dim(r.left, "memory_bytes") : ""), r: (r) => resText(r.left) },
  { h: "tickets", sort: "tickets", r: (r) => html`<a href=${href(["tickets"], { q: r.label })}>${fmt(r.live_tickets)}</a>` },
  { h: "limit that applies", r: (r) => r.limit || html`<span class="muted">–</span>` },
];

export function Resources({ route }) {
  return html`<h1>Resources and limits</h1><${Legend}/>
  <${List} name="resources" path="/api/resources" route=${route} cols=${RESOURCE_COLS} facets=${["all", "ecm", "limit", "external"]} param="source" empty="no label has a record" rest="rmctl resource list">
    ${(d) => html`<${Extras} d=${d}/>`}
  </${List}>`;
}

function Extras({ d }) {
  return html`<div class="cards" style="margin-top:12px">
    <${Groups} title="By user" totals=${d.by_user} testid="by-user" link=${(k) => href(["tickets"], { user: k })} noun="users"/>
    <${Groups} title="By engine type" totals=${d.by_engine_type} testid="by-engine-type" noun="engine types"/>
  </div>
  ${d.providers && html`<h2>External providers</h2><${Rows} name="providers" rows=${d.providers} cols=${PROVIDER_COLS} empty="no external provider"/>`}
  ${d.limits && html`<h2>Label limits</h2><${Rows} name="limits" rows=${d.limits} cols=${LIMIT_COLS} empty="no limit set"/>`}`;
}

const PROVIDER_COLS = [
  { h: "name", r: (p) => p.name },
  { h: "type", r: (p) => p.type },
  { h: "cluster label", r: (p) => "cluster=" + p.cluster },
  { h: "addresses", r: (p) => p.addresses.join(" ") },
  { h: "auth", r: (p) => p.auth },
];
const LIMIT_COLS = [
  { h: "pattern", r: (l) => l.pattern },
  { h: "maximum", r: (l) => resText(l.max) },
  { h: "set", r: (l) => html`<${When} at=${l.updated_at}/>` },
];

// live tickets' locked and used, summed per user or per engine type (over every live
// ticket, by the RM)
function Groups({ title, totals, testid, link: to, noun }) {
  const rows = totals.groups;
  return html`<div class="card" style="flex:1" data-testid=${testid}><h3>${title}</h3>
    ${rows.length ? html`<table><thead><tr><th></th><th>tickets</th><th>locked</th><th>used</th></tr></thead><tbody>
      ${rows.map((g) => html`<tr data-id=${g.id}><td>${to ? html`<a href=${to(g.id)}>${g.id}</a>` : g.id}</td><td data-field="tickets" data-value=${g.tickets}>${fmt(g.tickets)}</td><td>${resText({ dims: g.locked })}</td><td>${resText({ dims: g.used })}</td></tr>`)}</tbody></table>
      ${totals.count > rows.length && html`<div class="muted" data-testid=${testid + "-cut"}>the ${rows.length} of ${fmt(totals.count)} ${noun} with the most live tickets</div>`}`
    : html`<span class="muted">no live ticket</span>`}</div>`;
}

// ----- tickets -----------------------------------------------------------------------------

const TICKET_COLS = [
  { h: "id", sort: "id", r: (t) => link("tickets", t.id) },
  { h: "user", sort: "user", r: (t) => html`<a href=${href(["tickets"], { user: t.user })}>${t.user}</a>` },
  { h: "state", sort: "state", r: (t) => html`<${Pill} s=${t.state}/>` },
  { h: "labels", r: (t) => html`<${Labels} labels=${t.labels}/>` },
  { h: "locked", sort: "locked", r: (t) => held(t.locked) },
  { h: "used", sort: "used", r: (t) => held(t.used) },
  { h: "EngineConn", r: (t) => (t.engine_conn_id ? link("engineconns", t.engine_conn_id) : "–") },
  { h: "created", sort: "created", r: (t) => html`<${When} at=${t.created_at}/>` },
];

// what a ticket holds: nothing shows as "–" (a USED ticket has nothing locked)
const held = (r) => (r && Object.values(r.dims).some((n) => n) ? resText(r) : html`<span class="muted">–</span>`);

export function Tickets({ route }) {
  return html`<h1>Live tickets</h1><${List} name="tickets" path="/api/tickets" route=${route} cols=${TICKET_COLS} facets=${["all", "LOCKED", "USED"]} empty="no live ticket" rest="rmctl ticket list"/>`;
}

export function Ticket({ id }) {
  const st = usePoll("/api/tickets/" + encodeURIComponent(id));
  if (!st.data) return html`<${Loading} state=${st}/>`;
  const t = st.data.ticket;
  return html`<h1>Ticket ${t.id} <${Pill} s=${t.state}/></h1>
  <div class="cards" data-testid="ticket">
    <div class="card"><h3>Owner</h3><a href=${href(["tickets"], { user: t.user })}>${t.user}</a><div><${Labels} labels=${t.labels}/></div></div>
    <div class="card"><h3>Charged to</h3>${t.charged_labels.map((l) => html`<div><a href=${href(["resources"], { q: l })}>${l}</a></div>`)}</div>
    <div class="card"><h3>Resources</h3><div>requested ${resText(t.requested)}</div><div>locked ${resText(t.locked)}</div><div>used ${resText(t.used)}</div></div>
    <div class="card"><h3>Times</h3><div>applied <${When} at=${t.created_at}/></div>${t.lock_expires_at && html`<div>lock expires <${When} at=${t.lock_expires_at}/></div>`}${t.ended_at && html`<div>ended <${When} at=${t.ended_at}/>: ${t.end_reason}</div>`}</div>
    ${t.engine_conn_id && html`<div class="card"><h3>EngineConn</h3>${link("engineconns", t.engine_conn_id)}</div>`}
  </div>
  <h2>Events</h2><${Rows} name="ticket-events" rows=${st.data.events} cols=${EVENT_COLS}/>`;
}

// ----- demands -----------------------------------------------------------------------------

const DEMAND_COLS = [
  { h: "id", sort: "id", r: (d) => link("demands", [d.user, d.demand_id], d.demand_id) },
  { h: "user", sort: "user", r: (d) => html`<a href=${href(["demands"], { user: d.user })}>${d.user}</a>` },
  { h: "state", sort: "state", r: (d) => html`<${Pill} s=${d.state}/>` },
  { h: "resource", sort: "memory", r: (d) => resText(d.resource) },
  { h: "planned start", sort: "planned_start", f: "planned_start", val: (d) => d.planned_start, r: (d) => html`<${When} at=${d.planned_start}/>` },
  { h: "deadline", sort: "deadline", r: (d) => html`<${When} at=${d.deadline}/>` },
  { h: "after", r: (d) => d.order_by.map((k) => html`<a href=${href(["demands", ...k.split("/")])}>${k.split("/").slice(1).join("/")}</a> `) },
  { h: "reason", r: (d) => d.waiting || d.reason },
];

export function Demands({ route }) {
  return html`<h1>Demands</h1>
  <${List} name="demands" path="/api/demands" route=${route} cols=${DEMAND_COLS} facets=${["all", "active", "ended", "NEW", "ACCEPTED", "ALLOCATING", "ALLOCATED", "MONITORING", "FINISHED", "FAILED"]} empty="no demand" rest="rmctl demand list">
    ${(d) => html`<${Timelines} demands=${d.rows}/>`}
  </${List}>`;
}

// One timeline per label, of the demands this page of the list shows.
function Timelines({ demands }) {
  const byLabel = {};
  for (const d of demands) {
    const l = d.charged_labels[0] || "(none)";
    (byLabel[l] = byLabel[l] || []).push(d);
  }
  return html`<h2>Timeline per label <span class="muted small">(the demands of this page; times in UTC)</span></h2>
  <div class="legend muted"><span style="background:#dfe7f7"></span>window<span style="background:#c9b6ee"></span>reserved ahead (lead time)<span style="background:var(--used)"></span>planned<span style="background:var(--ok)"></span>allocated<span style="background:var(--bad)"></span>deadline<span style="background:#8e5bd8"></span>OrderBy</div>
  ${Object.entries(byLabel).map(([l, items]) => html`<h3 class="muted">${l}</h3><${Timeline} items=${items}/>`)}`;
}

export function Demand({ user, id }) {
  const st = usePoll("/api/demands/" + encodeURIComponent(user) + "/" + encodeURIComponent(id));
  if (!st.data) return html`<${Loading} state=${st}/>`;
  const d = st.data.demand;
  return html`<h1>Demand ${d.demand_id} <span class="muted">of ${d.user}</span> <${Pill} s=${d.state}/></h1>
  <div class="cards" data-testid="demand">
    <div class="card"><h3>What</h3>${resText(d.resource)}<div><${Labels} labels=${d.labels}/></div><div class="muted">${d.waiting || d.reason}</div></div>
    <div class="card"><h3>Plan (UTC)</h3>
      <div>planned start <b data-testid="planned-start" data-value=${d.planned_start}>${utc(Date.parse(d.planned_start))}</b></div>
      <div>reserved from ${utc(Date.parse(d.plan_start))} <span class="muted">(one lead time earlier)</span></div>
      <div>until ${d.plan_end ? utc(Date.parse(d.plan_end)) : "open end"}</div>
      ${d.window[0] && html`<div>window ${utc(Date.parse(d.window[0]))} – ${d.window[1] ? utc(Date.parse(d.window[1])) : "open"}</div>`}
      ${d.deadline && html`<div>deadline ${utc(Date.parse(d.deadline))}</div>`}</div>
    <div class="card"><h3>Links</h3>
      <div>after ${d.order_by.length ? d.order_by.map((k) => html`<a href=${href(["demands", ...k.split("/")])}>${k.split("/").slice(1).join("/")}</a> `) : "–"}</div>
      <div>ticket ${d.ticket_id ? link("tickets", d.ticket_id) : "–"}</div>
      <div>charged to ${d.charged_labels.map((l) => html`<a href=${href(["resources"], { q: l })}>${l}</a> `)}</div></div>
  </div>
  <h2>Transitions</h2><${Rows} name="demand-events" rows=${d.events.map((e, i) => ({ ...e, id: i }))} cols=${TRANSITION_COLS}/>`;
}

const TRANSITION_COLS = [
  { h: "when (UTC)", r: (e) => html`<span title=${e.at}>${utc(Date.parse(e.at))}</span>` },
  { h: "from", r: (e) => (e.from ? html`<${Pill} s=${e.from}/>` : html`<span class="muted">(submitted)</span>`) },
  { h: "to", r: (e) => html`<${Pill} s=${e.to}/>` },
  { h: "reason", r: (e) => e.reason },
];
