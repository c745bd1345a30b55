#include "engine/transport/ucx/ucx_transport.h"

#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/base/error.h"
#include "engine/transport/bounds.h"
#include "engine/transport/peer_process.h"
#include "engine/transport/region_table.h"
#include "engine/transport/shared_region.h"
#include "engine/transport/ucx/ucx_context.h"
#include "engine/transport/ucx/ucx_endpoint.h"
#include "engine/transport/ucx/ucx_lane.h"
#include "engine/transport/ucx/ucx_memory.h"

namespace kvrail::transport {

using ucx_internal::AllLanes;
using ucx_internal::BatchContext;
using ucx_internal::ConnectWait;
using ucx_internal::FlushContext;
using ucx_internal::Lane;
using ucx_internal::Op;
using ucx_internal::OpKind;
using ucx_internal::PeerName;
using ucx_internal::PeerState;
using ucx_internal::RegionState;

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(const UcxOptions& options) {
  KVRAIL_RETURN_IF_ERROR(ucx_internal::CheckOptions(options));
  std::unique_ptr<UcxTransport> transport(new UcxTransport(options));
  absl::Status status = transport->Init(options);
  if (!status.ok()) {
    transport->Close();
    return status;
  }
  for (auto& lane : transport->lanes_) {
    lane->thread = std::thread([l = lane.get()] { ucx_internal::RunLane(*l); });
    transport->lane_threads_.push_back(lane->thread.get_id());
  }
  return transport;
}

UcxTransport::UcxTransport(const UcxOptions& options)
    : capabilities_{
          .name = "ucx",
          .lanes = options.lanes,
          .one_sided = true,
          .gpu_memory = false,
          .max_write_bytes = options.max_write_bytes,
          .max_inflight_bytes_per_endpoint = InflightBytesPerEndpoint(options),
          // Writes in the kernel's socket buffers or the peer's FIFO outlive a force close.
          .disconnect_fences = false,
          .strided_writes = true,
          // Over shared memory or tcp alone; where UCX may choose RDMA, a put per row.
          .lands_rows_apart_whole = SharedMemoryOnly(options.tls) || TcpOnly(options.tls),
          // Only the lanes' own stores share a pass (ucx_puts.h, StoreSharedRows).
          .lanes_share_rows = SharedMemoryOnly(options.tls),
      },
      self_(SelfProcess()),
      shared_(std::make_unique<ucx_internal::Shared>()),
      connect_timeout_(options.connect_timeout),
      shared_memory_only_(SharedMemoryOnly(options.tls)) {}

absl::Status UcxTransport::Init(const UcxOptions& options) {
  KVRAIL_ASSIGN_OR_RETURN(ucx_internal::Context made, ucx_internal::CreateContext(options));
  context_ = made.context;
  shared_->am_writes = made.am_writes;
  capabilities_.peer_lanes_receive = made.am_writes;  // the target's lane copies each message in
  shared_->am_slice_bytes = made.am_slice_bytes;
  shared_->landing_stores = options.landing_stores;
  shared_->writer_name = options.writer_name;
  capabilities_.refuses_writers = made.am_writes;  // the target's lane lands every write
  for (int index = 0; index < options.lanes; ++index) {
    KVRAIL_RETURN_IF_ERROR(ucx_internal::AddLane(made.context, index, shared_.get(), lanes_));
  }
  return absl::OkStatus();
}

UcxTransport::~UcxTransport() {
  Close();
  if (context_ != nullptr) ucp_cleanup(static_cast<ucp_context_h>(context_));
}

absl::StatusOr<RegionId> UcxTransport::Register(const LocalRegion& region) {
  KVRAIL_RETURN_IF_ERROR(CheckLocalRegion(region, capabilities_.gpu_memory));
  const uint64_t base = reinterpret_cast<uintptr_t>(region.base);
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("Register: the transport is closed");
  KVRAIL_RETURN_IF_ERROR(shared_->regions.CheckDisjoint(region));
  KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<RegionState> state,
                          ucx_internal::MapRegion(static_cast<ucp_context_h>(context_), region));
  AllLanes writing(lanes_);
  return shared_->regions.Add(base, region.length, std::move(state));
}

absl::StatusOr<size_t> UcxTransport::RefuseWriter(std::string_view writer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("RefuseWriter: the transport is closed");
  if (!shared_->am_writes || writer.empty()) return 0;
  // Each lane's handlers run holding its worker mutex: once it is released, every message the
  // lane handles next of those tokens is refused.
  size_t refused = 0;
  for (const auto& lane : lanes_) {
    std::lock_guard<std::mutex> working(lane->worker_mu);
    refused += lane->target.Refuse(writer);
  }
  return refused;
}

