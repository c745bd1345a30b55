#include "engine/transport/loopback/loopback_transport.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "engine/base/error.h"
#include "engine/sync/thread_name.h"
#include "engine/transport/bounds.h"
#include "engine/transport/region_table.h"
#include "engine/transport/shared_region.h"

namespace kvrail::transport {
namespace loopback_internal {

// One registration, as the process-wide registry knows it. Writers pin it for the length of a
// memcpy; Revoke stops new pins and waits for the current ones, after which nothing touches
// [base, base + length) again.
struct RegionEntry {
  RegionEntry(uint64_t key, std::byte* base, uint64_t length)
      : key(key), base(base), length(length) {}

  // False once revoked.
  bool Pin() {
    std::lock_guard<std::mutex> lock(mu);
    if (!alive) return false;
    ++pins;
    return true;
  }

  void Unpin() {
    std::lock_guard<std::mutex> lock(mu);
    if (--pins == 0 && !alive) drained.notify_all();
  }

  void Revoke() {
    std::unique_lock<std::mutex> lock(mu);
    alive = false;
    drained.wait(lock, [this] { return pins == 0; });
  }

  uint64_t address() const { return reinterpret_cast<uintptr_t>(base); }

  const uint64_t key;  // the process-wide name, never reused
  std::byte* const base;
  const uint64_t length;

  std::mutex mu;
  std::condition_variable drained;
  // Guarded by mu:
  bool alive = true;
  int pins = 0;
};

namespace {

// Every live loopback transport and region in the process. Remote keys and lane addresses name
// entries here instead of carrying raw pointers.
class Registry {
 public:
  static Registry& Get() {
    static Registry* registry = new Registry;  // never destroyed: transports may outlive main
    return *registry;
  }

  uint64_t AddTransport() {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t id = next_transport_++;
    transports_.insert(id);
    return id;
  }

  void RemoveTransport(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    transports_.erase(id);
  }

  bool TransportAlive(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    return transports_.contains(id);
  }

  std::shared_ptr<RegionEntry> AddRegion(std::byte* base, uint64_t length) {
    std::lock_guard<std::mutex> lock(mu_);
    auto entry = std::make_shared<RegionEntry>(next_key_++, base, length);
    regions_.emplace(entry->key, entry);
    return entry;
  }

  void RemoveRegion(uint64_t key) {
    std::lock_guard<std::mutex> lock(mu_);
    regions_.erase(key);
  }

  // Null when no live region has `key`.
  std::shared_ptr<RegionEntry> FindRegion(uint64_t key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(key);
    return it == regions_.end() ? nullptr : it->second;
  }

 private:
  std::mutex mu_;
  // Guarded by mu_:
  uint64_t next_transport_ = 1;
  uint64_t next_key_ = 1;
  absl::flat_hash_set<uint64_t> transports_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<RegionEntry>> regions_;
};

// Wire forms, little-endian: a lane address is (transport id u64, lane u32); a remote key is
// (transport id u64, region key u64).
constexpr size_t kLaneAddressBytes = 12;
constexpr size_t kRemoteKeyBytes = 16;

void PutLe(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t GetLe(absl::string_view in, size_t offset, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) {
    value |= uint64_t{static_cast<unsigned char>(in[offset + i])} << (8 * i);
  }
  return value;
}

}  // namespace
}  // namespace loopback_internal

using loopback_internal::RegionEntry;
using loopback_internal::Registry;

struct LoopbackTransport::Peer {
  Peer(PeerId id, RemoteRegions regions, int lanes) : id(id), regions(std::move(regions)) {
    lane_errors.resize(lanes);
  }

