// A native load generator for the benchmarks: the workloads of bench/loadgen.py
// (apply, health, heartbeat), with its command line and its JSON line, in C++ on gRPC's
// completion queue, one thread. On a 2-core machine the load generator shares the cores
// the RM is measured on: this one needs less than half the CPU per call of the Python
// one and of Node.js's (docs/benchmarks.md, fifth round). Built on first use, or by
// `make bench-native` (bench/native/__init__.py).
//
//   loadgen apply|health|heartbeat --target HOST:PORT --clients N --seconds S
//           --start-at EPOCH [--seed K] [--mode spread|hot] [--interval 3]
//           [--agent-prefix P] [--first-agent I] [--heartbeat-rpc stream|unary] [--users N]
//
// Each client is a small state machine; the one operation it has in flight at a time (a
// call or a timer) carries the client as its completion-queue tag.

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "health.grpc.pb.h"
#include "labelrm/v1/resource_manager.grpc.pb.h"

namespace {

namespace pb = labelrm::v1;
using Clock = std::chrono::steady_clock;

constexpr int kUsers = 1000;  // bench/loadgen.py USERS, ECMS, ENGINE (--users: another count)
constexpr int kEcms = 16;
constexpr const char* kEngine = "spark-3.2.1";
constexpr int64_t kGiB = 1024LL * 1024 * 1024;
constexpr double kJitter = 0.1;      // ecm_agent/pacing.py JITTER
constexpr int kRegistrationSlots = 32;

double Now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// A moment of Now()'s clock as a deadline gRPC takes (its timers run on the system clock).
std::chrono::system_clock::time_point At(double t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             std::chrono::duration<double>(t - Now()));
}

struct Args {
  std::string kind, target, mode = "spread", agent_prefix = "sim", heartbeat_rpc = "stream";
  int clients = 0, first_agent = 0, users = kUsers;
  double seconds = 0, start_at = 0, interval = 3.0;
  uint64_t seed = 0;
};

// The measured window, shared by every client (bench/loadgen.py Window).
struct Window {
  double launched = Now(), start = 0, end = 0, registered = 0;
  long count = 0;
  std::map<std::string, std::vector<double>> latency;
  std::map<std::string, long> errors, extra;

  bool Inside(double t) const { return start <= t && t < end; }
  void Record(const char* rpc, double t0, double t1) {
    if (Inside(t0)) latency[rpc].push_back(t1 - t0);
  }
  void Bump(std::map<std::string, long>& table, const std::string& key, double t) {
    if (Inside(t)) table[key] += 1;
  }
};

std::string CodeName(grpc::StatusCode code) {
  static const char* names[] = {"OK",
                                "CANCELLED",
                                "UNKNOWN",
                                "INVALID_ARGUMENT",
                                "DEADLINE_EXCEEDED",
                                "NOT_FOUND",
                                "ALREADY_EXISTS",
                                "PERMISSION_DENIED",
                                "RESOURCE_EXHAUSTED",
                                "FAILED_PRECONDITION",
                                "ABORTED",
                                "OUT_OF_RANGE",
                                "UNIMPLEMENTED",
                                "INTERNAL",
                                "UNAVAILABLE",
                                "DATA_LOSS",
                                "UNAUTHENTICATED"};
  int i = static_cast<int>(code);
  return (i >= 0 && i < 17) ? names[i] : std::to_string(i);
}

class Client {
 public:
  virtual ~Client() = default;
  virtual void Start() = 0;
  // The client's operation in flight completed (ok: the queue's flag).
  virtual void Proceed(bool ok) = 0;
  bool done = false;
};

// One call at a time: a fresh context, the reader, the answer and the status.
template <class Response>
struct Call {
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> reader;
  Response response;
  grpc::Status status;

  grpc::ClientContext* Fresh(double timeout_s) {
    context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    response.Clear();
    return context.get();
  }
  void Finish(void* tag) { reader->Finish(&response, &status, tag); }
};

class Runner;

// Apply -> ReportUsed -> Release, again and again (bench/loadgen.py apply_client).
class ApplyClient : public Client {
 public:
  ApplyClient(pb::ResourceManagerService::Stub* stub, grpc::CompletionQueue* cq, Window* w,
              bool hot, int users, uint64_t seed)
      : stub_(stub), cq_(cq), w_(w), hot_(hot), users_(users), rng_(seed) {
    // Request ids must differ between runs on one RM (a reused id with another request
    // is refused): the prefix comes from the system's entropy, not from the seed.
    static const char* hex = "0123456789abcdef";
    std::random_device entropy;
    for (int i = 0; i < 12; ++i) prefix_ += hex[entropy() % 16];
    request_.mutable_resource()->mutable_load()->set_memory_bytes(kGiB);
    request_.mutable_resource()->mutable_load()->set_cpu_millis(100);
  }

