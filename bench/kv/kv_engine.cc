#include "bench/kv/kv_engine.h"

#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cluster/cluster.h"
#include "cluster/kv_pattern.h"
#include "cluster/process/cpu_time.h"
#include "control/engine_api/engine_api.h"
#include "control/engine_api/sidecar_arena.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/plan/copy_plan.h"
#include "control/plan/planner.h"
#include "engine/base/error.h"

namespace kvrail::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Every room of a case carries the same pattern: the decode arenas are zeroed before each room,
// so the pattern need not change for a check to prove that the room landed.
constexpr uint64_t kPatternKey = 1;
constexpr absl::Duration kStall = absl::Seconds(60);

double Since(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

// Sleeps until `offset` after `start` (at once when that has passed).
void SleepUntil(Clock::time_point start, absl::Duration offset) {
  std::this_thread::sleep_until(start + absl::ToChronoNanoseconds(offset));
}

// One engine rank: its client, its arena (the sidecar's, mapped here) and its pattern.
struct Rank {
  std::string name;  // "prefill rank 0"
  std::unique_ptr<engine_api::EngineApiClient> client;
  std::optional<engine_api::SidecarArena> arena;  // set once attached (Arena has no empty state)
  std::optional<sim::RankLayout> layout;
};

absl::StatusOr<Rank> Attach(const std::string& name, const std::string& endpoint,
                            const layout::Contract& contract, const std::string& contract_wire,
                            int tp, int rank) {
  Rank r;
  r.name = name;
  KVRAIL_ASSIGN_OR_RETURN(r.client, engine_api::EngineApiClient::Connect(endpoint));
  v1::EngineRequest attach;
  const uint64_t bytes = static_cast<uint64_t>(contract.ArenaBytes());
  attach.mutable_attach()->set_allocate_bytes(bytes);
  attach.mutable_attach()->set_contract(contract_wire);
  absl::StatusOr<v1::EngineReply> reply = r.client->Call(attach, absl::Seconds(30));
  if (!reply.ok()) return AddContext(reply.status(), absl::StrCat(name, ": attach"));
  absl::StatusOr<engine_api::SidecarArena> mapped = engine_api::MapSidecarArena(*reply, bytes);
  if (!mapped.ok()) return AddContext(mapped.status(), name);
  r.arena.emplace(*std::move(mapped));
  KVRAIL_ASSIGN_OR_RETURN(sim::RankLayout layout, sim::RankLayout::Create(contract, tp, rank));
  r.layout = std::move(layout);
  return r;
}

// Stamps when 8 bytes of the decode arena turn non-zero (kv_engine.h, "Time to the first
// byte"): polls every 50 us, not a busy spin, so that it leaves this machine's cores to the
// sidecars that move the bytes. (Every 5 us, as it polled until 2026-12-02, it held most of a
// core through each Ready: traced, the engine API's Ready reached the sidecar 1.1-2.0 ms after
// it was sent, against 0.16-0.37 ms with the watch at 50 us; BENCHMARKS.md, "The first byte".)
// The figure is therefore late by up to 50 us and a wakeup. Where it may (root, or
// CAP_SYS_NICE), the thread runs SCHED_FIFO, so that its wakeup is not queued behind the
// sidecars' lanes when they hold every core; asleep, it takes nothing from them.
class FirstByteWatch {
 public:
  FirstByteWatch(const uint8_t* word, Clock::time_point start) : start_(start) {
    thread_ = std::thread([this, word] {
      prctl(PR_SET_TIMERSLACK, 1UL);  // sleep as little as asked (default slack: 50 us)
      const sched_param realtime{.sched_priority = 1};
      pthread_setschedparam(pthread_self(), SCHED_FIFO, &realtime);  // else normal priority
      const timespec pause{0, 50000};
      while (!stop_.load(std::memory_order_relaxed)) {
        if (__atomic_load_n(reinterpret_cast<const uint64_t*>(word), __ATOMIC_ACQUIRE) != 0) {
          seconds_ = Since(start_, Clock::now());
          return;
        }
        nanosleep(&pause, nullptr);
      }
    });
  }
  // Stops polling; the seconds to the first byte, or -1 when it was not seen.
  double Finish() {
    stop_ = true;
    thread_.join();
    return seconds_;
  }

 private:
  Clock::time_point start_;
  std::atomic<bool> stop_{false};
  double seconds_ = -1;
  std::thread thread_;
};

}  // namespace