  const PeerId id;
  const RemoteRegions regions;
  // By descriptor region index; null where the key named no live region at Connect.
  std::vector<std::shared_ptr<RegionEntry>> entries;
  // Set under the transport's mu_, so that waits on mu_ see it.
  std::atomic<bool> disconnected{false};
  // The first failure per lane since that lane's last Flush. Progress thread only.
  std::vector<absl::Status> lane_errors;
};

struct LoopbackTransport::Job {
  bool flush = false;
  std::shared_ptr<Peer> peer;
  int lane = 0;
  std::shared_ptr<RegionEntry> source;  // batches only
  std::vector<Write> writes;            // batches only
  Completion done;
};

absl::StatusOr<std::unique_ptr<LoopbackTransport>> LoopbackTransport::Create(
    const LoopbackOptions& options) {
  if (options.lanes < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("loopback options: lanes is %d; at least 1 is needed", options.lanes));
  }
  if (options.max_write_bytes == 0) {
    return absl::InvalidArgumentError("loopback options: max_write_bytes is 0; it must be > 0");
  }
  return std::unique_ptr<LoopbackTransport>(
      new LoopbackTransport(options, Registry::Get().AddTransport()));
}

LoopbackTransport::LoopbackTransport(const LoopbackOptions& options, uint64_t id)
    : id_(id),
      capabilities_{
          .name = "loopback",
          .lanes = options.lanes,
          .one_sided = true,
          .gpu_memory = false,
          .max_write_bytes = options.max_write_bytes,
          .max_inflight_bytes_per_endpoint = options.max_inflight_bytes_per_endpoint,
          .strided_writes = true,
          .lands_rows_apart_whole = true,
      } {
  progress_ = std::thread([this] { RunProgress(); });
  NameThread(progress_, "kvrail-loopback");
  // Written before anyone can read it: the progress thread reads it only from a job, which it
  // takes under mu_ after Create returned, and other threads only once Create returned.
  progress_id_ = progress_.get_id();
}

LoopbackTransport::~LoopbackTransport() { Close(); }

bool LoopbackTransport::OnProgressThread() const {
  return std::this_thread::get_id() == progress_id_;
}

absl::StatusOr<RegionId> LoopbackTransport::Register(const LocalRegion& region) {
  KVRAIL_RETURN_IF_ERROR(CheckLocalRegion(region, capabilities_.gpu_memory));
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("Register: the transport is closed");
  KVRAIL_RETURN_IF_ERROR(regions_.CheckDisjoint(region));
  return regions_.Add(
      reinterpret_cast<uintptr_t>(region.base), region.length,
      Registry::Get().AddRegion(static_cast<std::byte*>(region.base), region.length));
}

absl::StatusOr<SharedRegion> LoopbackTransport::Allocate(uint64_t length) {
  KVRAIL_ASSIGN_OR_RETURN(MemfdAllocation allocation, AllocateOnMemfd(*this, length));
  std::lock_guard<std::mutex> lock(mu_);
  allocated_.emplace(allocation.shared.region, std::move(allocation.arena));
  return allocation.shared;
}

absl::Status LoopbackTransport::Deregister(RegionId region) {
  std::shared_ptr<RegionEntry> entry;
  std::unique_ptr<Arena> allocated;  // freed once no write touches it
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return absl::FailedPreconditionError("Deregister: the transport is closed");
    KVRAIL_ASSIGN_OR_RETURN(entry, regions_.Remove(region));
    if (auto owned = allocated_.find(region); owned != allocated_.end()) {
      allocated = std::move(owned->second);
      allocated_.erase(owned);
    }
  }
  Registry::Get().RemoveRegion(entry->key);
  entry->Revoke();
  return absl::OkStatus();
}

absl::StatusOr<v1::HandshakeDescriptor> LoopbackTransport::LocalDescriptor() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("LocalDescriptor: the transport is closed");
  v1::HandshakeDescriptor descriptor;
  descriptor.set_version(regions_.version());
  descriptor.set_transport(v1::TRANSPORT_KIND_LOOPBACK);
  for (int lane = 0; lane < capabilities_.lanes; ++lane) {
    std::string address;
    loopback_internal::PutLe(address, id_, 8);
    loopback_internal::PutLe(address, static_cast<uint64_t>(lane), 4);
    descriptor.add_lanes()->set_address(std::move(address));
  }
  for (const auto& [id, registered] : regions_) {
    const RegionEntry* entry = registered.entry.get();
    v1::Region* region = descriptor.add_regions();
    region->set_base(entry->address());
    region->set_length(entry->length);
    std::string key;
    loopback_internal::PutLe(key, id_, 8);
    loopback_internal::PutLe(key, entry->key, 8);
    region->set_remote_key(std::move(key));
    region->set_memory_kind(v1::MEMORY_KIND_HOST);
  }
  return descriptor;
}