  void Start() override { Next(); }

  void Proceed(bool ok) override {
    if (step_ == kPause) return Next();
    double t = Now();
    const grpc::Status& status = step_ == kApply    ? apply_.status
                                 : step_ == kReport ? report_.status
                                                    : release_.status;
    if (!ok || !status.ok()) {
      w_->Bump(w_->errors, ok ? CodeName(status.error_code()) : "QUEUE", t);
      step_ = kPause;  // as the Python client: 10 ms, then a new cycle
      alarm_ = std::make_unique<grpc::Alarm>();
      alarm_->Set(cq_, At(t + 0.01), this);
      return;
    }
    if (step_ == kApply) {
      t1_ = t;
      OnTicket<pb::ReportUsedRequest>(report_, "-u", kReport, [this](auto* ctx, auto& req) {
        return stub_->AsyncReportUsed(ctx, req, cq_);
      });
    } else if (step_ == kReport) {
      t2_ = t;
      OnTicket<pb::ReleaseRequest>(release_, "-r", kRelease, [this](auto* ctx, auto& req) {
        return stub_->AsyncRelease(ctx, req, cq_);
      });
    } else {
      w_->Record("Apply", t0_, t1_);
      w_->Record("ReportUsed", t1_, t2_);
      w_->Record("Release", t2_, t);
      if (w_->Inside(t)) w_->count += 1;
      Next();
    }
  }

 private:
  enum Step { kApply, kReport, kRelease, kPause };

  void Next() {
    t0_ = Now();
    if (t0_ >= w_->end) {
      done = true;
      return;
    }
    int ecm = hot_ ? 0 : static_cast<int>(rng_() % kEcms);
    int user = static_cast<int>(rng_() % static_cast<uint64_t>(users_));
    n_ += 1;
    request_.set_request_id(prefix_ + "-a" + std::to_string(n_));
    request_.clear_labels();
    AddLabel("userCreator", "u" + std::to_string(user) + "-IDE");
    AddLabel("engineType", kEngine);
    AddLabel("emInstance", "bench" + std::to_string(ecm) + ":9000");
    step_ = kApply;
    apply_.reader = stub_->AsyncApply(apply_.Fresh(60), request_, cq_);
    apply_.Finish(this);
  }

  // ReportUsed and Release: a call on the ticket Apply answered, under its own request id.
  template <class Request, class Response, class Send>
  void OnTicket(Call<Response>& call, const char* suffix, Step next, Send send) {
    Request req;
    req.set_request_id(prefix_ + suffix + std::to_string(n_));
    req.set_ticket_id(apply_.response.ticket().ticket_id());
    step_ = next;
    call.reader = send(call.Fresh(60), req);
    call.Finish(this);
  }

  void AddLabel(const char* key, const std::string& value) {
    auto* label = request_.add_labels();
    label->set_key(key);
    label->set_value(value);
  }

  pb::ResourceManagerService::Stub* stub_;
  grpc::CompletionQueue* cq_;
  Window* w_;
  bool hot_;
  int users_;
  std::mt19937_64 rng_;
  std::string prefix_;
  pb::ApplyRequest request_;
  Call<pb::ApplyResponse> apply_;
  Call<pb::ReportUsedResponse> report_;
  Call<pb::ReleaseResponse> release_;
  std::unique_ptr<grpc::Alarm> alarm_;
  Step step_ = kApply;
  long n_ = 0;
  double t0_ = 0, t1_ = 0, t2_ = 0;
};

// The standard health Check, again and again: the gRPC floor.
class HealthClient : public Client {
 public:
  HealthClient(grpc::health::v1::Health::Stub* stub, grpc::CompletionQueue* cq, Window* w)
      : stub_(stub), cq_(cq), w_(w) {}

  void Start() override { Next(); }

  void Proceed(bool ok) override {
    double t = Now();
    if (!ok || !call_.status.ok()) {
      w_->Bump(w_->errors, ok ? CodeName(call_.status.error_code()) : "QUEUE", t);
    } else {
      w_->Record("Check", t0_, t);
      if (w_->Inside(t)) w_->count += 1;
    }
    Next();
  }

 private:
  void Next() {
    t0_ = Now();
    if (t0_ >= w_->end) {
      done = true;
      return;
    }
    call_.reader = stub_->AsyncCheck(call_.Fresh(60), grpc::health::v1::HealthCheckRequest(), cq_);
    call_.Finish(this);
  }

