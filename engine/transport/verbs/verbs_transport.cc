#include "engine/transport/verbs/verbs_transport.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/base/error.h"
#include "engine/memory/arena.h"
#include "engine/memory/cuda_arena.h"
#include "engine/memory/cuda_dmabuf.h"
#include "engine/transport/bounds.h"
#include "engine/transport/region_table.h"
#include "engine/transport/shared_region.h"
#include "engine/transport/verbs/verbs_connector.h"
#include "engine/transport/verbs/verbs_lane.h"
#include "engine/transport/verbs/verbs_memory.h"
#include "engine/transport/verbs/verbs_peer.h"
#include "engine/transport/verbs/verbs_qp.h"
#include "engine/transport/verbs/verbs_rail.h"

namespace kvrail::transport {

using verbs_internal::DestroyQp;
using verbs_internal::LaneState;
using verbs_internal::Op;
using verbs_internal::PeerState;
using verbs_internal::QpState;
using verbs_internal::RegionState;
using verbs_internal::VerbsCallError;

VerbsTransport::VerbsTransport(const VerbsOptions& options)
    : api_(*options.api), options_(options) {}

absl::StatusOr<std::unique_ptr<VerbsTransport>> VerbsTransport::Create(
    const VerbsOptions& options) {
  if (options.api == nullptr) return absl::InvalidArgumentError("verbs: no VerbsApi given");
  if (options.lanes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("verbs: lanes must be >= 1, got ", options.lanes));
  }
  if (options.max_write_bytes == 0 || options.max_write_bytes > (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat("verbs: max_write_bytes must be in [1, 2^31] (an RDMA write's length), got ",
                     options.max_write_bytes));
  }
  if (options.max_send_sge == 0) {
    return absl::InvalidArgumentError(
        "verbs: max_send_sge must be >= 1 (a write carries at least one entry), got 0");
  }
  if (options.max_send_wr < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("verbs: max_send_wr must be >= 2, got ", options.max_send_wr));
  }
  std::unique_ptr<VerbsTransport> transport(new VerbsTransport(options));
  KVRAIL_RETURN_IF_ERROR(transport->Init());
  return transport;
}

absl::Status VerbsTransport::Init() {
  if (options_.devices.empty() && !options_.rail_affinity.empty()) {
    KVRAIL_ASSIGN_OR_RETURN(options_.devices,
                            RailsForAffinity(options_.sysfs_root, options_.rail_affinity));
  }
  KVRAIL_ASSIGN_OR_RETURN(rails_,
                          OpenRails(api_, options_.devices, options_.port, options_.gid_index));
  for (const auto& rail : rails_) {
    options_.max_send_wr = std::min<uint32_t>(options_.max_send_wr, rail->max_qp_wr());
    // A batch may move to another rail on failover: a write gathers what every rail takes.
    options_.max_send_sge = std::min<uint32_t>(options_.max_send_sge, rail->max_sge());
  }
  capabilities_.name = "verbs";
  capabilities_.lanes = options_.lanes;
  capabilities_.one_sided = true;
  // GPU memory: as a dmabuf where libibverbs and the GPU's driver offer it, else through
  // nvidia-peermem (ibv_reg_mr on the device pointer) where that module is loaded, else not.
  const absl::Status cuda = CudaAvailable();
  if (!cuda.ok()) {
    gpu_reason_ = std::string(cuda.message());
  } else if (absl::Status dmabuf = CudaDmabufSupported(0);
             dmabuf.ok() && api_.reg_dmabuf_mr != nullptr) {
    gpu_registration_ = GpuRegistration::kDmabuf;
  } else if (NvidiaPeermemLoaded() && std::string(api_.provider) == "libibverbs") {
    gpu_registration_ = GpuRegistration::kPeermem;
  } else {
    gpu_reason_ = absl::StrCat(api_.reg_dmabuf_mr == nullptr
                                   ? absl::StrCat(api_.provider, " offers no dmabuf registration")
                                   : std::string(dmabuf.message()),
                               ", and nvidia-peermem is not loaded");
  }
  capabilities_.gpu_memory = gpu_registration_ != GpuRegistration::kNone;
  capabilities_.max_write_bytes = options_.max_write_bytes;
  capabilities_.max_inflight_bytes_per_endpoint = options_.max_inflight_bytes_per_endpoint;
  capabilities_.disconnect_fences = true;
  capabilities_.refuses_writers = true;  // its responder QPs (RefuseWriter)
  capabilities_.max_gather_rows = options_.max_send_sge;

  for (const auto& rail : rails_) {
    ibv_cq* cq = api_.create_cq(rail->context(), verbs_internal::kCqDepth, nullptr, nullptr, 0);
    if (cq == nullptr) return VerbsCallError("ibv_create_cq", errno, rail->device());
    responder_cqs_.push_back(cq);
  }
  std::vector<uint32_t> gbps;
  for (const auto& rail : rails_) gbps.push_back(rail->gbps());
  const std::vector<int> home = AssignLanesToRails(options_.lanes, gbps);
  health_ =
      std::make_unique<RailHealth>(static_cast<int>(rails_.size()), options_.rail_probe_after);
  for (int i = 0; i < options_.lanes; ++i) {
    LaneState& lane = *lanes_.emplace_back(std::make_unique<LaneState>());
    KVRAIL_RETURN_IF_ERROR(verbs_internal::OpenLane(api_, rails_, i, home[i], lane));
  }
  std::string host = options_.connect_host;
  if (host.empty()) host = GidIpv4(rails_[0]->gid());
  if (host.empty()) host = "127.0.0.1";
  KVRAIL_ASSIGN_OR_RETURN(
      connect_server_,
      VerbsConnectServer::Start(
          host, [this](const v1::VerbsConnectRequest& r) { return OnConnectRequest(r); },
          [this](const v1::VerbsRelease& r) { OnRelease(r); }));
  connect_endpoint_ = connect_server_->endpoint();

  for (auto& lane : lanes_) {
    LaneState* l = lane.get();
    l->thread = std::thread([this, l] {
      verbs_internal::RunLane(
          api_, *l, [this](LaneState& lane, const ibv_wc& wc) { OnCompletion(lane, wc); });
    });
    l->thread_id = l->thread.get_id();
  }
  worker_ = std::thread([this] { RunWorker(); });
  return absl::OkStatus();
}

