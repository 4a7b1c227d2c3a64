// The Usage page: the usage ledger's last days (rmctl usage), granted against measured.
// The ledger changes at each roll-up (every 10 s by default): the page reads it every 30 s.
import { html, useState } from "./vendor/htm-preact.mjs";
import { usePoll, Loading, Rows } from "./lib.mjs";

const pct = (x) => (x === null || x === undefined ? "–" : (x * 100).toFixed(1) + "%");
const num = (x) => x.toFixed(2);
const COLS = [
  { h: "key", r: (g) => g.key || "–" },
  { h: "tickets", r: (g) => g.tickets },
  { h: "GiB-h granted", r: (g) => num(g.memory_gib_h) },
  { h: "core-h granted", r: (g) => num(g.cpu_core_h) },
  { h: "GiB-h measured", r: (g) => num(g.measured_memory_gib_h) },
  { h: "core-h measured", r: (g) => num(g.measured_cpu_core_h) },
  { h: "memory eff.", r: (g) => pct(g.memory_efficiency) },
  { h: "CPU eff.", r: (g) => pct(g.cpu_efficiency) },
  { h: "EngineConns", r: (g) => g.engine_conns },
];

export function Usage() {
  const [days, setDays] = useState(7);
  const st = usePoll("/api/usage?days=" + days, 30000);
  const pick = html`<select data-testid="usage-days" value=${days} onChange=${(e) => setDays(Number(e.target.value))}>${[1, 7, 31].map((d) => html`<option value=${d}>last ${d} day${d > 1 ? "s" : ""}</option>`)}</select>`;
  if (!st.data) return html`<h1>Usage</h1>${pick}<${Loading} state=${st}/>`;
  const u = st.data;
  const rows = u.groups.map((g) => ({ ...g, id: g.key }));
  return html`<h1>Usage</h1>${pick} <span class="muted">${u.since.slice(0, 16)} – ${u.until.slice(0, 16)} UTC (tickets that ended)</span>
    <h2>Memory granted and measured per hour (GiB-hours)</h2><${HourChart} hours=${u.hours} since=${u.since} until=${u.until}/>
    <h2>By ${u.group_by.replace("_", " ")}</h2><${Rows} name="usage" rows=${rows} cols=${COLS} empty="no usage in this period"/>`;
}

// One bar per hour (granted), a dot per hour (measured); hours without usage stay empty.
function HourChart({ hours, since, until }) {
  const lo = Date.parse(since), hi = Date.parse(until), W = 900, H = 160, L = 50, B = 20;
  const n = Math.max(1, Math.round((hi - lo) / 3600000));
  const top = Math.max(1e-9, ...hours.map((h) => Math.max(h.memory_gib_h, h.measured_memory_gib_h)));
  const x = (iso) => L + ((Date.parse(iso) - lo) / (hi - lo)) * (W - L);
  const y = (v) => H - B - (v / top) * (H - B - 10);
  const bw = Math.max(1, (W - L) / n - 1);
  return html`<svg width=${W} height=${H} data-testid="usage-chart" role="img">
    <text x="0" y="14" class="muted">${top.toFixed(2)}</text><text x="0" y=${H - B}>0</text>
    <line x1=${L} x2=${W} y1=${H - B} y2=${H - B} stroke="#999"/>
    ${hours.map((h) => html`<rect data-testid="usage-bar" data-hour=${h.key} x=${x(h.key)} y=${y(h.memory_gib_h)} width=${bw} height=${H - B - y(h.memory_gib_h)} fill="var(--used)"><title>${h.key}: ${h.memory_gib_h.toFixed(3)} GiB-h granted, ${h.measured_memory_gib_h.toFixed(3)} measured</title></rect>`)}
    ${hours.filter((h) => h.measured_memory_gib_h > 0).map((h) => html`<circle cx=${x(h.key) + bw / 2} cy=${y(h.measured_memory_gib_h)} r="3" fill="var(--ok)"/>`)}
    <text x=${L} y=${H - 4}>${since.slice(0, 16)}</text><text x=${W - 110} y=${H - 4}>${until.slice(0, 16)}</text></svg>`;
}