  grpc::health::v1::Health::Stub* stub_;
  grpc::CompletionQueue* cq_;
  Window* w_;
  Call<grpc::health::v1::HealthCheckResponse> call_;
  double t0_ = 0;
};

// Registration slots shared by the agents of this process (32 in flight). An agent beats
// as soon as it is registered, as a real one does: with thousands of agents registration
// takes longer than the ECM expiry, and one that waited for the others would expire (the
// window, after the warm-up, measures a fleet beating, not a registration wave).
struct Slots {
  int free = kRegistrationSlots;
  std::deque<Client*> waiting;
};

// One simulated ECM agent (bench/loadgen.py agent): registers, then heartbeats with
// sequence numbers, paced as ecm_agent/pacing.py paces them, on one HeartbeatStream as
// ecm_agent/beats.py sends them (or as unary Heartbeat calls): after a failure, the same
// beat again half a second later, on a new stream.
class AgentClient : public Client {
 public:
  AgentClient(pb::ResourceManagerService::Stub* stub, grpc::CompletionQueue* cq, Window* w,
              Slots* slots, std::string agent_id, double interval, uint64_t seed, bool stream)
      : stub_(stub), cq_(cq), w_(w), slots_(slots), id_(std::move(agent_id)),
        interval_(interval), rng_(seed), use_stream_(stream) {}

  void Start() override {
    if (slots_->free == 0) {
      slots_->waiting.push_back(this);
      return;
    }
    slots_->free -= 1;
    step_ = kFirstRegister;
    Register();
  }

  // Registered (and its stream open): the first beat comes at a random point of the first
  // interval.
  void FirstBeat() {
    first_beat_ = true;
    Wait(Uniform() * interval_);
  }

  void Proceed(bool ok) override {
    double t = Now();
    switch (step_) {
      case kFirstRegister:
        w_->registered = std::max(w_->registered, t - w_->launched);
        w_->Record("RegisterEcm", t0_, t);
        if (!ok || !register_.status.ok()) {
          std::fprintf(stderr, "RegisterEcm %s: %s\n", id_.c_str(),
                       register_.status.error_message().c_str());
          std::exit(1);
        }
        ReleaseSlot();
        if (use_stream_) return OpenStream();  // opened now, its first beat comes later
        return FirstBeat();
      case kRegister:
        if (!ok || !register_.status.ok()) {
          std::fprintf(stderr, "RegisterEcm %s: %s\n", id_.c_str(),
                       register_.status.error_message().c_str());
          std::exit(1);
        }
        return Wait(next_delay_);
      case kWait:
        return Beat();
      case kBeat:
        if (!ok || !beat_.status.ok())
          return Failed(ok ? CodeName(beat_.status.error_code()) : "QUEUE", t);
        return Answered(beat_.response, t);
      case kOpen:
        if (!first_beat_) {  // opened right after registration
          if (!ok) stream_.reset();  // the first beat opens another
          return FirstBeat();
        }
        return ok ? Write() : EndStream();
      case kWrite:
        if (!ok) return EndStream();
        step_ = kRead;
        return stream_->Read(&stream_answer_, this);
      case kRead:
        return ok ? Answered(stream_answer_.heartbeat(), t) : EndStream();
      case kEnded:  // the stream failed: its status says why
        stream_.reset();
        return Failed(stream_status_.ok() ? "STREAM_ENDED"
                                          : CodeName(stream_status_.error_code()), t);
      case kClosed:  // the window is over and the stream closed
        stream_.reset();
        done = true;
        return;
    }
  }

 private:
  enum Step { kFirstRegister, kRegister, kWait, kBeat, kOpen, kWrite, kRead, kEnded, kClosed };
  using Stream =
      grpc::ClientAsyncReaderWriter<pb::HeartbeatStreamRequest, pb::HeartbeatStreamResponse>;

  double Uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

  void Register() {
    pb::RegisterEcmRequest req;
    req.set_instance(id_);
    auto* total = req.mutable_total_resource()->mutable_load_instance();
    total->set_memory_bytes(64 * kGiB);
    total->set_cpu_millis(32000);
    total->set_instances(64);
    t0_ = Now();
    register_.reader = stub_->AsyncRegisterEcm(register_.Fresh(120), req, cq_);
    register_.Finish(this);
  }

  void ReleaseSlot() {
    slots_->free += 1;
    if (!slots_->waiting.empty()) {
      Client* next = slots_->waiting.front();
      slots_->waiting.pop_front();
      next->Start();
    }
  }

