// The console's building blocks: reading the RM's JSON, routes, formatting, and the
// components every page uses (lists with facets and paging, capacity bars, charts).
import { html, useState, useEffect, useRef } from "./vendor/htm-preact.mjs";

export const POLL_MS = 2000; // live updates: every page re-reads its endpoint this often
export const TOKEN_KEY = "labelrm.token";

// ----- data ------------------------------------------------------------------------------

// X-Labelrm-Console: the console takes a change only with it (and this page's Origin):
// no form on another site can send it (rm_server/console/guard.py).
export async function api(path, method = "GET") {
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

// Reads `path` now and every `ms` (none when `path` is null); returns {data, error}.
export function usePoll(path, ms = POLL_MS) {
  const [state, setState] = useState({ data: null, error: null });
  useEffect(() => {
    if (!path) return undefined;
    let live = true;
    let timer = null;
    setState((s) => ({ data: s.data, error: null }));
    const tick = async () => {
      try {
        const data = await api(path);
        if (live) setState({ data, error: null });
      } catch (error) {
        if (live) setState((s) => ({ data: error.status >= 400 && error.status < 500 ? null : s.data, error }));
        if (error.status === 401) window.dispatchEvent(new Event("labelrm-signed-out"));
      }
      if (live) timer = setTimeout(tick, ms);
    };
    tick();
    return () => { live = false; clearTimeout(timer); };
  }, [path, ms]);
  return state;
}

export function useNow(ms = 1000) {
  const [now, setNow] = useState(Date.now());
  useEffect(() => { const t = setInterval(() => setNow(Date.now()), ms); return () => clearInterval(t); }, [ms]);
  return now;
}

// ----- routes: #/page/id...?query ----------------------------------------------------------

// The route of a hash: {parts, query} or {error} when it is not a valid address (a
// malformed %-escape): a page that says so, never one left loading.
export function parseHash(hash) {
  const text = hash.replace(/^#\/?/, "");
  const at = text.indexOf("?");
  const path = at < 0 ? text : text.slice(0, at);
  const query = new URLSearchParams(at < 0 ? "" : text.slice(at + 1));
  try {
    const parts = (path || "overview").split("/").map(decodeURIComponent);
    return { parts, query };
  } catch (e) {
    return { error: "not a valid address: " + hash, parts: [], query };
  }
}

export function href(parts, query) {
  const path = "#/" + parts.map((p) => encodeURIComponent(p)).join("/");
  const q = query ? new URLSearchParams(Object.entries(query).filter(([, v]) => v !== "" && v !== undefined && v !== null)).toString() : "";
  return q ? path + "?" + q : path;
}

// Go to `hash`; `replace`: without a new history entry (typing in a filter).
export function navigate(hash, replace = false) {
  if (replace) {
    history.replaceState(null, "", hash);
    window.dispatchEvent(new Event("labelrm-route"));
  } else {
    location.hash = hash;
  }
}

export function useRoute() {
  const [route, setRoute] = useState(parseHash(location.hash));
  useEffect(() => {
    const f = () => setRoute(parseHash(location.hash));
    addEventListener("hashchange", f);
    addEventListener("labelrm-route", f);
    return () => { removeEventListener("hashchange", f); removeEventListener("labelrm-route", f); };
  }, []);
  return route;
}

export const link = (kind, id, text) => html`<a href=${href([kind, ...[].concat(id)])}>${text ?? [].concat(id).join("/")}</a>`;

// ----- formatting ------------------------------------------------------------------------

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
export function bytes(n) {
  let i = 0; let v = n;
  while (Math.abs(v) >= 1024 && i < UNITS.length - 1) { v /= 1024; i++; }
  return (i ? trim(v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0)) : String(v)) + " " + UNITS[i];
}
const trim = (s) => (s.includes(".") ? s.replace(/\.?0+$/, "") : s);
// CPU in millicores as cores: 1 millicore is 0.001 cores, never "0.0".
export function cores(n) {
  const c = trim((n / 1000).toFixed(3));
  return c + (c === "1" ? " core" : " cores");
}
export function qty(dim, n) {
  if (n === undefined || n === null) return "–";
  if (dim.endsWith("bytes")) return bytes(n);
  if (dim.endsWith("millis")) return cores(n);
  return String(n);
}
const DIM_NAME = { memory_bytes: "memory", cpu_millis: "cpu", instances: "instances" };
export const dimName = (d) => DIM_NAME[d] || d.replace(/_/g, " ");
const DIM_ORDER = ["memory_bytes", "cpu_millis", "instances"];
const dimRank = (d) => (DIM_ORDER.includes(d) ? DIM_ORDER.indexOf(d) : DIM_ORDER.length);
export function resText(r) {
  if (!r) return "–";
  const dims = Object.entries(r.dims).sort(([a], [b]) => dimRank(a) - dimRank(b) || (a < b ? -1 : 1));
  const parts = dims.map(([d, n]) => dimName(d) + " " + qty(d, n));
  return (r.queue ? "queue " + r.queue + ": " : "") + (parts.join(", ") || "none");
}
export const dim = (r, d) => (r && r.dims[d]) || 0;
// what an EngineConn's agent measured from its cgroup
export function usageText(u) {
  if (!u) return "–";
  return `memory ${bytes(u.memory_bytes)} (peak ${bytes(u.memory_peak_bytes)}), cpu ${qty("cpu_millis", u.cpu_millis)}, cpu time ${(u.cpu_time_micros / 1e6).toFixed(1)} s`;
}
export const isolationText = (i) => (!i ? "–" : i.mode === "none" ? "none (not contained)" : `${i.mode} (${i.controllers.join(", ")})`);
export const fmt = (n) => Number(n).toLocaleString("en-US");

// Times: relative in lists ("3 min ago"), the absolute time in UTC on hover and on the
// timeline: one convention, UTC, 24-hour.
export function utc(ms) {
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}
function ago(iso, now) {
  const s = Math.round((now - Date.parse(iso)) / 1000);
  const a = Math.abs(s);
  const txt = a < 60 ? a + " s" : a < 3600 ? Math.round(a / 60) + " min" : a < 86400 ? Math.round(a / 3600) + " h" : Math.round(a / 86400) + " d";
  return s >= 0 ? txt + " ago" : "in " + txt;
}
export function When({ at }) {
  const now = useNow();
  if (!at) return html`<span class="muted">–</span>`;
  return html`<time datetime=${at} title=${utc(Date.parse(at))}>${ago(at, now)}</time>`;
}
export const Pill = ({ s }) => html`<span class="pill st-${s}">${s}</span>`;
export const Labels = ({ labels }) => Object.entries(labels || {}).map(([k, v]) => html`<span class="pill">${k}=${v}</span>`);

export function Loading({ state }) {
  if (state.error) return html`<p class="error" data-testid="error">${state.error.status || ""} ${state.error.message}</p>`;
  return html`<p class="muted">loading…</p>`;
}

// ----- capacity bars and charts ------------------------------------------------------------

// used / locked / reserved / protected of `max`, for one dimension. A segment that holds
// anything is at least 2 px wide: on a large node a small use must not vanish.
export function Bar({ d, max, used, locked, reserved, protectedR }) {
  const m = dim(max, d);
  if (!m) return html`<span class="muted">no maximum</span>`;
  let x = 0;
  const seg = (cls, v) => {
    if (!v) return null;
    const w = Math.max(0, Math.min(100 - x, (100 * v) / m));
    const el = html`<span class=${cls} style=${"left:" + x + "%;width:max(2px," + w + "%)"}></span>`;
    x += w;
    return el;
  };
  const u = dim(used, d), l = dim(locked, d), r = dim(reserved, d), p = dim(protectedR, d);
  const pct = (100 * (u + l + r)) / m;
  const title = `${dimName(d)}: used ${qty(d, u)}, locked ${qty(d, l)}, reserved ${qty(d, r)}, protected ${qty(d, p)} of ${qty(d, m)} (${pct < 1 && pct > 0 ? pct.toPrecision(2) : Math.round(pct)}% held)`;
  return html`<span class="bar" title=${title} data-pct=${pct}>${seg("used", u)}${seg("locked", l)}${seg("reserved", r)}${seg("protected", p)}</span>`;
}
export const Legend = () => html`<div class="legend muted"><span style="background:var(--used)"></span>used<span style="background:var(--locked)"></span>locked<span style="background:var(--reserved)"></span>reserved<span style="background:var(--protected)"></span>protected</div>`;

// A label's share of its maximum held over the last hour (one line per dimension, from
// the samples the RM rebuilt from its tickets), ending with what it holds now.
export function UsageChart({ usage, max, now }) {
  if (!usage || !max) return html`<span class="muted">–</span>`;
  const W = 120, H = 26;
  const dims = Object.keys(max.dims).filter((d) => max.dims[d]);
  let peak = 0;
  const lines = dims.map((d, k) => {
    const values = (usage.dims[d] || Array(60).fill(0)).concat([now ? dim(now, d) : null]).filter((v) => v !== null);
    const pts = values.map((v, i) => {
      const share = Math.min(1, v / max.dims[d]);
      peak = Math.max(peak, share);
      return `${((i * W) / Math.max(1, values.length - 1)).toFixed(1)},${(H - 1 - share * (H - 2)).toFixed(1)}`;
    });
    return html`<polyline class=${"ch-" + k} points=${pts.join(" ")}/>`;
  });
  const title = `last hour, a sample a minute (UTC from ${utc(Date.parse(usage.since))}): peak ${Math.round(peak * 100)}% of the maximum (${dims.map(dimName).join(", ")})`;
  return html`<svg class="chart" width=${W} height=${H} data-testid="usage-chart" data-peak=${peak.toFixed(4)} role="img"><title>${title}</title><rect x="0" y="0" width=${W} height=${H}/>${lines}</svg>`;
}

// ----- lists: facets, filter, sort, paging, all on the server ------------------------------

// A list of `path` (an /api/ endpoint that pages): the route's query (q, state, sort,
// offset, and the page's own) is the list's state, so a list can be linked to.
export function List({ name, path, route, cols, facets, defaultState = "", empty, children, param = "state", rest }) {
  const q = route.query;
  const params = {};
  for (const [k, v] of q.entries()) params[k] = v;
  const shown = { ...params };
  if (!(param in shown) && defaultState) shown[param] = defaultState;
  const url = path + "?" + new URLSearchParams(shown).toString();
  const st = usePoll(url);
  const [text, setText] = useState(params.q || "");
  const typed = useRef(null);
  useEffect(() => setText(params.q || ""), [params.q]);
  const go = (changes, replace = false) => navigate(href(route.parts, { ...params, offset: "", ...changes }), replace);
  const onInput = (e) => {
    setText(e.target.value);
    clearTimeout(typed.current);
    const value = e.target.value;
    typed.current = setTimeout(() => go({ q: value }, true), 250);
  };
  const d = st.data;
  const head = (c) => {
    if (!c.sort) return html`<th>${c.h}</th>`;
    const cur = d ? d.sort : "";
    const on = cur === c.sort || cur === "-" + c.sort;
    const next = cur === c.sort ? "-" + c.sort : c.sort;
    return html`<th class="sortable" onClick=${() => go({ sort: next })} data-sort=${c.sort}>${c.h}${on ? (cur.startsWith("-") ? " ▼" : " ▲") : ""}</th>`;
  };
  const current = shown[param] || "all";
  const counts = (d && d.by_state) || {};
  const total = Object.values(counts).reduce((a, b) => a + b, 0);
  return html`<div data-testid=${name + "-list"}>
    ${facets && html`<div class="facets" data-testid=${name + "-facets"}>${param}:
      ${facets.map((f) => {
        const n = f === "all" ? total : f in counts ? counts[f] : (FACET_GROUPS[f] || []).reduce((a, s) => a + (counts[s] || 0), 0);
        return html`<a href=${href(route.parts, { ...params, offset: "", [param]: f })} class=${current === f ? "on" : ""} data-state=${f}>${f} <span class="muted">${d ? fmt(n) : ""}</span></a>`;
      })}</div>`}
    ${params.user && html`<div class="chips">user: <span class="pill">${params.user}</span> <a href=${href(route.parts, { ...params, user: "", offset: "" })} data-testid=${name + "-clear-user"}>× show every user</a></div>`}
    <input class="filter" placeholder="filter: ids, users, states, labels…" value=${text} onInput=${onInput} data-testid=${name + "-filter"}/>
    ${d ? html`<${Counter} name=${name} d=${d} rest=${rest}/>` : ""}
    ${!d ? html`<${Loading} state=${st}/>` : html`
    <table data-testid=${name + "-table"}><thead><tr>${cols.map(head)}</tr></thead>
      <tbody>${d.rows.length ? d.rows.map((r) => html`<tr data-id=${r.id}>${cols.map((c) => html`<td data-field=${c.f || null} data-value=${c.val ? c.val(r) : null}>${c.r(r, d)}</td>`)}</tr>`) : html`<tr><td colspan=${cols.length} class="muted">${text ? "nothing matches the filter" : empty || "nothing here"}</td></tr>`}</tbody>
    </table>
    <${Pager} name=${name} d=${d} go=${go}/>
    ${children && children(d)}`}
  </div>`;
}
export const FACET_GROUPS = {
  live: ["STARTING", "IDLE", "BUSY", "SHUTTING_DOWN"],
  ended: ["SUCCEEDED", "FAILED", "LOST", "FINISHED"],
  active: ["NEW", "ACCEPTED", "ALLOCATING", "ALLOCATED", "MONITORING"],
};

// "51–100 of 2,150"; a list the RM cut says so, and how to see the rest.
function Counter({ name, d, rest }) {
  const first = d.matched ? d.offset + 1 : 0;
  const last = Math.min(d.offset + d.limit, d.matched);
  return html`<span class="muted count" data-testid=${name + "-count"} data-matched=${d.matched} data-selected=${d.selected}>
    ${" "}${fmt(first)}–${fmt(last)} of ${fmt(d.matched)}${d.matched !== d.kept ? " matching the filter" : ""}</span>
    ${d.cut && html`<div class="cut" data-testid=${name + "-cut"}>Cut: this list holds the newest ${fmt(d.kept)} of ${fmt(d.selected)}.
      To see the rest, narrow it (a ${"state"} above, or a user: <code>?user=NAME</code>)${rest ? html`, or list them all with <code>${rest}</code>` : ""}.</div>`}`;
}

function Pager({ name, d, go }) {
  if (d.matched <= d.limit) return null;
  const pages = Math.ceil(d.matched / d.limit);
  const page = Math.floor(d.offset / d.limit) + 1;
  return html`<div class="pager">
    <button data-testid=${name + "-prev"} disabled=${d.offset === 0} onClick=${() => go({ offset: Math.max(0, d.offset - d.limit) || "" })}>‹ previous</button>
    <span class="muted" data-testid=${name + "-page"}> page ${page} of ${pages} </span>
    <button data-testid=${name + "-next"} disabled=${d.offset + d.limit >= d.matched} onClick=${() => go({ offset: d.offset + d.limit })}>next ›</button>
    <button data-testid=${name + "-last"} disabled=${page === pages} onClick=${() => go({ offset: (pages - 1) * d.limit })}>last »</button></div>`;
}

// A small table of rows the page already has (no paging: events, choices).
export function Rows({ name, rows, cols, empty }) {
  return html`<table data-testid=${name + "-table"}><thead><tr>${cols.map((c) => html`<th>${c.h}</th>`)}</tr></thead>
    <tbody>${rows && rows.length ? rows.map((r, i) => html`<tr data-id=${r.id ?? i}>${cols.map((c) => html`<td>${c.r(r)}</td>`)}</tr>`) : html`<tr><td colspan=${cols.length} class="muted">${empty || "nothing here"}</td></tr>`}</tbody></table>`;
}