class KvCaseRunner::Impl {
 public:
  explicit Impl(KvCaseSpec spec) : spec_(std::move(spec)) {}

  absl::Status Start() {
    for (int tp : {spec_.prefill_tp, spec_.decode_tp}) {
      if (tp < 1 || (!spec_.shape.latent && spec_.shape.kv_heads % tp != 0)) {
        return absl::InvalidArgumentError(absl::StrCat("bench kv: ", spec_.shape.kv_heads,
                                                       " KV heads do not split over TP ", tp));
      }
    }
    layout::KvShape shape = spec_.shape;
    pages_ = (spec_.tokens + shape.page_tokens - 1) / shape.page_tokens;
    shape.pages = pages_;
    KVRAIL_ASSIGN_OR_RETURN(prefill_contract_, layout::BuildKvContract(shape, spec_.prefill_tp));
    KVRAIL_ASSIGN_OR_RETURN(decode_contract_, layout::BuildKvContract(shape, spec_.decode_tp));
    // Every group's block table is pages 1..pages; each group keeps the slots its rules say
    // (a sliding window its last tokens, a state group one snapshot, CACHEPD §5.2).
    std::vector<int64_t> blocks;
    for (int64_t i = 1; i <= pages_; ++i) blocks.push_back(i);
    const std::vector<std::vector<int64_t>> tables(prefill_contract_.group_specs.size(), blocks);
    KVRAIL_ASSIGN_OR_RETURN(src_,
                            layout::BuildManifest(prefill_contract_, tables, 0, spec_.tokens));
    KVRAIL_ASSIGN_OR_RETURN(dst_, layout::BuildManifest(decode_contract_, tables, 0, spec_.tokens));
    KVRAIL_ASSIGN_OR_RETURN(src_wire_, layout::SerializeManifest(src_));
    KVRAIL_ASSIGN_OR_RETURN(dst_wire_, layout::SerializeManifest(dst_));
    KVRAIL_RETURN_IF_ERROR(CountUncoalesced());

    cluster::ClusterOptions options;
    options.kvrail = spec_.kvrail;
    options.prefill_tp = spec_.prefill_tp;
    options.decode_tp = spec_.decode_tp;
    options.link = spec_.link == "netns" ? "tcp" : spec_.link;
    if (spec_.link == "netns") {
      options.prefill_node = spec_.prefill_node;
      options.decode_node = spec_.decode_node;
    }
    options.log_dir = spec_.log_dir;
    options.engine_sims = false;
    options.sidecar_args = spec_.sidecar_args;
    KVRAIL_ASSIGN_OR_RETURN(cluster_, cluster::Cluster::Start(options));
    KVRAIL_ASSIGN_OR_RETURN(const std::string prefill_wire,
                            layout::SerializeContract(prefill_contract_));
    KVRAIL_ASSIGN_OR_RETURN(const std::string decode_wire,
                            layout::SerializeContract(decode_contract_));
    for (int p = 0; p < spec_.prefill_tp; ++p) {
      KVRAIL_ASSIGN_OR_RETURN(
          Rank rank,
          Attach(absl::StrCat("prefill rank ", p), cluster_->prefill_sidecar(p).engine_endpoint,
                 prefill_contract_, prefill_wire, spec_.prefill_tp, p));
      // The "computed" KV cache, written before any room is timed.
      KVRAIL_RETURN_IF_ERROR(rank.layout->Fill(src_, kPatternKey, rank.arena->bytes()));
      prefill_.push_back(std::move(rank));
    }
    for (int d = 0; d < spec_.decode_tp; ++d) {
      KVRAIL_ASSIGN_OR_RETURN(Rank rank, Attach(absl::StrCat("decode rank ", d),
                                                cluster_->decode_sidecar(d).engine_endpoint,
                                                decode_contract_, decode_wire, spec_.decode_tp, d));
      decode_.push_back(std::move(rank));
    }
    // The first copy's destination on decode rank 0: the first group's first field (field_id
    // order, as whole-field copies and fragments go, CACHEPD §6.9), at the group's first block.
    const std::string& group = decode_contract_.group_specs.front().group_id;
    const layout::FieldLayout* first = nullptr;
    for (const layout::FieldLayout& f : decode_contract_.plan.fields) {
      if (f.group_id == group && (first == nullptr || f.field_id < first->field_id)) first = &f;
    }
    KVRAIL_ASSIGN_OR_RETURN(
        first_byte_offset_,
        layout::PageOffset(decode_contract_, *first, dst_.groups.front().block_ids.front()));
    return absl::OkStatus();
  }