  void Wait(double delay) {
    step_ = kWait;
    alarm_ = std::make_unique<grpc::Alarm>();
    alarm_->Set(cq_, At(Now() + std::max(0.0, delay)), this);
  }

  void Beat() {
    t0_ = Now();
    if (t0_ >= w_->end) {
      if (stream_ == nullptr) {
        done = true;
        return;
      }
      step_ = kClosed;
      stream_context_->TryCancel();
      return stream_->Finish(&stream_status_, this);
    }
    seq_ += 1;
    if (!use_stream_) {
      pb::HeartbeatRequest req;
      req.set_agent_id(id_);
      req.set_sequence(seq_);
      step_ = kBeat;
      beat_.reader = stub_->AsyncHeartbeat(beat_.Fresh(30), req, cq_);
      return beat_.Finish(this);
    }
    if (stream_ != nullptr) return Write();
    OpenStream();
  }


  void OpenStream() {
    stream_context_ = std::make_unique<grpc::ClientContext>();
    step_ = kOpen;
    stream_ = stub_->AsyncHeartbeatStream(stream_context_.get(), cq_, this);
  }

  void Write() {
    stream_request_.mutable_heartbeat()->set_agent_id(id_);
    stream_request_.mutable_heartbeat()->set_sequence(seq_);
    step_ = kWrite;
    stream_->Write(stream_request_, this);
  }

  void EndStream() {
    step_ = kEnded;
    stream_->Finish(&stream_status_, this);
  }

  void Failed(const std::string& code, double t) {
    w_->Bump(w_->errors, code, t);
    seq_ -= 1;  // resend the same sequence number, as the agent does
    Wait(0.5);
  }

  void Answered(const pb::HeartbeatResponse& response, double t1) {
    w_->Record("Heartbeat", t0_, t1);
    if (w_->Inside(t1)) w_->count += 1;
    double took = t1 - t0_;
    if (took >= interval_) w_->Bump(w_->extra, "late", t1);
    // ecm_agent/pacing.py next_beat_delay
    double u = Uniform();
    next_delay_ = took >= interval_ ? u * interval_
                                    : std::max(0.0, interval_ * (1 + kJitter * (2 * u - 1)) - took);
    if (response.action() != pb::HEARTBEAT_ACTION_CONTINUE) {
      w_->Bump(w_->extra, pb::HeartbeatAction_Name(response.action()), t1);
      seq_ = 0;
      step_ = kRegister;
      return Register();
    }
    Wait(next_delay_);
  }

  pb::ResourceManagerService::Stub* stub_;
  grpc::CompletionQueue* cq_;
  Window* w_;
  Slots* slots_;
  std::string id_;
  double interval_;
  std::mt19937_64 rng_;
  Call<pb::RegisterEcmResponse> register_;
  Call<pb::HeartbeatResponse> beat_;
  bool use_stream_;
  bool first_beat_ = false;  // beating (before: registering)
  std::unique_ptr<grpc::ClientContext> stream_context_;
  std::unique_ptr<Stream> stream_;
  pb::HeartbeatStreamRequest stream_request_;
  pb::HeartbeatStreamResponse stream_answer_;
  grpc::Status stream_status_;
  std::unique_ptr<grpc::Alarm> alarm_;
  Step step_ = kFirstRegister;
  int64_t seq_ = 0;
  double t0_ = 0, next_delay_ = 0;
};

void PrintJson(const Window& w) {
  std::string out = "{\"count\": " + std::to_string(w.count);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6f", w.end - w.start);
  out += ", \"seconds\": " + std::string(buf) + ", \"latency\": {";
  const char* sep = "";
  for (const auto& [rpc, values] : w.latency) {
    out += sep + ("\"" + rpc + "\": [");
    sep = ", ";
    const char* vsep = "";
    for (double v : values) {
      std::snprintf(buf, sizeof buf, "%s%.6f", vsep, v);
      out += buf;
      vsep = ", ";
    }
    out += "]";
  }
  auto table = [&](const char* name, const std::map<std::string, long>& t) {
    out += std::string(", \"") + name + "\": {";
    const char* s = "";
    for (const auto& [k, v] : t) {
      out += s + ("\"" + k + "\": " + std::to_string(v));
      s = ", ";
    }
    out += "}";
  };
  out += "}";
  table("errors", w.errors);
  table("extra", w.extra);
  std::snprintf(buf, sizeof buf, "%.2f", w.registered);
  out += ", \"registered_after\": " + std::string(buf) + "}\n";
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
}

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "loadgen: %s\nusage: loadgen apply|health|heartbeat --target HOST:PORT "
               "--clients N --seconds S --start-at EPOCH [--seed K] [--mode spread|hot] "
               "[--interval 3] [--agent-prefix P] [--first-agent I] "
               "[--heartbeat-rpc stream|unary]\n",
               why);
  std::exit(2);
}

