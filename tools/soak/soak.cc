#include "tools/soak/soak.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cluster/cluster.h"
#include "control/engine_api/engine_api.h"
#include "control/layout/kv_shape.h"
#include "engine/base/error.h"
#include "tools/engine_sim/engine_sim.h"

namespace kvrail::soak {
namespace {

using cluster::Cluster;
using cluster::ClusterOptions;
using cluster::Member;

constexpr int kDecodeTokens = 4;
constexpr size_t kExamplesPerKind = 3;

// One engine-sim's part of a room.
enum class Slot { kPending, kOk, kFailed, kWaived };

struct Room {
  int64_t prompt = 0;
  int64_t token = 0;
  absl::Time issued;
  std::vector<Slot> slots;  // by engine-sim index
  int pending = 0;
  // Why a failure is allowed: an abort, or a process fault while the room was in flight.
  std::string fault;
  std::vector<std::string> failures;  // "<sim>: <reason>"
};

// What a sidecar looks like at rest: its anonymous RSS, open fds and table sizes.
struct Sample {
  int64_t rss_anon_kib = 0;
  int64_t fds = 0;
  std::map<std::string, uint64_t> tables;
};

// The tables of SidecarStats that hold per-room or per-peer entries: at rest after the rooms
// end they must be back to their baseline. (finished_remembered is a bounded memory of ended
// rooms, full by design, and failed_rooms_remembered the failed ones of it, each kept at least
// 120 s after they end, CACHEPD §11.2, longer than the soak waits: both are reported, not
// compared.)
std::map<std::string, uint64_t> Tables(const v1::SidecarStats& s) {
  return {{"rooms", s.rooms()},
          {"registrations", s.registrations()},
          {"fences", s.fences()},
          {"transfers", s.transfers()},
          {"outbox_peers", s.outbox_peers()},
          {"data_plane_peers", s.data_plane_peers()},
          {"scheduler_transfers", s.scheduler_transfers()},
          {"scheduler_peers", s.scheduler_peers()},
          {"strands", s.strands()},
          {"engines", s.engines()},
          {"registrations_held", s.registrations_held()},
          {"endpoints", s.endpoints()},
          {"regions", s.regions()}};
}

// The kind of an engine-sim's "error ..." line (engine_sim.h).
std::string EngineSimKind(const std::string& line) {
  if (absl::StrContains(line, "second terminal event")) return "a second terminal event";
  if (absl::StrContains(line, "late write")) return "a write landed after its room ended";
  return "an engine-sim error";
}

absl::StatusOr<Sample> TakeSample(const Member& sidecar) {
  Sample sample;
  const int pid = sidecar.process->pid();
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "RssAnon:")) {
      std::istringstream words(line.substr(8));
      words >> sample.rss_anon_kib;
    }
  }
  std::error_code error;
  for (auto it = std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"), error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    ++sample.fds;
  }
  if (sample.rss_anon_kib == 0 || error) {
    return absl::NotFoundError(absl::StrCat(sidecar.name, " (pid ", pid, ") is gone"));
  }
  // Stats is open to any client of the engine API (docs/ENGINE-API.md, "One engine per sidecar").
  KVRAIL_ASSIGN_OR_RETURN(auto client,
                          engine_api::EngineApiClient::Connect(sidecar.engine_endpoint, nullptr));
  v1::EngineRequest request;
  request.mutable_stats();
  absl::StatusOr<v1::EngineReply> reply = client->Call(request, absl::Seconds(10));
  if (!reply.ok()) return AddContext(reply.status(), sidecar.name + ": Stats");
  sample.tables = Tables(reply->stats());
  return sample;
}

struct Totals {
  int64_t rooms_ok = 0, rooms_failed = 0;
  int64_t bytes_checked = 0, tokens_checked = 0, done_lines = 0;
  std::map<std::string, int64_t> faults;  // by kind
  // Broken checks by kind: how many, and the first few in full.
  std::map<std::string, int64_t> violation_count;
  std::map<std::string, std::vector<std::string>> violations;
  std::vector<std::string> growth;  // one line per sidecar and epoch
  int epochs = 0;
};

struct Shape {
  int prefill_tp = 1, prefill_pp = 1, decode_tp = 1;
  std::string Name() const {
    return absl::StrCat("P=", prefill_tp, prefill_pp > 1 ? absl::StrCat("x", prefill_pp, "pp") : "",
                        " -> D=", decode_tp);
  }
};

