#include "cluster/cluster.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <deque>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cluster/sidecar_command.h"
#include "engine/base/error.h"

namespace kvrail::cluster {
namespace {

using process::Subprocess;

using process::LineField;

// The value of `key` in the last line of `transcript` that begins with `ready`; "" if none.
std::string AnnouncedField(const std::string& transcript, const std::string& ready,
                           const std::string& key) {
  std::string value;
  for (absl::string_view line : absl::StrSplit(transcript, '\n')) {
    if (absl::StartsWith(line, ready)) value = LineField(std::string(line), key);
  }
  return value;
}

// The reason a child that failed gave in its log: its last "error: ..." line (what kvrail's
// commands print when they give up), else the last line that says error, else its last line; ""
// without a log or a line.
std::string LoggedReason(const std::string& log) {
  if (log.empty()) return "";
  std::ifstream in(log);
  std::string line, last, said_error, gave_up;
  while (std::getline(in, line)) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    last = line;
    if (absl::StartsWith(line, "error: ")) gave_up = line;
    if (absl::StrContains(line, "error")) said_error = line;
  }
  const std::string& reason = !gave_up.empty() ? gave_up : !said_error.empty() ? said_error : last;
  return std::string(absl::StripAsciiWhitespace(reason));
}

}  // namespace

std::string SidecarName(const std::string& role, int index) {
  return absl::StrCat(role, "-sidecar-", index);
}

std::string LogTail(const std::string& path, int count) {
  std::ifstream file(path);
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(file, line)) {
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > count) lines.pop_front();
  }
  if (lines.empty()) return absl::StrCat("    (", path, " is empty)");
  std::string text;
  for (const std::string& l : lines) absl::StrAppend(&text, "    | ", l, "\n");
  return text;
}