Args Parse(int argc, char** argv) {
  Args a;
  if (argc < 2) Usage("no workload");
  a.kind = argv[1];
  if (a.kind != "apply" && a.kind != "health" && a.kind != "heartbeat") Usage("unknown workload");
  for (int i = 2; i < argc; i += 2) {
    std::string flag = argv[i];
    if (i + 1 >= argc) Usage(("no value for " + flag).c_str());
    std::string value = argv[i + 1];
    char* end = nullptr;
    auto number = [&]() {
      double d = std::strtod(value.c_str(), &end);
      if (end == value.c_str() || *end != '\0' || !std::isfinite(d))
        Usage(("not a number: " + flag).c_str());
      return d;
    };
    if (flag == "--target") a.target = value;
    else if (flag == "--clients") a.clients = static_cast<int>(number());
    else if (flag == "--seconds") a.seconds = number();
    else if (flag == "--start-at") a.start_at = number();
    else if (flag == "--seed") a.seed = static_cast<uint64_t>(number());
    else if (flag == "--mode") a.mode = value;
    else if (flag == "--interval") a.interval = number();
    else if (flag == "--agent-prefix") a.agent_prefix = value;
    else if (flag == "--first-agent") a.first_agent = static_cast<int>(number());
    else if (flag == "--heartbeat-rpc") a.heartbeat_rpc = value;
    else if (flag == "--users") a.users = static_cast<int>(number());
    else Usage(("unknown flag " + flag).c_str());
  }
  if (a.target.empty() || a.clients < 1 || a.seconds <= 0 || a.start_at <= 0)
    Usage("--target, --clients, --seconds and --start-at are required");
  if (a.mode != "spread" && a.mode != "hot") Usage("--mode is spread or hot");
  if (a.users < 1) Usage("--users is at least 1");
  if (a.heartbeat_rpc != "stream" && a.heartbeat_rpc != "unary")
    Usage("--heartbeat-rpc is stream or unary");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = Parse(argc, argv);
  Window w;
  // The shared wall-clock start, turned into this process's monotonic clock.
  double wall = std::chrono::duration<double>(
                    std::chrono::system_clock::now().time_since_epoch()).count();
  w.start = Now() + (args.start_at - wall);
  w.end = w.start + args.seconds;

  // One channel (its own HTTP/2 connection: a local subchannel pool) per 16 clients.
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < std::max(1, (args.clients + 15) / 16); ++i) {
    grpc::ChannelArguments ch_args;
    ch_args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channels.push_back(
        grpc::CreateCustomChannel(args.target, grpc::InsecureChannelCredentials(), ch_args));
  }
  std::vector<std::unique_ptr<pb::ResourceManagerService::Stub>> rm;
  std::vector<std::unique_ptr<grpc::health::v1::Health::Stub>> health;
  for (auto& ch : channels) {
    rm.push_back(pb::ResourceManagerService::NewStub(ch));
    health.push_back(grpc::health::v1::Health::NewStub(ch));
  }

  grpc::CompletionQueue cq;
  Slots slots;
  std::mt19937_64 seeds(args.seed + 1);
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < args.clients; ++i) {
    size_t c = static_cast<size_t>(i) % channels.size();
    if (args.kind == "apply") {
      clients.push_back(
          std::make_unique<ApplyClient>(rm[c].get(), &cq, &w, args.mode == "hot", args.users, seeds()));
    } else if (args.kind == "health") {
      clients.push_back(std::make_unique<HealthClient>(health[c].get(), &cq, &w));
    } else {
      std::string id = args.agent_prefix + std::to_string(args.first_agent + i) + ":9000";
      clients.push_back(std::make_unique<AgentClient>(rm[c].get(), &cq, &w, &slots, id,
                                                      args.interval, seeds(),
                                                      args.heartbeat_rpc == "stream"));
    }
  }
  for (auto& c : clients) c->Start();

  size_t live = clients.size();
  for (auto& c : clients) live -= c->done ? 1 : 0;
  void* tag = nullptr;
  bool ok = false;
  while (live > 0 && cq.Next(&tag, &ok)) {
    auto* client = static_cast<Client*>(tag);
    client->Proceed(ok);
    if (client->done) live -= 1;
  }
  PrintJson(w);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return 0;
}