class Epoch {
 public:
  Epoch(const SoakOptions& options, std::mt19937_64& random, Totals& totals, int number,
        Shape shape, absl::Time soak_start)
      : options_(options),
        random_(random),
        totals_(totals),
        number_(number),
        shape_(shape),
        soak_start_(soak_start) {}

  // Starts the cluster, warms up, runs rooms and faults until `end`, drains, checks growth.
  void Run(absl::Time end);

 private:
  // Records a broken check of kind `kind`; the first few of each kind are printed in full.
  bool Violation(const std::string& kind, const std::string& text) {
    std::vector<std::string>& examples = totals_.violations[kind];
    ++totals_.violation_count[kind];
    if (examples.size() < kExamplesPerKind) {
      std::fprintf(stderr, "\n  VIOLATION (epoch %d, %s): %s\n", number_, shape_.Name().c_str(),
                   text.c_str());
      examples.push_back(absl::StrCat("epoch ", number_, " (", shape_.Name(), "): ", text));
    }
    return false;
  }
  std::string LogOf(const std::string& name) const { return absl::StrCat(dir_, "/", name, ".log"); }
  bool Enabled(const std::string& fault) const {
    return std::find(options_.faults.begin(), options_.faults.end(), fault) !=
           options_.faults.end();
  }
  bool IsPrefill(int sim) const { return cluster_->IsPrefillSim(sim); }
  int Sims() const { return cluster_->sim_count(); }

  void Issue(bool faults);
  void Send(int sim, const std::string& line, absl::Duration delay);
  void Pump(absl::Duration wait);
  void OnLine(int sim, const std::string& line);
  void Complete(uint64_t id, Room& room);
  void Waive(int sim, const std::string& fault);
  void InjectFault();
  bool CheckAlive();
  void CheckDeadlines();
  bool AwaitIdle(absl::Duration timeout);
  bool Settle(std::vector<Sample>& samples);
  std::vector<Member*> Sidecars();
  void Progress(bool force);

  const SoakOptions& options_;
  std::mt19937_64& random_;
  Totals& totals_;
  const int number_;
  const Shape shape_;
  const absl::Time soak_start_;
  std::string dir_;
  layout::KvShape kv_;
  std::unique_ptr<Cluster> cluster_;
  std::map<uint64_t, Room> rooms_;  // in flight
  // Rooms that ended with a part waived (its engine-sim killed), by id: the slots, so that a
  // line the killed process printed before it died is told from a second end.
  std::map<uint64_t, std::vector<Slot>> waived_ended_;
  uint64_t next_room_ = 1;
  struct Scheduled {
    absl::Time at;
    int sim;
    std::string line;
  };
  std::deque<Scheduled> scheduled_;  // kept sorted by `at`
  std::vector<bool> restarted_;      // by sidecar (prefill ranks, then decode ranks)
  absl::Time next_fault_ = absl::InfiniteFuture();
  // Until then a new room may meet a decode that still routes to a killed prefill sidecar's old
  // endpoint (kRouteSettle after its restart): such a room is one the kill touched.
  absl::Time routes_settle_ = absl::InfinitePast();
  absl::Time last_progress_;
};

// The sidecars' --heartbeat-interval (the least CACHEPD §1.6 allows): a decode probes a prefill
// endpoint it knows gone once per interval, so a restarted prefill sidecar on a new endpoint is
// looked up again within one, plus a second for the lookup and the registration.
constexpr int kHeartbeatSeconds = 2;
constexpr absl::Duration kRouteSettle = absl::Seconds(kHeartbeatSeconds + 1);

void Epoch::Send(int sim, const std::string& line, absl::Duration delay) {
  if (delay <= absl::ZeroDuration()) {
    cluster_->sim(sim).process->WriteStdin(line + "\n");
    return;
  }
  Scheduled s{absl::Now() + delay, sim, line};
  auto at = std::upper_bound(scheduled_.begin(), scheduled_.end(), s,
                             [](const Scheduled& a, const Scheduled& b) { return a.at < b.at; });
  scheduled_.insert(at, std::move(s));
}