  absl::StatusOr<KvRoomFigures> Room(uint64_t room, bool whole_check) {
    KvRoomFigures figures;
    for (Rank& d : decode_) std::memset(d.arena->bytes().data(), 0, d.arena->bytes().size());
    KVRAIL_ASSIGN_OR_RETURN(const SideCpu cpu_before, ReadSideCpu());
    for (Rank& d : decode_) {
      v1::EngineRequest expect;
      expect.mutable_expect()->set_room(room);
      expect.mutable_expect()->set_bootstrap_address(cluster_->bootstrap());
      expect.mutable_expect()->set_destination_manifest(dst_wire_);
      absl::StatusOr<v1::EngineReply> reply = d.client->Call(expect, absl::Seconds(30));
      if (!reply.ok()) return AddContext(reply.status(), absl::StrCat(d.name, ": Expect"));
    }
    KVRAIL_RETURN_IF_ERROR(AwaitPreallocations(room));

    const Clock::time_point start = Clock::now();
    FirstByteWatch watch(decode_[0].arena->bytes().data() + first_byte_offset_, start);
    const bool layerwise = spec_.layer_step > 0;
    if (layerwise) {
      // The forward pass: layer after layer of simulated compute, each step's layers said final
      // as it ends (the first call names the source blocks).
      const int64_t layers = spec_.shape.layers;
      for (int64_t done = spec_.layer_step; done < layers; done += spec_.layer_step) {
        SleepUntil(start, spec_.layer_compute * done);
        for (Rank& p : prefill_) {
          v1::EngineRequest request;
          request.mutable_layers_ready()->set_room(room);
          request.mutable_layers_ready()->set_layers(done);
          if (done == spec_.layer_step) {
            request.mutable_layers_ready()->set_source_manifest(src_wire_);
          }
          KVRAIL_RETURN_IF_ERROR(p.client->Send(std::move(request)).status());
        }
      }
      SleepUntil(start, spec_.layer_compute * layers);
    }
    const Clock::time_point ready_at = Clock::now();
    for (Rank& p : prefill_) {
      v1::EngineRequest ready;
      ready.mutable_ready()->set_room(room);
      if (!layerwise) ready.mutable_ready()->set_source_manifest(src_wire_);
      ready.mutable_ready()->set_bootstrap_token(static_cast<int64_t>(room));
      KVRAIL_RETURN_IF_ERROR(p.client->Send(std::move(ready)).status());
    }
    absl::Status landed = AwaitDecodeEvents(room, start, figures);
    if (layerwise) figures.exposed_seconds = figures.latency_seconds - Since(start, ready_at);
    figures.first_byte_seconds = watch.Finish();
    KVRAIL_RETURN_IF_ERROR(landed);
    KVRAIL_RETURN_IF_ERROR(AwaitPrefillEvents(room, figures));
    KVRAIL_ASSIGN_OR_RETURN(const SideCpu cpu_after, ReadSideCpu());
    figures.prefill_cpu_seconds = cpu_after.prefill - cpu_before.prefill;
    figures.decode_cpu_seconds = cpu_after.decode - cpu_before.decode;

    for (Rank& d : decode_) {
      const absl::Status checked =
          whole_check
              ? d.layout->Check(dst_, kPatternKey, d.arena->bytes())
              : d.layout->CheckSample(dst_, kPatternKey, d.arena->bytes(), spec_.sample_every,
                                      static_cast<int64_t>(room % spec_.sample_every));
      if (!checked.ok()) {
        return AddContext(checked, absl::StrCat("bench kv: room ", room, " on ", d.name));
      }
      // What the check compared: each group's sampled manifest positions of its fields.
      const int64_t every = whole_check ? 1 : spec_.sample_every;
      const int64_t first = whole_check ? 0 : static_cast<int64_t>(room % every);
      for (const layout::FieldLayout& f : decode_contract_.plan.fields) {
        int64_t n = 0;
        for (const layout::ManifestGroup& g : dst_.groups) {
          if (g.group_id == f.group_id) n = static_cast<int64_t>(g.block_ids.size());
        }
        const int64_t positions = first < n ? (n - first + every - 1) / every : 0;
        figures.bytes_checked += static_cast<uint64_t>(positions * f.page_stride_bytes);
      }
    }
    return figures;
  }