VerbsTransport::~VerbsTransport() {
  Close();
  for (auto& lane : lanes_) {
    {
      std::lock_guard<std::mutex> lock(lane->mu);
      lane->stop = true;
    }
    verbs_internal::Wake(*lane);
    if (lane->thread.joinable()) lane->thread.join();
  }
  for (auto& lane : lanes_) verbs_internal::CloseLane(api_, *lane);
  for (ibv_cq* cq : responder_cqs_) api_.destroy_cq(cq);
  rails_.clear();
}

std::vector<int> AssignLanesToRails(int lanes, const std::vector<uint32_t>& gbps) {
  std::vector<int> home;
  std::vector<int> count(gbps.size(), 0);
  for (int lane = 0; lane < lanes; ++lane) {
    size_t best = 0;
    for (size_t r = 1; r < gbps.size(); ++r) {
      // D'Hondt: the rail with the largest speed / (lanes it has + 1), compared exactly; a tie
      // goes to the rail with fewer lanes, so that consecutive lanes alternate rails.
      const uint64_t mine = uint64_t{std::max<uint32_t>(gbps[r], 1)} * (count[best] + 1);
      const uint64_t theirs = uint64_t{std::max<uint32_t>(gbps[best], 1)} * (count[r] + 1);
      if (mine > theirs || (mine == theirs && count[r] < count[best])) best = r;
    }
    ++count[best];
    home.push_back(static_cast<int>(best));
  }
  return home;
}

std::vector<int> VerbsTransport::lane_rails() const {
  std::vector<int> out;
  for (const auto& lane : lanes_) out.push_back(lane->rail_index);
  return out;
}

std::vector<int> VerbsTransport::rails_in_rotation() const {
  std::lock_guard<std::mutex> lock(health_mu_);
  return health_->Up(absl::Now());
}

uint64_t VerbsTransport::failovers() const {
  std::lock_guard<std::mutex> lock(health_mu_);
  return failovers_;
}

TransportCounters VerbsTransport::transport_counters() const {
  TransportCounters counters;
  counters.rail_failovers = failovers();
  return counters;
}

std::vector<std::string> VerbsTransport::rail_devices() const {
  std::vector<std::string> out;
  for (const auto& rail : rails_) out.push_back(rail->device());
  return out;
}

// ---------------------------------------------------------------------------------------------
// Regions.