void Epoch::Issue(bool faults) {
  const uint64_t id = next_room_++;
  Room& room = rooms_[id];
  room.prompt =
      std::uniform_int_distribution<int64_t>(options_.min_prompt, options_.max_prompt)(random_);
  room.token = static_cast<int64_t>(id * 7919 % 32000);
  room.issued = absl::Now();
  room.slots.assign(Sims(), Slot::kPending);
  room.pending = Sims();
  if (absl::Now() < routes_settle_) {
    // A decode may not have seen the killed prefill gone yet: it routes the room to the old
    // endpoint, and fails it (at once, or once its probe is refused), naming the rank.
    room.fault = "began while a restarted prefill sidecar's route settled";
  }
  // A prefill engine's forward pass: its room line comes up to 30 ms after the decodes' Expect
  // (the window in which a decode's abort meets a prefill that has not readied the room yet).
  std::uniform_int_distribution<int> forward_ms(0, 30);
  const bool slow_prefill = faults && std::bernoulli_distribution(0.3)(random_);
  const std::string line = absl::StrCat("room ", id, " ", room.prompt, " ", room.token);
  for (int i = 0; i < Sims(); ++i) {
    Send(i, line,
         IsPrefill(i) && slow_prefill ? absl::Milliseconds(forward_ms(random_))
                                      : absl::ZeroDuration());
  }
  const bool prefill_aborts = Enabled("prefill-aborts"), decode_aborts = Enabled("decode-aborts");
  if (faults && (prefill_aborts || decode_aborts) &&
      std::bernoulli_distribution(options_.abort_fraction)(random_)) {
    const bool by_prefill =
        prefill_aborts && (!decode_aborts || std::bernoulli_distribution(0.5)(random_));
    const int first = by_prefill ? 0 : cluster_->prefill_ranks();
    const int count = by_prefill ? cluster_->prefill_ranks() : cluster_->decode_ranks();
    const int sim = first + std::uniform_int_distribution<int>(0, count - 1)(random_);
    Send(sim, absl::StrCat("abort ", id),
         absl::Milliseconds(std::uniform_int_distribution<int>(0, 40)(random_)));
    const std::string kind =
        by_prefill ? "aborts by a prefill engine" : "aborts by a decode engine";
    ++totals_.faults[kind];
    room.fault = kind;
  }
}

void Epoch::Complete(uint64_t id, Room& room) {
  if (std::count(room.slots.begin(), room.slots.end(), Slot::kWaived) > 0) {
    waived_ended_[id] = room.slots;
  }
  if (room.failures.empty()) {
    ++totals_.rooms_ok;
  } else {
    ++totals_.rooms_failed;
    if (room.fault.empty()) {
      Violation("a room no fault touched failed",
                absl::StrCat("room ", id, " failed although no fault touched it: ",
                             absl::StrJoin(room.failures, "; ")));
    }
  }
  rooms_.erase(id);
}

void Epoch::OnLine(int sim, const std::string& line) {
  const std::string& name = cluster_->sim(sim).name;
  const std::vector<std::string> words = absl::StrSplit(line, ' ');
  if (words[0] == "error") {
    Violation(EngineSimKind(line), absl::StrCat(name, ": ", line));
    return;
  }
  uint64_t id = 0;
  if (words.size() < 3 || !absl::SimpleAtoi(words[1], &id)) return;  // "arena ...", notes
  if (words[0] == "checked") {
    int64_t bytes = 0;
    if (absl::SimpleAtoi(words[2], &bytes)) totals_.bytes_checked += bytes;
    return;
  }
  if (words[0] != "done") return;  // "values ..."
  ++totals_.done_lines;
  auto it = rooms_.find(id);
  if (it == rooms_.end()) {
    auto waived = waived_ended_.find(id);
    if (waived != waived_ended_.end() && waived->second[sim] == Slot::kWaived) return;
    Violation("a room ended twice on one engine-sim",
              absl::StrCat(name, " ended room ", id, ", which had ended already: ", line));
    return;
  }
  Room& room = it->second;
  Slot& slot = room.slots[sim];
  if (slot == Slot::kWaived) return;  // a line of the process that was killed
  if (slot != Slot::kPending) {
    Violation("a room ended twice on one engine-sim",
              absl::StrCat(name, " ended room ", id, " twice: ", line));
    return;
  }
  const std::string reason =
      line.substr(std::min(line.size(), words[0].size() + words[1].size() + words[2].size() + 3));
  if (words[2] == "wrong") {
    Violation("a Success with wrong bytes",
              absl::StrCat(name, ": room ", id, " reported Success with wrong bytes: ", reason));
    room.failures.push_back(absl::StrCat(name, ": ", reason));
    slot = Slot::kFailed;
  } else if (words[2] != "ok") {
    room.failures.push_back(absl::StrCat(name, ": ", reason));
    slot = Slot::kFailed;
  } else {
    slot = Slot::kOk;
    if (!IsPrefill(sim)) {
      const int rank = sim - cluster_->prefill_ranks();
      const std::vector<int32_t> expected = sim::ExpectedTokens(
          kv_, shape_.decode_tp, rank, id, room.prompt, room.token, kDecodeTokens);
      std::vector<int32_t> got;
      for (size_t i = 5; i < words.size(); ++i) {
        int32_t t;
        if (absl::SimpleAtoi(words[i], &t)) got.push_back(t);
      }
      if (got != expected) {
        Violation("a Success with wrong tokens",
                  absl::StrCat(name, ": room ", id, " streamed tokens [", absl::StrJoin(got, " "),
                               "], expected [", absl::StrJoin(expected, " "), "]"));
        room.failures.push_back(absl::StrCat(name, ": wrong tokens"));
      } else {
        totals_.tokens_checked += static_cast<int64_t>(got.size());
      }
    }
  }
  if (--room.pending == 0) Complete(id, room);
}

