// A whole apply -> report-used -> release cycle from Node.js, with @grpc/grpc-js and
// @grpc/proto-loader reading the .proto files as shipped (no generated code).
//
// Usage: node apply_cycle.cjs TARGET PROTO_ROOT WELL_KNOWN_TYPES_DIR
// Prints one JSON object with what each step returned; exits non-zero on any surprise.
"use strict";

const path = require("node:path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const [target, protoRoot, wktDir] = process.argv.slice(2);
const GiB = 1024 ** 3;

const definition = protoLoader.loadSync(
  path.join(protoRoot, "labelrm/v1/resource_manager.proto"),
  {
    includeDirs: [protoRoot, wktDir],
    keepCase: true, // proto field names, as in the protobuf JSON mapping grpcurl prints
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  },
);
const labelrm = grpc.loadPackageDefinition(definition).labelrm.v1;
const rm = new labelrm.ResourceManagerService(target, grpc.credentials.createInsecure());

function call(method, request) {
  const deadline = new Date(Date.now() + 10000);
  return new Promise((resolve, reject) => {
    rm[method](request, { deadline }, (err, response) => (err ? reject(err) : resolve(response)));
  });
}

const labels = [
  { key: "userCreator", value: "alice-IDE" },
  { key: "engineType", value: "spark-3.2.1" },
  { key: "emInstance", value: "node-host:9000" },
];
const loadInstance = (memory, cpu, instances) => ({
  load_instance: { memory_bytes: String(memory), cpu_millis: String(cpu), instances: String(instances) },
});

async function main() {
  const out = {};
  const ecm = await call("RegisterEcm", {
    request_id: "node-reg-1",
    instance: "node-host:9000",
    total_resource: loadInstance(8 * GiB, 8000, 4),
  });
  out.ecm_instance = ecm.ecm.instance;

  const applied = await call("Apply", {
    request_id: "node-apply-1",
    user: "alice",
    labels,
    resource: loadInstance(2 * GiB, 1000, 1),
    wait_timeout: { seconds: "5", nanos: 0 },
  });
  out.applied = applied.ticket;

  // The same request id again: the first answer is replayed, nothing is charged twice.
  const replayed = await call("Apply", {
    request_id: "node-apply-1",
    user: "alice",
    labels,
    resource: loadInstance(2 * GiB, 1000, 1),
    wait_timeout: { seconds: "5", nanos: 0 },
  });
  out.replayed_same_ticket = replayed.ticket.ticket_id === applied.ticket.ticket_id;

  try {
    await call("Apply", { request_id: "node-apply-2", labels, resource: loadInstance(64 * GiB, 1000, 1) });
    out.refusal = null;
  } catch (err) {
    out.refusal = {
      code: err.code,
      is_resource_exhausted: err.code === grpc.status.RESOURCE_EXHAUSTED,
      details: err.details,
      has_status_details: err.metadata.get("grpc-status-details-bin").length > 0,
    };
  }

  const reported = await call("ReportUsed", {
    request_id: "node-report-1",
    ticket_id: applied.ticket.ticket_id,
    used_resource: loadInstance(GiB, 1000, 1),
  });
  out.reported = reported.ticket;

  const record = await call("GetLabelResource", { labels: [labels[2]] });
  out.label_resource_after_report = record.label_resource;

  const released = await call("Release", {
    request_id: "node-release-1",
    ticket_id: applied.ticket.ticket_id,
  });
  out.released = released.ticket;
  process.stdout.write(JSON.stringify(out) + "\n");
}

main()
  .catch((err) => {
    process.stderr.write(`node client failed: ${err.stack || err}\n`);
    process.exitCode = 1;
  })
  .finally(() => rm.close());