absl::StatusOr<PeerId> LoopbackTransport::Connect(const v1::HandshakeDescriptor& peer) {
  using loopback_internal::GetLe;
  using loopback_internal::kLaneAddressBytes;
  using loopback_internal::kRemoteKeyBytes;
  KVRAIL_RETURN_IF_ERROR(CheckPeerKind(peer, v1::TRANSPORT_KIND_LOOPBACK, "loopback"));
  uint64_t peer_id = 0;
  for (int i = 0; i < peer.lanes_size(); ++i) {
    const std::string& address = peer.lanes(i).address();
    if (address.size() != kLaneAddressBytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("peer descriptor: lane %d address has %d bytes; loopback uses %d", i,
                          address.size(), kLaneAddressBytes));
    }
    const uint64_t transport = GetLe(address, 0, 8);
    if (i == 0) peer_id = transport;
    if (transport != peer_id || GetLe(address, 8, 4) != static_cast<uint64_t>(i)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "peer descriptor: lane %d address does not name lane %d of transport %d", i, i, peer_id));
    }
  }
  KVRAIL_ASSIGN_OR_RETURN(RemoteRegions regions, RemoteRegions::FromDescriptor(peer));
  std::vector<std::shared_ptr<RegionEntry>> entries(peer.regions_size());
  for (int i = 0; i < peer.regions_size(); ++i) {
    const v1::Region& region = peer.regions(i);
    if (region.remote_key().size() != kRemoteKeyBytes ||
        GetLe(region.remote_key(), 0, 8) != peer_id) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "peer descriptor: region %d remote key is not a loopback key of transport %d", i,
          peer_id));
    }
    // A key that names no live region is a stale descriptor: writes into it fail with
    // kUnavailable, as they would on a real network.
    entries[i] = Registry::Get().FindRegion(GetLe(region.remote_key(), 8, 8));
    if (entries[i] != nullptr &&
        (entries[i]->address() != region.base() || entries[i]->length != region.length())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "peer descriptor: region %d [0x%x, +%u) does not match its key's registration "
          "[0x%x, +%u)",
          i, region.base(), region.length(), entries[i]->address(), entries[i]->length));
    }
  }
  if (!Registry::Get().TransportAlive(peer_id)) {
    return absl::UnavailableError(
        absl::StrFormat("peer descriptor: loopback transport %d is closed", peer_id));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("Connect: the transport is closed");
  const PeerId id = next_peer_++;
  auto state = std::make_shared<Peer>(id, std::move(regions), capabilities_.lanes);
  state->entries = std::move(entries);
  peers_.emplace(id, std::move(state));
  return id;
}

absl::StatusOr<std::shared_ptr<LoopbackTransport::Peer>> LoopbackTransport::FindPeer(
    PeerId peer, int lane) const {
  if (closed_) return absl::FailedPreconditionError("the transport is closed");
  KVRAIL_RETURN_IF_ERROR(CheckLane(lane, capabilities_.lanes));
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("peer %d is not connected (never connected, or disconnected)", peer));
  }
  return it->second;
}

absl::Status LoopbackTransport::Enqueue(Job job) {
  // Checked again: Close may have run since the caller last held mu_, and the progress thread
  // stops taking jobs once it has drained the queue after Close.
  if (closed_) return absl::FailedPreconditionError("the transport is closed");
  queue_.push_back(std::move(job));
  changed_.notify_all();
  return absl::OkStatus();
}