// Engine-sim `sim` was killed: its part of every room in flight is waived, and those rooms may
// fail.
void Epoch::Waive(int sim, const std::string& fault) {
  std::vector<uint64_t> complete;
  for (auto& [id, room] : rooms_) {
    if (room.fault.empty()) room.fault = fault;
    if (room.slots[sim] != Slot::kPending) continue;
    room.slots[sim] = Slot::kWaived;
    if (--room.pending == 0) complete.push_back(id);
  }
  for (uint64_t id : complete) Complete(id, rooms_[id]);
  // Lines scheduled for the killed process went nowhere: the new one starts afresh.
  for (auto it = scheduled_.begin(); it != scheduled_.end();) {
    it = it->sim == sim ? scheduled_.erase(it) : it + 1;
  }
}

void Epoch::InjectFault() {
  const bool restarts = Enabled("engine-restarts"), kills = Enabled("sidecar-kills");
  const bool kill_sidecar = kills && (!restarts || std::bernoulli_distribution(0.4)(random_));
  if (kill_sidecar) {
    const int rank = std::uniform_int_distribution<int>(0, cluster_->prefill_ranks() - 1)(random_);
    ++totals_.faults["prefill sidecar kills (SIGKILL, restarted)"];
    const absl::Status restarted = cluster_->RestartPrefillSidecar(rank);
    Waive(rank, "prefill sidecar killed");
    routes_settle_ = absl::Now() + kRouteSettle;
    restarted_[rank] = true;
    if (!restarted.ok()) {
      Violation("a restart failed",
                absl::StrCat("restarting prefill sidecar ", rank, ": ", restarted.message(), "\n",
                             cluster::LogTail(LogOf(cluster_->prefill_sidecar(rank).name), 10)));
    }
  } else {
    const int sim = std::uniform_int_distribution<int>(0, Sims() - 1)(random_);
    ++totals_.faults[IsPrefill(sim) ? "prefill engine-sim restarts (SIGKILL, attached again)"
                                    : "decode engine-sim restarts (SIGKILL, attached again)"];
    const absl::Status restarted = cluster_->RestartSim(sim);
    Waive(sim, "engine-sim restarted");
    if (!restarted.ok()) {
      Violation("a restart failed",
                absl::StrCat("restarting ", cluster_->sim(sim).name, ": ", restarted.message(),
                             "\n", cluster::LogTail(LogOf(cluster_->sim(sim).name), 10)));
    }
  }
  const double scale = std::uniform_real_distribution<double>(0.5, 1.5)(random_);
  next_fault_ = absl::Now() + options_.fault_interval * scale;
}