absl::StatusOr<RegionId> VerbsTransport::Register(const LocalRegion& region) {
  if (region.cuda && !capabilities_.gpu_memory) {
    return absl::InvalidArgumentError(
        absl::StrCat("Register: this verbs transport cannot register GPU memory: ", gpu_reason_,
                     " (a transport without GPU access stages GPU arenas through host memory)"));
  }
  KVRAIL_RETURN_IF_ERROR(CheckLocalRegion(region, capabilities_.gpu_memory));
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("Register: the transport is closed");
  KVRAIL_RETURN_IF_ERROR(regions_.CheckDisjoint(region));
  auto entry = std::make_shared<RegionState>();
  entry->base = reinterpret_cast<uint64_t>(region.base);
  entry->cuda = region.cuda;
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  // A dmabuf of the GPU range, registered at the range's own address as its IOVA, so that peers
  // write to device addresses as they write to host ones. The NIC holds its own reference: the
  // fd is closed once every rail has registered it.
  CudaDmabuf dmabuf;
  if (region.cuda && gpu_registration_ == GpuRegistration::kDmabuf) {
    KVRAIL_ASSIGN_OR_RETURN(dmabuf, ExportCudaDmabuf(region.base, region.length));
  }
  for (const auto& rail : rails_) {
    ibv_mr* mr = dmabuf.fd >= 0 ? api_.reg_dmabuf_mr(rail->pd(), dmabuf.offset, region.length,
                                                     entry->base, dmabuf.fd, access)
                                : api_.reg_mr(rail->pd(), region.base, region.length, access);
    if (mr == nullptr) {
      const int error = errno;
      for (ibv_mr* done : entry->mrs) api_.dereg_mr(done);
      if (dmabuf.fd >= 0) close(dmabuf.fd);
      return absl::ResourceExhaustedError(
          absl::StrCat("ibv_reg_mr of ", region.length, " bytes at ", absl::Hex(entry->base),
                       " on ", rail->device(), ": ", std::strerror(error), " (errno ", error,
                       error == ENOMEM ? "; raise the locked-memory limit, ulimit -l" : "", ")"));
    }
    entry->mrs.push_back(mr);
  }
  if (dmabuf.fd >= 0) close(dmabuf.fd);
  const uint64_t base = entry->base;
  return regions_.Add(base, region.length, std::move(entry));
}

absl::StatusOr<SharedRegion> VerbsTransport::Allocate(uint64_t length) {
  KVRAIL_ASSIGN_OR_RETURN(MemfdAllocation allocation, AllocateOnMemfd(*this, length));
  std::unique_lock<std::shared_mutex> lock(mu_);
  auto* found = regions_.Find(allocation.shared.region);
  if (found == nullptr) {
    return absl::FailedPreconditionError("Allocate: the region went away while it was made");
  }
  found->entry->arena = std::move(allocation.arena);
  return allocation.shared;
}

absl::Status VerbsTransport::Deregister(RegionId region) {
  std::shared_ptr<RegionState> entry;
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (closed_) return absl::FailedPreconditionError("Deregister: the transport is closed");
    KVRAIL_ASSIGN_OR_RETURN(entry, regions_.Remove(region));
  }
  // Batches that name the region's lkeys end first (landed or failed), unless this runs on a
  // lane's thread, whose own completions could then never come.
  const bool on_lane = std::any_of(lanes_.begin(), lanes_.end(), [](const auto& lane) {
    return lane->thread_id == std::this_thread::get_id();
  });
  if (!on_lane) {
    std::unique_lock<std::mutex> lock(entry->mu);
    entry->idle.wait(lock, [&] { return entry->inflight == 0; });
  }
  // From here peers' writes with the region's rkeys complete with a remote access error.
  for (ibv_mr* mr : entry->mrs) api_.dereg_mr(mr);
  entry->mrs.clear();
  return absl::OkStatus();
}

absl::StatusOr<v1::HandshakeDescriptor> VerbsTransport::LocalDescriptor() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("LocalDescriptor: the transport is closed");
  v1::HandshakeDescriptor descriptor;
  descriptor.set_version(regions_.version());
  descriptor.set_transport(v1::TRANSPORT_KIND_VERBS);
  for (const auto& lane : lanes_) {
    const Rail& rail = *lane->rail;
    v1::VerbsLaneAddress address;
    address.set_connect_endpoint(connect_endpoint_);
    address.set_rail(lane->rail_index);
    address.set_device(rail.device());
    address.set_port(rail.port());
    address.set_lid(rail.lid());
    address.set_gid(std::string(reinterpret_cast<const char*>(rail.gid().raw), 16));
    address.set_gid_index(rail.gid_index());
    address.set_mtu_bytes(MtuBytes(rail.mtu()));
    address.set_gbps(rail.gbps());
    address.set_provider(api_.provider);
    descriptor.add_lanes()->set_address(address.SerializeAsString());
  }
  for (const auto& [id, entry] : regions_) {
    v1::Region* region = descriptor.add_regions();
    region->set_base(entry.base);
    region->set_length(entry.length);
    region->set_remote_key(verbs_internal::PackRkeys(entry.entry->mrs));
    region->set_memory_kind(entry.entry->cuda ? v1::MEMORY_KIND_CUDA : v1::MEMORY_KIND_HOST);
  }
  return descriptor;
}