absl::Status LoopbackTransport::PostWrites(PeerId peer, int lane, RegionId source,
                                           absl::Span<const Write> writes, Completion done) {
  const std::string context =
      absl::StrFormat("PostWrites to peer %d lane %d from region %d", peer, lane, source);
  if (!done) return absl::InvalidArgumentError(context + ": the completion is empty");
  Job job{.flush = false, .lane = lane, .done = std::move(done)};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto found = FindPeer(peer, lane);
    if (!found.ok()) return AddContext(found.status(), context);
    job.peer = *std::move(found);
    const auto* registered = regions_.Find(source);
    if (registered == nullptr) {
      return absl::NotFoundError(
          absl::StrFormat("%s: source region %d is not registered", context, source));
    }
    job.source = registered->entry;
  }
  // Bounds before bytes: the whole batch, outside the lock, before it is queued.
  KVRAIL_RETURN_IF_ERROR(AddContext(
      CheckWrites(writes, job.source->length, job.peer->regions, capabilities_), context));
  job.writes.assign(writes.begin(), writes.end());
  std::lock_guard<std::mutex> lock(mu_);
  return AddContext(Enqueue(std::move(job)), context);
}

absl::Status LoopbackTransport::Flush(PeerId peer, int lane, Completion done) {
  const std::string context = absl::StrFormat("Flush of peer %d lane %d", peer, lane);
  if (!done) return absl::InvalidArgumentError(context + ": the completion is empty");
  std::lock_guard<std::mutex> lock(mu_);
  auto found = FindPeer(peer, lane);
  if (!found.ok()) return AddContext(found.status(), context);
  return AddContext(
      Enqueue(Job{.flush = true, .peer = *std::move(found), .lane = lane, .done = std::move(done)}),
      context);
}

absl::Status LoopbackTransport::Disconnect(PeerId peer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("Disconnect: the transport is closed");
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    return absl::NotFoundError(absl::StrFormat("Disconnect: peer %d is not connected", peer));
  }
  // Queued jobs keep the Peer alive; the progress thread cancels them when it reaches them.
  it->second->disconnected.store(true);
  peers_.erase(it);
  changed_.notify_all();  // cuts a delayed completion of this peer short
  return absl::OkStatus();
}

void LoopbackTransport::Close() {
  std::vector<std::shared_ptr<RegionEntry>> regions;
  bool first = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) {
      // Another Close got here first: wait until it has withdrawn the registrations.
      changed_.wait(lock, [this] { return revoked_; });
    } else {
      first = true;
      closed_ = true;
      stopping_.store(true);
      regions = regions_.TakeAll();
      for (auto& [id, peer] : peers_) peer->disconnected.store(true);
      peers_.clear();
      changed_.notify_all();
    }
  }
  if (first) {
    Registry::Get().RemoveTransport(id_);
    for (const auto& entry : regions) {
      Registry::Get().RemoveRegion(entry->key);
      entry->Revoke();  // waits for writes in progress, ours and peers'
    }
    std::map<RegionId, std::unique_ptr<Arena>> allocated;  // freed after the lock
    std::lock_guard<std::mutex> lock(mu_);
    allocated.swap(allocated_);
    revoked_ = true;
    changed_.notify_all();
  }
  // From a completion the progress thread cannot join itself; it drains the queue, cancelling
  // every job, and exits once that completion returns.
  if (OnProgressThread()) return;
  std::lock_guard<std::mutex> lock(join_mu_);
  if (progress_.joinable()) progress_.join();
}

void LoopbackTransport::FailNextWrites(int count) {
  std::lock_guard<std::mutex> lock(faults_mu_);
  fail_writes_ = count;
}

void LoopbackTransport::DelayCompletions(absl::Duration delay) {
  std::lock_guard<std::mutex> lock(faults_mu_);
  completion_delay_ = delay;
}

void LoopbackTransport::KillPeerAfterWrites(LoopbackTransport* peer, uint64_t writes) {
  std::lock_guard<std::mutex> lock(faults_mu_);
  kill_peer_ = peer;
  kill_after_writes_ = writes;
}

void LoopbackTransport::RunProgress() {
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [this] { return !queue_.empty() || closed_; });
      if (queue_.empty()) return;  // closed and drained
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::Status status;
    if (stopping_.load()) {
      status = absl::CancelledError(
          absl::StrFormat("%s to peer %d lane %d: the transport was closed before it ran",
                          job.flush ? "flush" : "batch", job.peer->id, job.lane));
    } else if (job.peer->disconnected.load()) {
      status = absl::CancelledError(
          absl::StrFormat("%s to peer %d lane %d: the peer was disconnected before it ran",
                          job.flush ? "flush" : "batch", job.peer->id, job.lane));
    } else if (job.flush) {
      // Every earlier batch of this lane has completed: the queue runs in posting order.
      status = std::exchange(job.peer->lane_errors[job.lane], absl::OkStatus());
    } else {
      status = RunWrites(job);
    }
    Deliver(job, std::move(status));
  }
}