// Every child alive; a dead one is a violation, shown with its last stderr lines.
bool Epoch::CheckAlive() {
  std::vector<Member*> members = Sidecars();
  members.push_back(&cluster_->bootstrap_server());
  for (int i = 0; i < Sims(); ++i) members.push_back(&cluster_->sim(i));
  bool alive = true;
  for (Member* member : members) {
    absl::StatusOr<int> exited = member->process->Wait(absl::ZeroDuration());
    if (!exited.ok()) continue;
    alive = Violation("a process died", absl::StrCat(member->name, " exited with status ", *exited,
                                                     "; its last stderr lines:\n",
                                                     cluster::LogTail(LogOf(member->name), 10)));
  }
  return alive;
}

void Epoch::CheckDeadlines() {
  const absl::Time now = absl::Now();
  std::vector<uint64_t> late;
  for (auto& [id, room] : rooms_) {
    if (now - room.issued > options_.room_deadline) late.push_back(id);
  }
  for (uint64_t id : late) {
    Room& room = rooms_[id];
    std::vector<std::string> silent;
    for (int i = 0; i < Sims(); ++i) {
      if (room.slots[i] == Slot::kPending) silent.push_back(cluster_->sim(i).name);
    }
    Violation("a room did not end within the deadline",
              absl::StrCat("room ", id, " did not end within ",
                           absl::FormatDuration(options_.room_deadline), " on ",
                           absl::StrJoin(silent, ", "),
                           room.fault.empty() ? "" : absl::StrCat(" (faulted: ", room.fault, ")")));
    room.failures.push_back("deadline");
    room.fault = room.fault.empty() ? "deadline" : room.fault;  // reported once, above
    ++totals_.rooms_failed;
    rooms_.erase(id);
  }
}

void Epoch::Pump(absl::Duration wait) {
  while (!scheduled_.empty() && scheduled_.front().at <= absl::Now()) {
    cluster_->sim(scheduled_.front().sim).process->WriteStdin(scheduled_.front().line + "\n");
    scheduled_.pop_front();
  }
  if (!scheduled_.empty()) wait = std::min(wait, scheduled_.front().at - absl::Now());
  std::pair<int, std::string> line;
  if (cluster_->NextLine(std::max(wait, absl::ZeroDuration()), line)) {
    OnLine(line.first, line.second);
    while (cluster_->NextLine(absl::ZeroDuration(), line)) OnLine(line.first, line.second);
  }
  CheckDeadlines();
  Progress(false);
}

std::vector<Member*> Epoch::Sidecars() {
  std::vector<Member*> out;
  for (int p = 0; p < cluster_->prefill_ranks(); ++p) out.push_back(&cluster_->prefill_sidecar(p));
  for (int d = 0; d < cluster_->decode_ranks(); ++d) out.push_back(&cluster_->decode_sidecar(d));
  return out;
}

// Waits until every room in flight has ended (or passed its deadline).
bool Epoch::AwaitIdle(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while ((!rooms_.empty() || !scheduled_.empty()) && absl::Now() < deadline) {
    Pump(absl::Milliseconds(100));
  }
  return rooms_.empty();
}