  uint64_t uncoalesced() const { return uncoalesced_; }

 private:
  // The CPU seconds used so far by each side's sidecars, all ranks together.
  struct SideCpu {
    double prefill = 0;
    double decode = 0;
  };
  absl::StatusOr<SideCpu> ReadSideCpu() {
    SideCpu cpu;
    for (int p = 0; p < spec_.prefill_tp; ++p) {
      KVRAIL_ASSIGN_OR_RETURN(const double seconds,
                              process::CpuSeconds(cluster_->prefill_sidecar(p).process->pid()));
      cpu.prefill += seconds;
    }
    for (int d = 0; d < spec_.decode_tp; ++d) {
      KVRAIL_ASSIGN_OR_RETURN(const double seconds,
                              process::CpuSeconds(cluster_->decode_sidecar(d).process->pid()));
      cpu.decode += seconds;
    }
    return cpu;
  }

  absl::Status CountUncoalesced() {
    KVRAIL_ASSIGN_OR_RETURN(const plan::Planner planner,
                            plan::Planner::Create(spec_.prefill_tp, spec_.decode_tp,
                                                  prefill_contract_, decode_contract_));
    for (int p = 0; p < spec_.prefill_tp; ++p) {
      for (int d = 0; d < spec_.decode_tp; ++d) {
        const plan::RegistrationOutcome outcome = planner.OnRegistration(p, d);
        if (outcome.kind != plan::RegistrationOutcome::Kind::kSend) continue;
        KVRAIL_ASSIGN_OR_RETURN(const plan::CopyPlan copy_plan,
                                plan::CopyPlan::Bind(prefill_contract_, decode_contract_,
                                                     outcome.fragments, outcome.owner_filters));
        uncoalesced_ += static_cast<uint64_t>(copy_plan.CountCopies(src_));
      }
    }
    return absl::OkStatus();
  }

  // Ready goes out once every prefill rank holds the room's pre-allocations (a prefill room is
  // Bootstrapped then, CACHEPD §7.1), so the timed part is the transfer, not the decode's
  // CachePD round trips.
  absl::Status AwaitPreallocations(uint64_t room) {
    const absl::Time deadline = absl::Now() + kStall;
    for (Rank& p : prefill_) {
      while (true) {
        v1::EngineRequest poll;
        poll.mutable_poll()->add_rooms(room);
        absl::StatusOr<v1::EngineReply> reply = p.client->Call(poll, absl::Seconds(10));
        if (!reply.ok()) return AddContext(reply.status(), absl::StrCat(p.name, ": Poll"));
        const v1::RoomState& state = reply->states(0);
        if (state.status() == v1::TRANSFER_POLL_BOOTSTRAPPED) break;
        if (state.status() == v1::TRANSFER_POLL_FAILED && state.reason() != "unknown room") {
          return absl::InternalError(absl::StrCat("bench kv: room ", room, " failed on ", p.name,
                                                  " before Ready: ", state.reason()));
        }
        if (absl::Now() > deadline) {
          return absl::DeadlineExceededError(absl::StrCat("bench kv: room ", room, ": ", p.name,
                                                          " got no pre-allocation in ",
                                                          absl::FormatDuration(kStall)));
        }
        absl::SleepFor(absl::Microseconds(200));
      }
    }
    return absl::OkStatus();
  }