// ---------------------------------------------------------------------------------------------
// Connecting (the exchange itself: verbs_connect.cc).

absl::StatusOr<PeerId> VerbsTransport::Connect(const v1::HandshakeDescriptor& peer) {
  KVRAIL_RETURN_IF_ERROR(CheckPeerKind(peer, v1::TRANSPORT_KIND_VERBS, "verbs"));
  KVRAIL_ASSIGN_OR_RETURN(RemoteRegions remote, RemoteRegions::FromDescriptor(peer));
  auto state = std::make_shared<PeerState>(std::move(remote));
  const std::string name = peer.session_id().empty() ? std::string("a verbs peer")
                                                     : absl::StrCat("session ", peer.session_id());
  uint32_t rails = 0;
  for (int i = 0; i < peer.lanes_size(); ++i) {
    v1::VerbsLaneAddress address;
    if (!address.ParseFromString(peer.lanes(i).address()) || address.gid().size() != 16 ||
        address.connect_endpoint().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": lane ", i,
                       " of the descriptor is not a verbs lane address (a "
                       "VerbsLaneAddress with a 16-byte GID and a connect endpoint)"));
    }
    if (address.provider() != api_.provider) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": lane ", i, " is served by verbs provider \"", address.provider(),
          "\", this transport by \"", api_.provider, "\"; they cannot reach each other"));
    }
    if (address.rail() >= 64) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": lane ", i, " names rail ", address.rail(), " (at most 64)"));
    }
    rails = std::max(rails, address.rail() + 1);
    state->lanes.push_back(std::move(address));
  }
  for (int r = 0; r < peer.regions_size(); ++r) {
    KVRAIL_ASSIGN_OR_RETURN(
        std::vector<uint32_t> rkeys,
        verbs_internal::UnpackRkeys(peer.regions(r).remote_key(), rails, name, r));
    state->rkeys.push_back(std::move(rkeys));
  }
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (closed_) return absl::FailedPreconditionError("Connect: the transport is closed");
    state->id = next_peer_++;
    state->connection_base =
        absl::StrFormat("%d.%d.%d.%d", getpid(), reinterpret_cast<uintptr_t>(this) & 0xffffff,
                        state->id, next_connection_++);
  }
  state->name = name;
  std::vector<int> all;
  for (int lane = 0; lane < options_.lanes; ++lane) {
    auto qp = std::make_shared<QpState>();
    qp->lane = lanes_[lane].get();
    qp->lane_index = lane;
    qp->peer = state.get();
    qp->peer_ref = state;
    qp->rail = lanes_[lane]->rail_index;
    qp->remote_lane = lane % static_cast<int>(state->lanes.size());
    state->qps.push_back(std::move(qp));
    all.push_back(lane);
  }
  absl::Status connected = ConnectLanes(*state, all, options_.connect_timeout);
  if (!connected.ok()) {
    // The lanes connected before the failure are released at the peer too.
    ClosePeer(*state, absl::CancelledError("Connect failed"));
    return connected;
  }
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (closed_) {
    lock.unlock();
    ClosePeer(*state, absl::CancelledError("the transport was closed"));
    return absl::FailedPreconditionError("Connect: the transport was closed while connecting");
  }
  peers_.emplace(state->id, state);
  return state->id;
}

// ---------------------------------------------------------------------------------------------
// Posting (the QP's queue: verbs_posting.cc).

absl::Status VerbsTransport::PostWrites(PeerId peer, int lane, RegionId source,
                                        absl::Span<const Write> writes, Completion done) {
  if (!done) return absl::InvalidArgumentError("PostWrites: no completion given");
  KVRAIL_RETURN_IF_ERROR(CheckLane(lane, capabilities_.lanes));
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("PostWrites: the transport is closed");
  auto p = peers_.find(peer);
  if (p == peers_.end()) {
    return absl::NotFoundError(absl::StrCat("PostWrites: peer ", peer, " is not connected"));
  }
  const auto* r = regions_.Find(source);
  if (r == nullptr) {
    return absl::NotFoundError(absl::StrCat("PostWrites: region ", source, " is not registered"));
  }
  auto op = std::make_unique<Op>();
  KVRAIL_RETURN_IF_ERROR(
      CheckWrites(writes, r->length, p->second->remote, capabilities_, &op->remote_region));
  op->done = std::move(done);
  op->source = r->entry;
  op->writes.assign(writes.begin(), writes.end());
  {
    std::lock_guard<std::mutex> region_lock(op->source->mu);
    ++op->source->inflight;
  }
  PeerState& state = *p->second;
  QpState& qp = *state.qps[lane];
  std::lock_guard<std::mutex> qp_lock(qp.mu);
  lock.unlock();
  qp.waiting.push_back(op.release());
  switch (qp.state) {
    case QpState::State::kReady:
      PumpLocked(qp);
      break;
    case QpState::State::kBroken:
      if (!qp.reconnecting) ScheduleReconnect(state.qps[lane]->peer_ref.lock(), lane);
      break;
    case QpState::State::kClosed:
      FinishLocked(qp, qp.waiting.back(), absl::CancelledError("PostWrites: peer disconnected"));
      qp.waiting.pop_back();
      break;
    case QpState::State::kConnecting:
      break;
  }
  return absl::OkStatus();
}