// Samples every sidecar once its tables stop shrinking (at most 45 s: peers' sessions and
// fences end on their own timers). `samples`: the baseline to reach, or empty to take one.
bool Epoch::Settle(std::vector<Sample>& samples) {
  std::vector<Member*> sidecars = Sidecars();
  const bool baseline = samples.empty();
  std::vector<Sample> now(sidecars.size());
  const absl::Time deadline = absl::Now() + absl::Seconds(45);
  while (true) {
    bool settled = true;
    for (size_t i = 0; i < sidecars.size(); ++i) {
      absl::StatusOr<Sample> sample = TakeSample(*sidecars[i]);
      if (!sample.ok())
        return Violation("a sidecar could not be sampled", std::string(sample.status().message()));
      now[i] = *sample;
      const auto& t = now[i].tables;
      // At rest: no room, transfer or fence left; against a baseline, no table above it and no
      // fd more.
      settled &= t.at("rooms") == 0 && t.at("transfers") == 0 && t.at("fences") == 0 &&
                 t.at("scheduler_transfers") == 0;
      if (!baseline) {
        for (const auto& [table, size] : t) settled &= size <= samples[i].tables.at(table);
        settled &= restarted_[i] || now[i].fds <= samples[i].fds;
      }
    }
    if (settled || absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(500));
  }
  if (baseline) {
    samples = now;
    return true;
  }
  bool held = true;
  for (size_t i = 0; i < sidecars.size(); ++i) {
    const Sample& was = samples[i];
    const Sample& is = now[i];
    std::vector<std::string> grown;
    for (const auto& [table, size] : is.tables) {
      if (size > was.tables.at(table) || (table == "rooms" && size > 0)) {
        grown.push_back(absl::StrCat(table, " ", was.tables.at(table), " -> ", size));
      }
    }
    std::string line =
        absl::StrFormat("epoch %d %-14s %-18s ", number_, shape_.Name(), sidecars[i]->name);
    if (restarted_[i]) {
      // A sidecar started again mid-epoch has no warm baseline: its tables are compared (they
      // describe the cluster, not the process), its memory and fds are not.
      absl::StrAppend(&line, "restarted mid-epoch; tables ",
                      grown.empty() ? "at baseline" : absl::StrJoin(grown, ", "));
    } else {
      absl::StrAppend(
          &line, absl::StrFormat("RssAnon %.1f -> %.1f MiB (%+.1f), fds %d -> %d, tables %s",
                                 was.rss_anon_kib / 1024.0, is.rss_anon_kib / 1024.0,
                                 (is.rss_anon_kib - was.rss_anon_kib) / 1024.0, was.fds, is.fds,
                                 grown.empty() ? "at baseline" : absl::StrJoin(grown, ", ")));
      if (is.rss_anon_kib > was.rss_anon_kib + options_.rss_slack_kib) {
        held =
            Violation("memory grew", absl::StrCat(sidecars[i]->name, ": RssAnon grew by more than ",
                                                  options_.rss_slack_kib / 1024, " MiB: ", line));
      }
      if (is.fds > was.fds) {
        held = Violation("fds grew", absl::StrCat(sidecars[i]->name, ": open fds grew: ", line));
      }
    }
    if (!grown.empty()) {
      held = Violation("tables grew",
                       absl::StrCat(sidecars[i]->name, ": tables above their baseline: ", line));
    }
    totals_.growth.push_back(line);
  }
  return held;
}

void Epoch::Progress(bool force) {
  const absl::Time now = absl::Now();
  const bool tty = isatty(2);
  if (!force && now - last_progress_ < (tty ? absl::Milliseconds(500) : absl::Seconds(10))) {
    return;
  }
  last_progress_ = now;
  int64_t faults = 0;
  for (const auto& [kind, count] : totals_.faults) faults += count;
  std::fprintf(stderr,
               "%s  [%s / %s] epoch %d %s: rooms %lld ok, %lld failed; %lld faults; %.2f "
               "GB checked%s",
               tty ? "\r" : "",
               absl::FormatDuration(absl::Trunc(now - soak_start_, absl::Seconds(1))).c_str(),
               absl::FormatDuration(options_.duration).c_str(), number_, shape_.Name().c_str(),
               static_cast<long long>(totals_.rooms_ok),
               static_cast<long long>(totals_.rooms_failed), static_cast<long long>(faults),
               totals_.bytes_checked / 1e9, tty ? "   " : "\n");
  std::fflush(stderr);
}

