// Demands on one time axis, one row per demand (user/id: ids are per user): its window,
// the capacity reserved one lead time ahead, the planned start and duration (or the
// allocation), its deadline, and arrows from the demands it is ordered after (OrderBy
// names demands of the same user). One time convention: UTC, 24-hour, on a labelled axis.
import { html } from "./vendor/htm-preact.mjs";
import { useNow, utc } from "./lib.mjs";

const MIN = 60000, HOUR = 60 * MIN, DAY = 24 * HOUR;
const STEPS = [MIN, 5 * MIN, 15 * MIN, 30 * MIN, HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR, DAY, 7 * DAY];

function ticks(lo, hi) {
  const step = STEPS.find((s) => (hi - lo) / s <= 8) || STEPS[STEPS.length - 1];
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi; t += step) out.push(t);
  return { out, step };
}
const hhmm = (t) => new Date(t).toISOString().slice(11, 16);
const mmdd = (t) => new Date(t).toISOString().slice(5, 10);

export function Timeline({ items }) {
  const now = useNow(5000);
  const t = (iso) => (iso ? Date.parse(iso) : null);
  const points = [now];
  for (const d of items) {
    for (const x of [d.window[0], d.window[1], d.plan_start, d.planned_start, d.plan_end, d.deadline, d.allocated_at, d.ended_at]) if (x) points.push(t(x));
  }
  const lo = Math.min(...points), hi = Math.max(...points, lo + 60000);
  const W = 960, L = 230, ROW = 24, TOP = 8, AXIS = 40;
  const H = TOP + items.length * ROW + AXIS;
  const x = (ms) => L + ((ms - lo) / (hi - lo)) * (W - L - 16);
  const row = {};
  items.forEach((d, i) => (row[d.id] = i));
  const y = (i) => TOP + i * ROW;
  const base = TOP + items.length * ROW + 4;
  const { out: marks, step } = ticks(lo, hi);
  const end = (d) => t(d.plan_end) || (d.duration_s ? t(d.planned_start) + d.duration_s * 1000 : t(d.planned_start) + 1000);
  return html`<svg width=${W} height=${H} data-testid="timeline" role="img">
    ${items.map((d, i) => {
      const ps = t(d.planned_start), rs = t(d.plan_start), pe = end(d);
      return html`<g data-id=${d.id}>
        <text x="4" y=${y(i) + 13}>${d.user}/${d.demand_id} (${d.state})</text>
        ${d.window[0] && html`<rect class="tl-window" x=${x(t(d.window[0]))} y=${y(i)} width=${Math.max(2, x(t(d.window[1]) || hi) - x(t(d.window[0])))} height="18"><title>window ${utc(t(d.window[0]))} – ${d.window[1] ? utc(t(d.window[1])) : "open"}</title></rect>`}
        ${rs < ps && html`<rect class="tl-reserve" x=${x(rs)} y=${y(i) + 4} width=${Math.max(1, x(ps) - x(rs))} height="10"><title>capacity reserved from ${utc(rs)} (one lead time ahead)</title></rect>`}
        <rect class=${d.allocated_at ? "tl-alloc" : "tl-plan"} data-start=${d.planned_start} x=${x(ps)} y=${y(i) + 4} width=${Math.max(3, x(pe) - x(ps))} height="10"><title>planned start ${utc(ps)}${d.plan_end ? ", until " + utc(t(d.plan_end)) : ""}</title></rect>
        ${d.deadline && html`<line class="tl-deadline" x1=${x(t(d.deadline))} x2=${x(t(d.deadline))} y1=${y(i)} y2=${y(i) + 18}><title>deadline ${utc(t(d.deadline))}</title></line>`}
        ${d.order_by.filter((p) => p in row).map((p) => {
          const src = items[row[p]];
          const sx = x(end(src)), sy = y(row[p]) + 9, tx = x(ps), ty = y(i) + 9;
          return html`<path class="tl-arrow" data-from=${p} data-to=${d.id} d=${`M${sx},${sy} C${sx + 20},${sy} ${tx - 20},${ty} ${tx},${ty}`}><title>${d.id} after ${p}</title></path>`;
        })}
      </g>`;
    })}
    <line class="tl-now" x1=${x(now)} x2=${x(now)} y1="0" y2=${base}><title>now ${utc(now)}</title></line>
    <line class="tl-axis" x1=${L} x2=${W - 16} y1=${base} y2=${base}/>
    ${marks.map((m) => html`<g class="tl-tick"><line x1=${x(m)} x2=${x(m)} y1=${base} y2=${base + 4}/><text x=${x(m)} y=${base + 15} text-anchor="middle">${step >= DAY ? mmdd(m) : hhmm(m)}</text></g>`)}
    <text class="tl-axis-title" x=${L} y=${H - 4}>time (UTC, 24-hour) · ${mmdd(lo)} ${hhmm(lo)} to ${mmdd(hi)} ${hhmm(hi)}</text>
  </svg>`;
}