absl::Status Cluster::StartFailure(Member& member, const absl::Status& why) {
  absl::StatusOr<int> exited = member.process->Wait(absl::Seconds(2));
  const std::string reason = LoggedReason(member.log);
  std::string text = absl::StrCat(member.name, " did not start: ");
  if (!reason.empty()) {
    absl::StrAppend(&text, reason);
  } else {
    absl::StrAppend(&text, why.message());
  }
  if (exited.ok()) {
    absl::StrAppend(&text, " (it exited with status ", *exited);
  } else {
    absl::StrAppend(&text, " (it is still running");
  }
  absl::StrAppend(&text, member.log.empty() ? "; its errors are above)"
                                            : absl::StrCat("; its log: ", member.log, ")"));
  return absl::FailedPreconditionError(text);
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(const ClusterOptions& options) {
  std::unique_ptr<Cluster> cluster(new Cluster(options));
  const absl::Status started = cluster->StartAll();
  if (!started.ok()) {
    cluster->Stop();
    return started;
  }
  return cluster;
}

Cluster::~Cluster() { Stop(); }

absl::StatusOr<Member> Cluster::Spawn(const std::string& name, std::vector<std::string> argv,
                                      const std::map<std::string, std::string>& env) {
  Member member;
  member.name = name;
  const std::string log =
      options_.log_dir.empty() ? "" : absl::StrCat(options_.log_dir, "/", name, ".log");
  KVRAIL_ASSIGN_OR_RETURN(member.process, Subprocess::Start(argv, env, log));
  member.log = log;
  member.argv = std::move(argv);
  member.env = env;
  return member;
}

absl::StatusOr<Member> Cluster::StartSidecar(const std::string& name, std::vector<std::string> argv,
                                             const std::map<std::string, std::string>& env) {
  KVRAIL_ASSIGN_OR_RETURN(Member sidecar, Spawn(name, std::move(argv), env));
  absl::StatusOr<std::string> ready =
      sidecar.process->ReadUntil("sidecar ready", absl::Seconds(30));
  if (!ready.ok()) return StartFailure(sidecar, ready.status());
  sidecar.engine_endpoint = LineField(*ready, "engine");
  sidecar.cachepd_endpoint = LineField(*ready, "cachepd");
  sidecar.metrics = LineField(*ready, "metrics");
  sidecar.session_id = LineField(*ready, "session");
  return sidecar;
}

absl::StatusOr<Member> Cluster::StartSim(const std::string& name, std::vector<std::string> argv) {
  KVRAIL_ASSIGN_OR_RETURN(Member member, Spawn(name, std::move(argv)));
  // Its first line says the arena is attached, and where it lives.
  absl::StatusOr<std::string> arena = member.process->ReadUntil("arena ", absl::Seconds(60));
  if (!arena.ok()) return StartFailure(member, arena.status());
  member.arena_placement = LineField(*arena, "placement");
  return member;
}

absl::Status Cluster::RestartSim(int index) {
  sims_[index].process->Signal(SIGKILL);
  (void)sims_[index].process->Wait(absl::Seconds(10));
  Unwatch(index);
  KVRAIL_ASSIGN_OR_RETURN(sims_[index], StartSim(sims_[index].name, sims_[index].argv));
  Watch(index);
  return absl::OkStatus();
}

absl::Status Cluster::RestartPrefillSidecar(int rank) {
  sims_[rank].process->Signal(SIGKILL);
  (void)sims_[rank].process->Wait(absl::Seconds(10));
  Unwatch(rank);
  Member& sidecar = prefill_sidecars_[rank];
  sidecar.process->Signal(SIGKILL);
  (void)sidecar.process->Wait(absl::Seconds(10));
  KVRAIL_ASSIGN_OR_RETURN(sidecar, StartSidecar(sidecar.name, sidecar.argv, sidecar.env));
  KVRAIL_ASSIGN_OR_RETURN(sims_[rank], StartSim(sims_[rank].name, sims_[rank].argv));
  Watch(rank);
  return absl::OkStatus();
}

absl::Status Cluster::RestartBootstrap() {
  Member& bootstrap = bootstrap_member_;
  bootstrap.process->Signal(SIGKILL);
  (void)bootstrap.process->Wait(absl::Seconds(10));
  // The port the sidecars know; retries cover another process that bound it in the moment it
  // was free.
  std::vector<std::string> argv = bootstrap.argv;
  argv[bootstrap_port_arg_] = std::string(
      absl::StripPrefix(absl::string_view(bootstrap_).substr(bootstrap_.rfind(':')), ":"));
  absl::Status last;
  for (int attempt = 0; attempt < 20; ++attempt) {
    KVRAIL_ASSIGN_OR_RETURN(bootstrap, Spawn("bootstrap", argv));
    last = process::AwaitAnnouncedPort(*bootstrap.process, "bootstrap ready", absl::Seconds(10))
               .status();
    if (last.ok()) return last;
    bootstrap.process->Signal(SIGKILL);
    (void)bootstrap.process->Wait(absl::Seconds(10));
  }
  return AddContext(last, "bootstrap server restarted on its port");
}

absl::Status Cluster::RestartDecodeSidecar(int index) {
  Member& sidecar = decode_sidecars_[index];
  sidecar.process->Signal(SIGKILL);
  (void)sidecar.process->Wait(absl::Seconds(10));
  KVRAIL_ASSIGN_OR_RETURN(sidecar, StartSidecar(sidecar.name, sidecar.argv, sidecar.env));
  return absl::OkStatus();
}

absl::Status Cluster::StartAll() {
  signal(SIGPIPE, SIG_IGN);  // a child that died must not take this process with it
  const ClusterOptions& o = options_;
  tag_ = absl::StrCat("kvrail-", process::ProcessTag(), "-",
                      reinterpret_cast<uintptr_t>(this) % 100000);
  dir_ = absl::StrCat("/tmp/", tag_);
  (void)mkdir(dir_.c_str(), 0700);
  std::vector<std::string> bootstrap = o.prefill_node.prefix;
  for (const std::string& a : {o.kvrail, std::string("bootstrap"), std::string("--host"),
                               o.prefill_node.host, std::string("--port"), std::string("0")}) {
    bootstrap.push_back(a);
  }
  // --metrics-port 0 on the node's host: each process says where in its ready line.
  const auto add_metrics = [&o](std::vector<std::string>& argv, const NodeHost& node) {
    if (!o.metrics) return;
    for (const std::string& a : {std::string("--metrics-port"), std::string("0"),
                                 std::string("--metrics-host"), node.host}) {
      argv.push_back(a);
    }
  };
  bootstrap_port_arg_ = bootstrap.size() - 1;
  add_metrics(bootstrap, o.prefill_node);
  const auto add_revision = [](std::vector<std::string>& argv, const std::string& revision) {
    if (revision.empty()) return;
    argv.push_back("--cachepd-revision");
    argv.push_back(revision);
  };
  add_revision(bootstrap, o.bootstrap_revision);
  bootstrap.insert(bootstrap.end(), o.bootstrap_args.begin(), o.bootstrap_args.end());
  KVRAIL_ASSIGN_OR_RETURN(bootstrap_member_, Spawn("bootstrap", bootstrap));
  absl::StatusOr<int> announced =
      process::AwaitAnnouncedPort(*bootstrap_member_.process, "bootstrap ready", absl::Seconds(30));
  if (!announced.ok()) return StartFailure(bootstrap_member_, announced.status());
  const int port = *announced;
  bootstrap_ = absl::StrCat(o.prefill_node.host, ":", port);
  if (o.metrics) {
    bootstrap_member_.metrics =
        AnnouncedField(bootstrap_member_.process->transcript(), "bootstrap ready", "metrics");
  }
  std::vector<std::string> shape = {"--layers",      absl::StrCat(o.shape.layers),
                                    "--kv-heads",    absl::StrCat(o.shape.kv_heads),
                                    "--head-dim",    absl::StrCat(o.shape.head_dim),
                                    "--page-tokens", absl::StrCat(o.shape.page_tokens),
                                    "--pages",       absl::StrCat(o.shape.pages)};
  if (o.shape.latent) shape.push_back("--latent");

  // `stage`: a prefill's pipeline stage, a decode's instance.
  auto start = [&](bool prefill, int stage, int rank) -> absl::Status {
    const std::string role = prefill ? "prefill" : "decode";
    const int tp = prefill ? o.prefill_tp : o.decode_tp;
    const int global = stage * tp + rank;
    const std::string endpoint = absl::StrCat("ipc://", dir_, "/", role, global, ".sock");
    const NodeHost& node = prefill ? o.prefill_node : o.decode_node;
    SidecarCommand command;
    command.kvrail = o.kvrail;
    command.prefix = node.prefix;
    command.role = role;
    command.engine_endpoint = endpoint;
    command.host = node.host;
    command.link = o.link;
    command.verbs_provider = o.verbs_provider;
    command.net_devices = node.net_devices;
    if (prefill) command.bootstrap = bootstrap_;
    std::vector<std::string>& argv = command.args;
    for (const std::string& a : {std::string("--tp-size"), absl::StrCat(tp),
                                 std::string("--tp-rank"), absl::StrCat(rank)}) {
      argv.push_back(a);
    }
    if (prefill) {
      for (const std::string& a : {std::string("--pp-size"), absl::StrCat(o.prefill_pp),
                                   std::string("--pp-rank"), absl::StrCat(stage)}) {
        argv.push_back(a);
      }
    }
    if (!prefill) {
      add_revision(argv, o.decode_revision);
    } else if (o.prefill_revisions.size() == 1) {
      add_revision(argv, o.prefill_revisions[0]);
    } else if (static_cast<size_t>(global) < o.prefill_revisions.size()) {
      add_revision(argv, o.prefill_revisions[global]);
    }
    argv.insert(argv.end(), o.sidecar_args.begin(), o.sidecar_args.end());
    const std::vector<std::string>& role_args = prefill ? o.prefill_args : o.decode_args;
    argv.insert(argv.end(), role_args.begin(), role_args.end());
    add_metrics(argv, node);
    Command line = SidecarCommandLine(command);
    if (prefill) line.env.insert(o.prefill_env.begin(), o.prefill_env.end());
    KVRAIL_ASSIGN_OR_RETURN(Member sidecar,
                            StartSidecar(SidecarName(role, global), line.argv, line.env));
    (prefill ? prefill_sidecars_ : decode_sidecars_).push_back(std::move(sidecar));
    if (!o.engine_sims) return absl::OkStatus();
    std::vector<std::string> sim = {o.kvrail,          "engine-sim",
                                    "--role",          role,
                                    "--sidecar",       endpoint,
                                    "--arena-from",    o.arena,
                                    "--tp-size",       absl::StrCat(tp),
                                    "--tp-rank",       absl::StrCat(rank),
                                    "--decode-tokens", absl::StrCat(o.decode_tokens)};
    if (o.arena == "engine") {
      sim.push_back("--arena");
      sim.push_back(absl::StrCat("/", tag_, "-", role, global));
    }
    if (!prefill) {
      sim.push_back("--bootstrap");
      sim.push_back(bootstrap_);
    }
    sim.insert(sim.end(), shape.begin(), shape.end());
    sim.insert(sim.end(), o.sim_args.begin(), o.sim_args.end());
    KVRAIL_ASSIGN_OR_RETURN(Member member, StartSim(absl::StrCat(role, "-sim-", global), sim));
    sims_.push_back(std::move(member));
    return absl::OkStatus();
  };
  for (int stage = 0; stage < o.prefill_pp; ++stage) {
    for (int p = 0; p < o.prefill_tp; ++p) KVRAIL_RETURN_IF_ERROR(start(true, stage, p));
  }
  if (o.engine_sims && o.decode_instances != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster: decode_instances is ", o.decode_instances,
                     "; engine-sims serve one decode instance (engine_sims false for more)"));
  }
  for (int instance = 0; instance < o.decode_instances; ++instance) {
    for (int d = 0; d < o.decode_tp; ++d) KVRAIL_RETURN_IF_ERROR(start(false, instance, d));
  }
  for (int i = 0; i < sim_count(); ++i) Watch(i);
  return absl::OkStatus();
}