void Epoch::Run(absl::Time end) {
  dir_ = absl::StrCat(options_.log_dir, "/epoch-", number_);
  (void)mkdir(dir_.c_str(), 0755);
  kv_.layers = 8;
  kv_.kv_heads = 4;
  kv_.head_dim = 64;
  kv_.page_tokens = 16;
  // Pages for the rooms in flight, plus as many again for pages held after failures.
  kv_.pages = 2 * options_.concurrency * ((options_.max_prompt + 15) / 16) + 8;
  ClusterOptions co;
  co.kvrail = options_.kvrail;
  co.prefill_tp = shape_.prefill_tp;
  co.prefill_pp = shape_.prefill_pp;
  co.decode_tp = shape_.decode_tp;
  co.link = options_.link;
  co.shape = kv_;
  co.decode_tokens = kDecodeTokens;
  co.log_dir = dir_;
  co.sim_args = {"--audit"};
  const std::string timeout = absl::StrCat(absl::ToInt64Seconds(options_.protocol_timeout));
  co.sidecar_args = {"--bootstrap-timeout",  timeout,
                     "--waiting-timeout",    timeout,
                     "--heartbeat-interval", absl::StrCat(kHeartbeatSeconds)};
  if (isatty(2)) std::fputc('\n', stderr);
  std::fprintf(stderr, "  epoch %d: %s, %lld pages of %d tokens per rank, logs in %s\n", number_,
               shape_.Name().c_str(), static_cast<long long>(kv_.pages), kv_.page_tokens,
               dir_.c_str());
  absl::StatusOr<std::unique_ptr<Cluster>> started = Cluster::Start(co);
  if (!started.ok()) {
    Violation("a cluster did not start",
              absl::StrCat("the cluster did not start: ", started.status().message()));
    return;
  }
  cluster_ = *std::move(started);
  restarted_.assign(cluster_->prefill_ranks() + cluster_->decode_ranks(), false);
  ++totals_.epochs;
  // Warm-up: rooms without faults, which must all land; then the baseline.
  for (int i = 0; i < 2 * options_.concurrency; ++i) {
    Issue(false);
    if (static_cast<int>(rooms_.size()) >= options_.concurrency) {
      while (static_cast<int>(rooms_.size()) >= options_.concurrency) Pump(absl::Milliseconds(100));
    }
  }
  std::vector<Sample> baseline;
  if (!AwaitIdle(options_.room_deadline) || !CheckAlive() || !Settle(baseline)) {
    cluster_->Stop();
    return;
  }
  // Rooms and faults until the epoch ends.
  if (options_.fault_interval > absl::ZeroDuration() &&
      (Enabled("engine-restarts") || Enabled("sidecar-kills"))) {
    next_fault_ = absl::Now() + options_.fault_interval *
                                    std::uniform_real_distribution<double>(0.5, 1.5)(random_);
  }
  absl::Time alive_checked = absl::Now();
  while (absl::Now() < end) {
    while (static_cast<int>(rooms_.size()) < options_.concurrency) Issue(true);
    if (absl::Now() >= next_fault_) InjectFault();
    Pump(absl::Milliseconds(50));
    if (absl::Now() - alive_checked > absl::Seconds(1)) {
      if (!CheckAlive()) break;
      alive_checked = absl::Now();
    }
  }
  // Every room ends; then the tables, fds and memory must be back where they were.
  AwaitIdle(options_.room_deadline + absl::Seconds(5));
  if (CheckAlive()) Settle(baseline);
  Progress(true);
  cluster_->Stop();
}

Shape DrawShape(std::mt19937_64& random) {
  Shape shape;
  const int tps[] = {1, 2, 4};
  shape.prefill_tp = tps[std::uniform_int_distribution<int>(0, 2)(random)];
  shape.decode_tp = std::uniform_int_distribution<int>(1, 2)(random);
  // A pipeline of two stages now and then, where the ranks stay few (2 cores here).
  if (shape.prefill_tp <= 2 && std::bernoulli_distribution(0.25)(random)) shape.prefill_pp = 2;
  return shape;
}

}  // namespace