absl::Status LoopbackTransport::RunWrites(Job& job) {
  const size_t n = job.writes.size();
  for (size_t i = 0; i < n; ++i) {
    if (stopping_.load() || job.peer->disconnected.load()) {
      return absl::CancelledError(absl::StrFormat(
          "batch to peer %d lane %d: cancelled after %d of %d writes (%s)", job.peer->id, job.lane,
          i, n, stopping_.load() ? "transport closed" : "peer disconnected"));
    }
    absl::Status status = BeforeWrite();
    if (status.ok()) status = CopyOne(job, job.writes[i], i);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status LoopbackTransport::BeforeWrite() {
  LoopbackTransport* victim = nullptr;
  {
    std::lock_guard<std::mutex> lock(faults_mu_);
    if (kill_peer_ != nullptr) {
      if (kill_after_writes_ == 0) {
        victim = std::exchange(kill_peer_, nullptr);
      } else {
        --kill_after_writes_;  // this write, if it lands, is one of them
      }
    }
    if (fail_writes_ > 0) {
      --fail_writes_;
      return absl::UnavailableError("loopback: injected write failure (FailNextWrites)");
    }
  }
  // No region is pinned here, so the victim's Close can withdraw its regions.
  if (victim != nullptr) victim->Close();
  return absl::OkStatus();
}

absl::Status LoopbackTransport::CopyOne(const Job& job, const Write& write, size_t index) {
  const size_t n = job.writes.size();
  if (!job.source->Pin()) {
    return absl::CancelledError(absl::StrFormat(
        "batch to peer %d: write %d of %d: the source region was deregistered in flight",
        job.peer->id, index, n));
  }
  // PostWrites checked that one region holds the destination.
  const int region = *job.peer->regions.Find(write.remote_address, RemoteSpan(write));
  RegionEntry* target = job.peer->entries[region].get();
  if (target == nullptr || !target->Pin()) {
    job.source->Unpin();
    return absl::UnavailableError(absl::StrFormat(
        "batch to peer %d: write %d of %d: peer region %d was deregistered or its transport "
        "closed",
        job.peer->id, index, n, region));
  }
  // Connect matched the descriptor's base and length to the registration.
  std::byte* to = target->base + (write.remote_address - target->address());
  const std::byte* from = job.source->base + write.local_offset;
  for (uint64_t row = 0; row < write.rows; ++row) {
    std::memmove(to + row * write.remote_stride, from + row * write.local_stride, write.length);
  }
  target->Unpin();
  job.source->Unpin();
  return absl::OkStatus();
}

void LoopbackTransport::Deliver(Job& job, absl::Status status) {
  absl::Duration delay;
  {
    std::lock_guard<std::mutex> lock(faults_mu_);
    delay = completion_delay_;
  }
  if (delay > absl::ZeroDuration()) {
    // Clamped so that now + delay cannot overflow the clock.
    delay = std::min(delay, absl::Hours(24 * 365));
    std::unique_lock<std::mutex> lock(mu_);
    const Peer* peer = job.peer.get();
    const bool cut_short = changed_.wait_for(lock, absl::ToChronoNanoseconds(delay), [this, peer] {
      return closed_ || peer->disconnected.load();
    });
    if (cut_short && status.ok()) {
      status = absl::CancelledError(
          absl::StrFormat("%s to peer %d lane %d: %s before its completion was reported",
                          job.flush ? "flush" : "batch", peer->id, job.lane,
                          closed_ ? "the transport was closed" : "the peer was disconnected"));
    }
  }
  if (!job.flush && !status.ok() && job.peer->lane_errors[job.lane].ok()) {
    job.peer->lane_errors[job.lane] = status;
  }
  Completion done = std::move(job.done);
  job = Job{};  // drop the job's references before user code runs
  done(std::move(status));
}

}  // namespace kvrail::transport