absl::StatusOr<SharedRegion> UcxTransport::Allocate(uint64_t length) {
  if (length == 0) {
    return absl::InvalidArgumentError("Allocate: length is 0; at least 1 byte is needed");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return absl::FailedPreconditionError("Allocate: the transport is closed");
    if (std::optional<ucx_internal::SharedSegment> segment =
            ucx_internal::AllocateSharedSegment(static_cast<ucp_context_h>(context_), length)) {
      const int fd = segment->state->shared_fd;
      AllLanes writing(lanes_);
      return SharedRegion{
          .region = shared_->regions.Add(reinterpret_cast<uintptr_t>(segment->address), length,
                                         std::move(segment->state)),
          .base = segment->address,
          .length = length,
          .fd = fd,
          .fd_offset = segment->fd_offset,
          .placement = "ucx-shm"};
    }
  }
  KVRAIL_ASSIGN_OR_RETURN(MemfdAllocation allocation, AllocateOnMemfd(*this, length));
  std::lock_guard<std::mutex> lock(mu_);
  allocated_.emplace(allocation.shared.region, std::move(allocation.arena));
  return allocation.shared;
}

absl::Status UcxTransport::Deregister(RegionId region) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("Deregister: the transport is closed");
  if (shared_->regions.Find(region) == nullptr) return RegionNotRegistered(region);
  {
    AllLanes writing(lanes_);  // no post checks, no lane sends from or copies into it now
    KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<RegionState> removed, shared_->regions.Remove(region));
    removed->Release(static_cast<ucp_context_h>(context_));
  }
  if (auto owned = allocated_.find(region); owned != allocated_.end()) allocated_.erase(owned);
  return absl::OkStatus();
}

absl::StatusOr<v1::HandshakeDescriptor> UcxTransport::LocalDescriptor() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("LocalDescriptor: the transport is closed");
  v1::HandshakeDescriptor descriptor;
  descriptor.set_version(shared_->regions.version());
  descriptor.set_transport(v1::TRANSPORT_KIND_UCX);
  *descriptor.mutable_owner() = self_;
  for (const auto& lane : lanes_) descriptor.add_lanes()->set_address(lane->address);
  for (const auto& [id, entry] : shared_->regions) {
    v1::Region* region = descriptor.add_regions();
    region->set_base(entry.base);
    region->set_length(entry.length);
    region->set_remote_key(entry.entry->rkey);
    region->set_memory_kind(v1::MEMORY_KIND_HOST);
  }
  return descriptor;
}

absl::StatusOr<PeerId> UcxTransport::Connect(const v1::HandshakeDescriptor& peer) {
  KVRAIL_RETURN_IF_ERROR(CheckPeerKind(peer, v1::TRANSPORT_KIND_UCX, "ucx"));
  for (int i = 0; i < peer.lanes_size(); ++i) {
    if (peer.lanes(i).address().empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("peer descriptor: lane %d has an empty UCX worker address", i));
    }
  }
  for (int i = 0; i < peer.regions_size(); ++i) {
    if (peer.regions(i).remote_key().empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("peer descriptor: region %d has an empty UCX remote key", i));
    }
  }
  KVRAIL_ASSIGN_OR_RETURN(RemoteRegions regions, RemoteRegions::FromDescriptor(peer));
  const int lanes = capabilities_.lanes;
  auto state = std::make_shared<PeerState>(std::move(regions), lanes, peer.regions_size());
  state->name = PeerName(peer);
  for (int index = 0; index < lanes; ++index) {
    state->remote_addresses.push_back(peer.lanes(index % peer.lanes_size()).address());
  }
  for (int r = 0; r < peer.regions_size(); ++r) {
    state->remote_keys.push_back(peer.regions(r).remote_key());
    state->remote_bases.push_back(peer.regions(r).base());
    state->remote_lengths.push_back(peer.regions(r).length());
  }
  state->mapped.assign(peer.regions_size(), 0);
  state->mapped_delta.assign(peer.regions_size(), 0);
  state->prefault.resize(peer.regions_size());
  auto wait = std::make_shared<ConnectWait>();
  wait->pending = lanes;
  state->connect_wait = wait;
  {
    // Every lane's thread creates the peer's endpoint and starts UCX's wireup on its own worker
    // (IssueConnect); this thread only queues the jobs, then waits holding no lock (see the
    // header). The id is taken now, before any lane can name the peer in a message; a Connect
    // that fails leaves its id unused.
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return absl::FailedPreconditionError("Connect: the transport is closed");
    state->id = next_peer_++;
    connecting_.push_back(state);
    for (auto& lane : lanes_) {
      std::lock_guard<std::mutex> queue(lane->mu);
      lane->PushLocked(lane->TakeOpLocked(), *state, OpKind::kConnect, {});
    }
  }
  bool timed_out = false;
  absl::Status failure;
  {
    std::unique_lock<std::mutex> lock(wait->mu);
    timed_out = !wait->changed.wait_for(lock, absl::ToChronoNanoseconds(connect_timeout_),
                                        [&wait] { return wait->pending == 0; });
    if (!timed_out) failure = wait->failure;
  }
  std::lock_guard<std::mutex> lock(mu_);
  AllLanes writing(lanes_);
  connecting_.erase(std::find(connecting_.begin(), connecting_.end(), state));
  if (closed_) {
    ClosePeer(state, "the transport was closed");  // done already by Close, unless raced
    return absl::FailedPreconditionError(
        absl::StrCat("Connect to ", state->name, ": the transport was closed while connecting"));
  }
  if (failure.ok() && timed_out) {
    failure = absl::DeadlineExceededError(absl::StrCat(
        "Connect to ", state->name, ": UCX's wireup with the peer's lanes did not finish within ",
        absl::FormatDuration(connect_timeout_), " (is the peer stopped or unreachable?)"));
  }
  if (failure.ok()) failure = WatchOwner(*state, peer.owner());
  if (!failure.ok()) {
    ClosePeer(state, "connect failed");
    return failure;
  }
  const PeerId id = state->id;
  peers_.emplace(id, std::move(state));
  return id;
}