absl::Status RunSoak(const SoakOptions& in) {
  signal(SIGPIPE, SIG_IGN);  // a child that died must not take the soak with it
  SoakOptions options = in;
  if (options.link != "shm" && options.link != "tcp") {
    return absl::InvalidArgumentError(
        absl::StrCat("--link ", options.link, ": expected shm or tcp"));
  }
  if (options.duration <= absl::ZeroDuration() || options.epoch <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--duration and --epoch must be positive");
  }
  if (options.concurrency < 1 || options.min_prompt < 1 ||
      options.max_prompt < options.min_prompt) {
    return absl::InvalidArgumentError(
        "--concurrency must be >= 1, and 1 <= --min-prompt <= --max-prompt");
  }
  for (const std::string& fault : options.faults) {
    if (fault != "prefill-aborts" && fault != "decode-aborts" && fault != "engine-restarts" &&
        fault != "sidecar-kills") {
      return absl::InvalidArgumentError(
          absl::StrCat("--faults: \"", fault,
                       "\" is not one of prefill-aborts, decode-aborts, engine-restarts, "
                       "sidecar-kills"));
    }
  }
  if (options.abort_fraction < 0 || options.abort_fraction > 1) {
    return absl::InvalidArgumentError("--abort-fraction must lie in [0, 1]");
  }
  if (options.seed == 0) options.seed = std::random_device()() | 1;
  if (options.log_dir.empty()) {
    char dir[] = "/tmp/kvrail-soak-XXXXXX";
    if (mkdtemp(dir) == nullptr) return absl::InternalError("mkdtemp /tmp/kvrail-soak-XXXXXX");
    options.log_dir = dir;
  } else {
    // Made with its parents; one that cannot be made is refused here, naming it, not later as
    // every process's "opening stderr file".
    std::error_code error;
    std::filesystem::create_directories(options.log_dir, error);
    if (error || !std::filesystem::is_directory(options.log_dir)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--log-dir ", options.log_dir, ": cannot make the directory",
                       error ? absl::StrCat(" (", error.message(), ")") : std::string()));
    }
  }
  std::fprintf(
      stderr,
      "kvrail soak: %s over UCX %s, seed %llu (replay: --seed %llu), epochs of %s, %d "
      "rooms in flight of %lld-%lld tokens; faults: %s (%.0f%% of rooms aborted, a "
      "process fault every ~%s); logs in %s\n",
      absl::FormatDuration(options.duration).c_str(), options.link.c_str(),
      static_cast<unsigned long long>(options.seed), static_cast<unsigned long long>(options.seed),
      absl::FormatDuration(options.epoch).c_str(), options.concurrency,
      static_cast<long long>(options.min_prompt), static_cast<long long>(options.max_prompt),
      options.faults.empty() ? "none" : absl::StrJoin(options.faults, ",").c_str(),
      100 * options.abort_fraction, absl::FormatDuration(options.fault_interval).c_str(),
      options.log_dir.c_str());
  std::mt19937_64 random(options.seed);
  Totals totals;
  const absl::Time start = absl::Now();
  const absl::Time end = start + options.duration;
  for (int number = 1; absl::Now() < end; ++number) {
    Epoch epoch(options, random, totals, number, DrawShape(random), start);
    epoch.Run(std::min(end, absl::Now() + options.epoch));
  }
  const absl::Duration wall = absl::Now() - start;

  int64_t faults = 0;
  std::vector<std::string> kinds;
  for (const auto& [kind, count] : totals.faults) {
    faults += count;
    kinds.push_back(absl::StrCat(kind, " ", count));
  }
  std::fprintf(stderr, "\nkvrail soak summary (seed %llu, %s over UCX %s, %d epochs)\n",
               static_cast<unsigned long long>(options.seed),
               absl::FormatDuration(absl::Trunc(wall, absl::Seconds(1))).c_str(),
               options.link.c_str(), totals.epochs);
  std::fprintf(stderr, "  %-16s %lld (%lld ok, %lld failed)\n", "rooms",
               static_cast<long long>(totals.rooms_ok + totals.rooms_failed),
               static_cast<long long>(totals.rooms_ok),
               static_cast<long long>(totals.rooms_failed));
  std::fprintf(stderr, "  %-16s %lld: %s\n", "faults injected", static_cast<long long>(faults),
               kinds.empty() ? "none" : absl::StrJoin(kinds, ", ").c_str());
  std::fprintf(stderr,
               "  %-16s %.3f GB (every byte of every Success, by its decode rank), %lld decoded "
               "tokens\n",
               "bytes checked", totals.bytes_checked / 1e9,
               static_cast<long long>(totals.tokens_checked));
  std::fprintf(stderr, "  %-16s %lld done lines, one per room and engine-sim\n", "events checked",
               static_cast<long long>(totals.done_lines));
  std::fprintf(stderr,
               "  growth (baseline after warm-up -> after the epoch's rooms ended; bound: tables "
               "and fds back to baseline, RssAnon +%lld MiB at most)\n",
               static_cast<long long>(options.rss_slack_kib / 1024));
  for (const std::string& line : totals.growth) std::fprintf(stderr, "    %s\n", line.c_str());
  if (!totals.violations.empty()) {
    int64_t count = 0;
    std::fprintf(stderr, "  VIOLATIONS (replay with --seed %llu):\n",
                 static_cast<unsigned long long>(options.seed));
    for (const auto& [kind, n] : totals.violation_count) {
      count += n;
      std::fprintf(stderr, "    %s: %lld\n", kind.c_str(), static_cast<long long>(n));
      for (const std::string& v : totals.violations[kind]) {
        std::fprintf(stderr, "      %s\n", v.c_str());
      }
    }
    return absl::InternalError(
        absl::StrCat(count, " violations (seed ", options.seed, "); logs in ", options.log_dir));
  }
  std::fprintf(stderr, "  every check held\n");
  return absl::OkStatus();
}

}  // namespace kvrail::soak