  absl::Status AwaitDecodeEvents(uint64_t room, Clock::time_point start, KvRoomFigures& figures) {
    const absl::Time deadline = absl::Now() + kStall;
    std::vector<bool> done(decode_.size(), false);
    size_t left = decode_.size();
    while (left > 0) {
      for (size_t i = 0; i < decode_.size(); ++i) {
        if (done[i]) continue;
        std::optional<v1::RoomEvent> event =
            decode_[i].client->NextEvent(absl::Microseconds(decode_.size() == 1 ? 50000 : 200));
        if (!event.has_value() || event->room() != room) continue;
        if (event->status() != v1::TRANSFER_POLL_SUCCESS) {
          return absl::InternalError(absl::StrCat("bench kv: room ", room, " on ", decode_[i].name,
                                                  " ended ", v1::TransferPoll_Name(event->status()),
                                                  ": ", event->reason()));
        }
        done[i] = true;
        --left;
      }
      if (left > 0 && absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "bench kv: room ", room, ": no decode event in ", absl::FormatDuration(kStall)));
      }
    }
    figures.latency_seconds = Since(start, Clock::now());
    return absl::OkStatus();
  }

  absl::Status AwaitPrefillEvents(uint64_t room, KvRoomFigures& figures) {
    const absl::Time deadline = absl::Now() + kStall;
    for (Rank& p : prefill_) {
      while (true) {
        KVRAIL_ASSIGN_OR_RETURN(std::optional<v1::SidecarMessage> message,
                                p.client->NextMessage(absl::Milliseconds(100)));
        if (!message.has_value()) {
          if (absl::Now() > deadline) {
            return absl::DeadlineExceededError(absl::StrCat("bench kv: room ", room,
                                                            ": no event from ", p.name, " in ",
                                                            absl::FormatDuration(kStall)));
          }
          continue;
        }
        if (message->has_reply()) {
          if (!message->reply().error().empty()) {
            return absl::InternalError(
                absl::StrCat("bench kv: room ", room, ": ", p.name,
                             " refused a request: ", message->reply().error()));
          }
          continue;
        }
        const v1::RoomEvent& event = message->event();
        if (event.room() != room) continue;
        if (event.status() != v1::TRANSFER_POLL_SUCCESS) {
          return absl::InternalError(absl::StrCat("bench kv: room ", room, " on ", p.name,
                                                  " ended ", v1::TransferPoll_Name(event.status()),
                                                  ": ", event.reason()));
        }
        figures.bytes += event.bytes();
        figures.coalesced_copies += event.copies();
        figures.data_plane_seconds = std::max(figures.data_plane_seconds, event.seconds());
        break;
      }
    }
    return absl::OkStatus();
  }

  const KvCaseSpec spec_;
  int64_t pages_ = 0;
  layout::Contract prefill_contract_, decode_contract_;
  layout::Manifest src_, dst_;
  std::string src_wire_, dst_wire_;
  uint64_t uncoalesced_ = 0;
  int64_t first_byte_offset_ = 0;
  std::unique_ptr<cluster::Cluster> cluster_;
  std::vector<Rank> prefill_, decode_;
};

absl::StatusOr<std::unique_ptr<KvCaseRunner>> KvCaseRunner::Start(const KvCaseSpec& spec) {
  if (spec.sample_every < 1 || spec.tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("bench kv: sample_every ", spec.sample_every,
                                                   " and tokens ", spec.tokens,
                                                   " must each be >= 1"));
  }
  std::unique_ptr<KvCaseRunner> runner(new KvCaseRunner());
  runner->impl_ = std::make_unique<Impl>(spec);
  KVRAIL_RETURN_IF_ERROR(runner->impl_->Start());
  return runner;
}

KvCaseRunner::~KvCaseRunner() = default;

absl::StatusOr<KvRoomFigures> KvCaseRunner::NextRoom() {
  ++rooms_run_;
  return impl_->Room(rooms_run_, rooms_run_ == 1);
}

uint64_t KvCaseRunner::uncoalesced_copies() const { return impl_->uncoalesced(); }

}  // namespace kvrail::bench