absl::Status UcxTransport::WatchOwner(PeerState& state, const v1::ProcessIdentity& owner) const {
  // Only a peer certainly on this host's kernel: reached over shared memory alone, or with a
  // region UCX maps into this process (lane 0's connect job, done before the wait ended). A
  // boot id and a pid namespace alone could be another machine's (a VM cloned while running
  // keeps both), whose pids mean nothing here.
  const bool here = shared_memory_only_ ||
                    std::find(state.mapped.begin(), state.mapped.end(), 1) != state.mapped.end();
  if (!here) return absl::OkStatus();
  std::unique_ptr<PeerProcess> watch = PeerProcess::Watch(owner);
  if (watch != nullptr && watch->Exited()) {
    return absl::UnavailableError(
        absl::StrFormat("Connect to %s: the peer's process (pid %d) has exited: its descriptor "
                        "is stale (fetch it again)",
                        state.name, watch->pid()));
  }
  // Fixed before the peer is published: the lanes read it only for posts made after Connect.
  state.owner = std::move(watch);
  return absl::OkStatus();
}

absl::StatusOr<PeerState*> UcxTransport::FindPeerLocked(PeerId peer, int lane) const {
  if (closed_) return absl::FailedPreconditionError("the transport is closed");
  KVRAIL_RETURN_IF_ERROR(CheckLane(lane, capabilities_.lanes));
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("peer %d is not connected (never connected, or disconnected)", peer));
  }
  return it->second.get();
}

absl::StatusOr<UcxTransport::Started> UcxTransport::Start(
    PeerId peer, int lane, const Completion& done, absl::FunctionRef<std::string()> context) {
  if (!done) return absl::InvalidArgumentError(context() + ": the completion is empty");
  if (absl::Status checked = CheckLane(lane, capabilities_.lanes); !checked.ok()) {
    return AddContext(checked, context());
  }
  // Only this lane's queue mutex: writers of the peers and regions hold every lane's
  // (AllLanes), so lanes post at once and nothing they share is written on the way; and the
  // lane's thread holds it only to take its jobs, never across a UCX call.
  Lane& home = *lanes_[lane];
  std::unique_lock<std::mutex> lock(home.mu);
  auto found = FindPeerLocked(peer, lane);
  if (!found.ok()) return AddContext(found.status(), context());
  return Started{std::move(lock), &home, *found};
}

