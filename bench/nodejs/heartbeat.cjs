// Simulated ECM agents for bench/heartbeats.py, in Node.js: the same loop as the Python
// load generator (bench/loadgen.py, `agent`), at a fraction of its CPU, so that on a
// small machine the load generator does not take the cores the RM is measured on.
//
// Each agent registers (at most 32 registrations in flight), then heartbeats, paced as
// the agent paces its beats (INTERVAL seconds apart give or take 10 %, from a random
// phase), with sequence numbers; after an error it resends the same sequence 0.5 s
// later; told to re-register, it registers again and starts over at sequence 1. 16
// agents share a channel.
//
// Usage: node heartbeat.cjs JSON_ARGS
//   {"target", "clients", "seconds", "start_at" (Unix seconds), "seed", "interval",
//    "agent_prefix", "first_agent", "proto_root", "wkt_dir"}
// Prints one JSON line, the shape of bench/loadgen.py's Window.result().
"use strict";

const path = require("node:path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const args = JSON.parse(process.argv[2]);
const GiB = 1024 ** 3;

const definition = protoLoader.loadSync(
  path.join(args.proto_root, "labelrm/v1/resource_manager.proto"),
  { includeDirs: [args.proto_root, args.wkt_dir], keepCase: true, longs: String, enums: String },
);
const { ResourceManagerService } = grpc.loadPackageDefinition(definition).labelrm.v1;

// The shared window, as in loadgen.Window: wall-clock start turned into this clock.
const now = () => performance.now() / 1000;
const launched = now();
const start = launched + (args.start_at - Date.now() / 1000);
const end = start + args.seconds;
const inside = (t) => start <= t && t < end;
const result = { count: 0, latency: {}, errors: {}, extra: {}, registered_after: 0 };
const record = (rpc, t0, t1) => {
  if (inside(t0)) (result.latency[rpc] ||= []).push(Math.round((t1 - t0) * 1e6) / 1e6);
};
const bump = (table, key, t) => {
  if (inside(t)) table[key] = (table[key] || 0) + 1;
};

// A small deterministic generator (mulberry32), seeded per process like the Python one.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const channels = Array.from(
  { length: Math.max(1, Math.ceil(args.clients / 16)) },
  () => new ResourceManagerService(args.target, grpc.credentials.createInsecure()),
);

function call(stub, method, request, seconds) {
  const deadline = new Date(Date.now() + seconds * 1000);
  return new Promise((resolve, reject) => {
    stub[method](request, { deadline }, (err, response) => (err ? reject(err) : resolve(response)));
  });
}

const sleep = (seconds) => new Promise((r) => setTimeout(r, Math.max(0, seconds * 1000)));

let registrationSlots = 32;
const slotWaiters = [];
async function withSlot(fn) {
  while (registrationSlots === 0) await new Promise((r) => slotWaiters.push(r));
  registrationSlots -= 1;
  try {
    return await fn();
  } finally {
    registrationSlots += 1;
    const next = slotWaiters.shift();
    if (next) next();
  }
}

const register = (stub, agentId) =>
  call(
    stub,
    "RegisterEcm",
    {
      instance: agentId,
      total_resource: {
        load_instance: { memory_bytes: String(64 * GiB), cpu_millis: "32000", instances: "64" },
      },
    },
    120,
  );

// The agent's pacing, ecm_agent/pacing.py `next_beat_delay`: the next beat is due one
// interval, give or take JITTER, after the last was sent; after an answer that took an
// interval or more (the RM stalled), at a random point of the next interval, so that a
// stall does not line the agents up for good.
const JITTER = 0.1;
function nextBeatDelay(interval, took, u) {
  if (took >= interval) return u * interval;
  return Math.max(0, interval * (1 + JITTER * (2 * u - 1)) - took);
}

const codeName = Object.fromEntries(Object.entries(grpc.status).map(([k, v]) => [v, k]));

async function agent(stub, agentId, random) {
  await withSlot(async () => {
    const t0 = now();
    await register(stub, agentId);
    result.registered_after = Math.max(result.registered_after, now() - launched);
    record("RegisterEcm", t0, now());
  });
  let seq = 0;
  // The agent beats as soon as it has registered. Here all the agents register in one
  // wave at the start, which a real fleet does not do; the first beat goes at a random
  // point of the first interval so that the window measures a fleet in its steady state
  // and not the echo of that wave.
  let delay = random() * args.interval;
  for (;;) {
    await sleep(delay);
    const t0 = now();
    if (t0 >= end) return;
    seq += 1;
    let response;
    try {
      response = await call(stub, "Heartbeat", { agent_id: agentId, sequence: String(seq) }, 30);
    } catch (err) {
      bump(result.errors, codeName[err.code] || String(err.code), now());
      seq -= 1; // resend the same sequence number, as the agent does
      delay = 0.5;
      continue;
    }
    const t1 = now();
    record("Heartbeat", t0, t1);
    if (inside(t1)) result.count += 1;
    if (response.action !== "HEARTBEAT_ACTION_CONTINUE") {
      bump(result.extra, response.action, t1);
      seq = 0;
      await register(stub, agentId);
    }
    if (t1 - t0 >= args.interval) bump(result.extra, "late", t1);
    delay = nextBeatDelay(args.interval, t1 - t0, random());
  }
}

async function main() {
  const random = rng(args.seed + 1);
  const jobs = [];
  for (let i = 0; i < args.clients; i += 1) {
    const id = `${args.agent_prefix}${args.first_agent + i}:9000`;
    jobs.push(agent(channels[i % channels.length], id, rng(Math.floor(random() * 2 ** 32))));
  }
  await Promise.all(jobs);
  for (const c of channels) c.close();
  result.seconds = end - start;
  result.registered_after = Math.round(result.registered_after * 100) / 100;
  process.stdout.write(`${JSON.stringify(result)}\n`);
}

main().catch((err) => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exit(1);
});