void Cluster::Unwatch(int index) {
  if (readers_[index].joinable()) readers_[index].join();
}

void Cluster::Watch(int index) {
  Subprocess* child = sims_[index].process.get();
  if (readers_.size() <= static_cast<size_t>(index)) readers_.resize(index + 1);
  readers_[index] = std::thread([this, index, child] {
    while (true) {
      absl::StatusOr<std::string> line = child->ReadLine(absl::Milliseconds(500));
      if (!line.ok()) {
        if (line.status().code() == absl::StatusCode::kDeadlineExceeded && !stopping_) continue;
        return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      lines_.emplace_back(index, *line);
      cv_.notify_all();
    }
  });
}

void Cluster::Send(int index, uint64_t room, int64_t prompt, int64_t token) {
  sims_[index].process->WriteStdin(absl::StrCat("room ", room, " ", prompt, " ", token, "\n"));
}

void Cluster::SendAll(uint64_t room, int64_t prompt, int64_t token) {
  for (int i = 0; i < sim_count(); ++i) Send(i, room, prompt, token);
}

bool Cluster::NextLine(absl::Duration timeout, std::pair<int, std::string>& out) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return !lines_.empty(); })) {
    return false;
  }
  out = std::move(lines_.front());
  lines_.pop_front();
  return true;
}

void Cluster::Stop() {
  if (stopped_) return;
  stopped_ = true;
  for (Member& sim : sims_) sim.process->CloseStdin();
  for (Member& sim : sims_) {
    if (!sim.process->Wait(absl::Seconds(10)).ok()) sim.process->Signal(SIGKILL);
  }
  std::vector<Member*> services;
  for (Member& m : prefill_sidecars_) services.push_back(&m);
  for (Member& m : decode_sidecars_) services.push_back(&m);
  if (bootstrap_member_.process) services.push_back(&bootstrap_member_);
  for (Member* m : services) {
    m->process->Signal(SIGCONT);  // one a test stopped must hear the SIGTERM
    m->process->Signal(SIGTERM);
  }
  for (Member* m : services) {
    if (!m->process->Wait(absl::Seconds(10)).ok()) m->process->Signal(SIGKILL);
  }
  stopping_ = true;
  for (std::thread& reader : readers_) {
    if (reader.joinable()) reader.join();
  }
  readers_.clear();
  // The directory is this cluster's own and holds only its members' sockets: a member that was
  // killed (a test's restart, or one that did not stop in time) left its socket file there.
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

}  // namespace kvrail::cluster