absl::Status VerbsTransport::Flush(PeerId peer, int lane, Completion done) {
  if (!done) return absl::InvalidArgumentError("Flush: no completion given");
  KVRAIL_RETURN_IF_ERROR(CheckLane(lane, capabilities_.lanes));
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("Flush: the transport is closed");
  auto p = peers_.find(peer);
  if (p == peers_.end()) {
    return absl::NotFoundError(absl::StrCat("Flush: peer ", peer, " is not connected"));
  }
  QpState& qp = *p->second->qps[lane];
  auto op = std::make_unique<Op>();
  op->flush = true;
  op->done = std::move(done);
  std::lock_guard<std::mutex> qp_lock(qp.mu);
  lock.unlock();
  if (qp.state == QpState::State::kClosed) {
    FinishLocked(qp, op.release(), absl::CancelledError("Flush: peer disconnected"));
    return absl::OkStatus();
  }
  qp.waiting.push_back(op.release());
  if (qp.state == QpState::State::kReady) PumpLocked(qp);
  // A broken QP: the flush waits behind the batches queued for the reconnected QP, or fails with
  // them.
  if (qp.state == QpState::State::kBroken && qp.waiting.size() == 1) {
    // Nothing waits for a reconnect: the flush reports the failure since the previous flush.
    Op* flush = qp.waiting.front();
    qp.waiting.pop_front();
    FinishFlushLocked(qp, flush);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Disconnect and Close.

absl::Status VerbsTransport::Disconnect(PeerId peer) {
  std::shared_ptr<PeerState> state;
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (closed_) return absl::FailedPreconditionError("Disconnect: the transport is closed");
    auto it = peers_.find(peer);
    if (it == peers_.end()) {
      return absl::NotFoundError(absl::StrCat("Disconnect: peer ", peer, " is not connected"));
    }
    state = std::move(it->second);
    peers_.erase(it);
  }
  ClosePeer(*state, absl::CancelledError(
                        absl::StrCat("peer ", peer, " (", state->name, ") was disconnected")));
  return absl::OkStatus();
}

void VerbsTransport::Close() {
  std::lock_guard<std::mutex> close_lock(close_mu_);
  std::map<PeerId, std::shared_ptr<PeerState>> peers;
  std::vector<std::shared_ptr<RegionState>> regions;
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (closed_) return;
    peers.swap(peers_);
    regions = regions_.TakeAll();
    closed_ = true;
  }
  for (auto& [id, state] : peers) {
    ClosePeer(*state, absl::CancelledError("the transport was closed"));
  }
  // The worker: reconnects in progress end (they find their peer closed), releases are sent.
  {
    std::lock_guard<std::mutex> lock(worker_mu_);
    worker_stop_ = true;
  }
  worker_cv_.notify_one();
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
  // No connect is answered from here, and the peers' responder QPs go.
  connect_server_.reset();
  {
    std::lock_guard<std::mutex> lock(responders_mu_);
    for (auto& [id, responder] : responders_) {
      for (ibv_qp* qp : responder->qps) DestroyQp(api_, qp);
    }
    responders_.clear();
  }
  // Registrations withdrawn: peers' writes into them fail with a remote access error.
  for (auto& entry : regions) {
    for (ibv_mr* mr : entry->mrs) api_.dereg_mr(mr);
    entry->mrs.clear();
  }
  // Deliver every completion before returning, unless this is a lane's own thread.
  for (auto& lane : lanes_) {
    if (lane->thread_id == std::this_thread::get_id()) continue;
    {
      std::lock_guard<std::mutex> lock(lane->mu);
      lane->stop = true;
    }
    verbs_internal::Wake(*lane);
    if (lane->thread.joinable()) lane->thread.join();
  }
}

}  // namespace kvrail::transport