absl::Status UcxTransport::PostWrites(PeerId peer, int lane, RegionId source,
                                      absl::Span<const Write> writes, Completion done) {
  // Formatted only on the way to an error: posting is the hot path.
  const auto context = [&] { return BatchContext(peer, lane, source); };
  KVRAIL_ASSIGN_OR_RETURN(Started started, Start(peer, lane, done, context));
  Lane& home = *started.home;
  const auto* region = shared_->regions.Find(source);
  if (region == nullptr) {
    return absl::NotFoundError(
        absl::StrFormat("%s: source region %d is not registered", context(), source));
  }
  // Checked here, so that a bad batch is refused at once; the lane's thread sends it as it is.
  Op* op = home.TakeOpLocked();
  if (absl::Status checked = CheckWrites(writes, region->length, started.state->regions,
                                         capabilities_, &op->region_of);
      !checked.ok()) {
    op->region_of.clear();
    home.spare.emplace_back(op);
    return AddContext(checked, context());
  }
  op->source = source;
  op->base = reinterpret_cast<const std::byte*>(region->base);
  op->writes.assign(writes.begin(), writes.end());
  home.PushLocked(op, *started.state, OpKind::kBatch, std::move(done));
  return absl::OkStatus();
}

absl::Status UcxTransport::Flush(PeerId peer, int lane, Completion done) {
  const auto context = [&] { return FlushContext(peer, lane); };
  KVRAIL_ASSIGN_OR_RETURN(Started started, Start(peer, lane, done, context));
  Lane& home = *started.home;
  home.PushLocked(home.TakeOpLocked(), *started.state,
                  shared_->am_writes ? OpKind::kAmFlush : OpKind::kFlush, std::move(done));
  return absl::OkStatus();
}

void UcxTransport::ClosePeer(const std::shared_ptr<PeerState>& peer, const char* why) {
  if (peer->closed) return;
  peer->closed = true;
  peer->why = why;
  for (auto& lane : lanes_) {
    if (lane->stop) continue;  // torn down already: it has no endpoint of any peer
    Op* job = lane->TakeOpLocked();
    job->closing = peer;
    lane->PushLocked(job, *peer, OpKind::kClose, {});
  }
}

absl::Status UcxTransport::Disconnect(PeerId peer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("Disconnect: the transport is closed");
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    return absl::NotFoundError(absl::StrFormat(
        "Disconnect: peer %d is not connected (never connected, or disconnected)", peer));
  }
  // Every lane's worker mutex: no lane is sending for the peer while it is marked closed, and
  // from then on each sends nothing more for it (see "Fencing" in the header).
  AllLanes writing(lanes_);
  std::shared_ptr<PeerState> state = std::move(it->second);
  peers_.erase(it);
  ClosePeer(state, "the peer was disconnected");
  return absl::OkStatus();
}

bool UcxTransport::OnLaneThread() const {
  const std::thread::id self = std::this_thread::get_id();
  return std::find(lane_threads_.begin(), lane_threads_.end(), self) != lane_threads_.end();
}

TransportCounters UcxTransport::transport_counters() const {
  TransportCounters counters;
  for (const auto& lane : lanes_) {
    counters.lane_wakes_by_event += lane->wakes_by_event.load(std::memory_order_relaxed);
    counters.lane_wakes_by_job += lane->wakes_by_job.load(std::memory_order_relaxed);
    counters.lane_naps_ended += lane->naps_ended.load(std::memory_order_relaxed);
    counters.writes_stored_together += lane->writes_stored_together.load(std::memory_order_relaxed);
  }
  return counters;
}

void UcxTransport::ReleaseAll() {
  std::lock_guard<std::mutex> lock(mu_);
  if (released_) return;
  released_ = true;
  for (auto& region : shared_->regions.TakeAll()) {
    region->Release(static_cast<ucp_context_h>(context_));
  }
  allocated_.clear();
  // A lane whose thread never started (Create failed) still has its worker.
  for (auto& lane : lanes_) {
    if (lane->worker != nullptr) ucp_worker_destroy(lane->worker);
    lane->worker = nullptr;
  }
}

void UcxTransport::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    AllLanes writing(lanes_);
    if (!closed_) {
      closed_ = true;
      for (auto& [id, peer] : peers_) ClosePeer(peer, "the transport was closed");
      peers_.clear();
      // Their Connects wake up (their wireup is cancelled) and say the transport closed.
      for (auto& peer : connecting_) ClosePeer(peer, "the transport was closed");
    }
    // Behind the close jobs: each lane's thread cancels and closes, then tears down.
    for (auto& lane : lanes_) {
      lane->stop = true;
      lane->WakeLocked();
    }
  }
  // From a completion a lane's thread cannot join itself: every lane tears itself down and
  // delivers what is left, and the destructor (which calls Close again) joins and releases.
  if (OnLaneThread()) return;
  std::lock_guard<std::mutex> join(join_mu_);
  for (auto& lane : lanes_) {
    if (lane->thread.joinable()) lane->thread.join();
  }
  ReleaseAll();
}

}  // namespace kvrail::transport
