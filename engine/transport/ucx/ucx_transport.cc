#include "engine/transport/ucx/ucx_transport.h"

#include <fcntl.h>
#include <pthread.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "control/error/error.h"
#include "engine/transport/bounds.h"
#include "engine/transport/shared_region.h"

namespace kvrail::transport {
namespace ucx_internal {

struct RegionState {
  uint64_t base = 0;
  uint64_t length = 0;
  ucp_mem_h memh = nullptr;
  std::string rkey;    // ucp_rkey_pack bytes
  int shared_fd = -1;  // Allocate's "ucx-shm" placement: our dup of UCX's segment fd
  // Unmaps (and for an allocated region frees) the memory. Runs under the transport's mutex.
  void Release(ucp_context_h context) {
    ucp_mem_unmap(context, memh);
    memh = nullptr;
    if (shared_fd >= 0) close(shared_fd);
    shared_fd = -1;
  }
};

struct PeerState;
struct Lane;

// One batch or flush. Freed once it is delivered and no UCX request still points at it.
// Guarded by its lane's mutex.
struct Op {
  PeerState* peer = nullptr;  // kept alive by the transport until its endpoints are closed
  int lane = 0;
  bool flush = false;
  int requests = 0;  // UCX requests outstanding with this op as user data
  bool delivered = false;
  absl::Status status;  // the first failure of a batch's puts
  Completion done;
  Lane* home = nullptr;  // the lane whose ready list gets the completion
};

// What an endpoint's error handler needs: the peer and which of its lanes.
struct LaneRef {
  PeerState* peer = nullptr;
  int lane = 0;
};

// A connected peer. `regions` and `id` are written with the transport's mu_ and every lane's mutex
// held; everything indexed by lane is guarded by that lane's mutex.
struct PeerState {
  PeerId id = 0;
  RemoteRegions regions;
  std::vector<ucp_ep_h> eps;                   // per local lane
  std::vector<std::vector<ucp_rkey_h>> rkeys;  // [lane][descriptor region index]
  std::vector<absl::Status> lane_errors;       // first failure since the lane's last Flush
  std::vector<ucs_status_t> lane_failed;       // set by UCX's error handler
  std::vector<std::deque<Op*>> ops;            // [lane]: undelivered, oldest first
  std::vector<LaneRef> refs;                   // [lane]: the error handlers' argument
  PeerState(RemoteRegions r, int lanes) : regions(std::move(r)) {
    eps.assign(lanes, nullptr);
    lane_errors.assign(lanes, absl::OkStatus());
    lane_failed.assign(lanes, UCS_OK);
    ops.resize(lanes);
    for (int lane = 0; lane < lanes; ++lane) refs.push_back({this, lane});
  }
  // With the lane's mutex held, once the lane's endpoint is closed (UCX wants an endpoint's
  // rkeys gone before its worker, and puts still draining at close may use them).
  void DestroyRkeys(int lane) {
    for (ucp_rkey_h& rkey : rkeys[lane]) {
      if (rkey != nullptr) ucp_rkey_destroy(rkey);
      rkey = nullptr;
    }
  }
};

struct Ready {
  Completion done;
  absl::Status status;
};

// One lane: a worker and the thread that progresses it.
struct Lane {
  int index = 0;
  ucp_worker_h worker = nullptr;  // destroyed by ReleaseAll
  std::string address;            // ucp_worker_get_address bytes
  std::thread thread;

  std::mutex mu;
  std::condition_variable changed;
  // Guarded by mu:
  bool kick = false;         // new work: the thread should spin, not sleep
  bool stop = false;         // Close: tear down and exit
  std::vector<Ready> ready;  // swapped with the thread's own, so delivery never allocates
  // Endpoint-close requests, each with the peer whose rkeys on this lane go when it finishes.
  std::vector<std::pair<void*, std::shared_ptr<PeerState>>> closing;
  // Finished ops kept for reuse (RecycleLocked), at most kSpareOps.
  static constexpr size_t kSpareOps = 256;
  std::vector<std::unique_ptr<Op>> spare;
  // PostWrites' region index of each write (CheckWrites), kept for its capacity.
  std::vector<int> region_of;

  // mu held. Moves `op`'s completion onto the ready list once; frees it when UCX is done too.
  void FinishLocked(Op* op, absl::Status status) {
    if (!op->delivered) {
      op->delivered = true;
      PeerState* peer = op->peer;
      auto& ops = peer->ops[op->lane];
      if (ops.front() == op) {
        ops.pop_front();  // the usual case: a lane's operations finish in order
      } else {
        ops.erase(std::find(ops.begin(), ops.end(), op));
      }
      if (!op->flush && !status.ok() && peer->lane_errors[op->lane].ok()) {
        peer->lane_errors[op->lane] = status;
      }
      ready.push_back({std::move(op->done), std::move(status)});
    }
    if (op->requests == 0) RecycleLocked(op);
  }

  // mu held. Keeps a finished op for the lane's next post (a post over shared memory is a copy
  // of a few microseconds, and a malloc and a free per post showed in perf).
  void RecycleLocked(Op* op) {
    if (spare.size() >= kSpareOps) {
      delete op;
      return;
    }
    *op = Op();
    spare.emplace_back(op);
  }

  // mu held. Frees the close requests that finished, and their peers' rkeys on this lane.
  void ReapClosedLocked() {
    closing.erase(std::remove_if(closing.begin(), closing.end(),
                                 [this](std::pair<void*, std::shared_ptr<PeerState>>& entry) {
                                   if (ucp_request_check_status(entry.first) == UCS_INPROGRESS) {
                                     return false;
                                   }
                                   ucp_request_free(entry.first);
                                   entry.second->DestroyRkeys(index);
                                   return true;
                                 }),
                  closing.end());
  }

  void Kick() {
    kick = true;
    changed.notify_one();
  }

  // mu held. A batch or flush of `peer` on this lane, queued as undelivered; the thread is
  // woken to deliver it.
  Op* NewOpLocked(PeerState& peer, int lane, bool flush, Completion done) {
    Op* op;
    if (spare.empty()) {
      op = new Op;
    } else {
      op = spare.back().release();
      spare.pop_back();
    }
    op->peer = &peer;
    op->lane = lane;
    op->flush = flush;
    op->done = std::move(done);
    op->home = this;
    peer.ops[lane].push_back(op);
    Kick();
    return op;
  }
};

namespace {

std::string Ucs(ucs_status_t status) { return ucs_status_string(status); }

absl::Status FromUcs(ucs_status_t status, const std::string& context) {
  if (status == UCS_OK) return absl::OkStatus();
  const std::string message = absl::StrFormat("%s: UCX: %s", context, Ucs(status));
  if (status == UCS_ERR_CANCELED) return absl::CancelledError(message);
  return absl::UnavailableError(message);
}

}  // namespace
// Every lane's mutex, taken in lane order and released in reverse: with the transport's mu_,
// what a writer of the transport-wide state holds, so that a post needs only its own lane's.
class AllLanes {
 public:
  explicit AllLanes(const std::vector<std::unique_ptr<Lane>>& lanes) : lanes_(lanes) {
    for (const auto& lane : lanes_) lane->mu.lock();
  }
  ~AllLanes() {
    for (auto it = lanes_.rbegin(); it != lanes_.rend(); ++it) (*it)->mu.unlock();
  }
  AllLanes(const AllLanes&) = delete;
  AllLanes& operator=(const AllLanes&) = delete;

 private:
  const std::vector<std::unique_ptr<Lane>>& lanes_;
};

}  // namespace ucx_internal

using ucx_internal::AllLanes;
using ucx_internal::FromUcs;
using ucx_internal::Lane;
using ucx_internal::LaneRef;
using ucx_internal::Op;
using ucx_internal::PeerState;
using ucx_internal::Ready;
using ucx_internal::RegionState;
using ucx_internal::Ucs;

namespace {

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

// ucp_worker_progress, where UCX's emulated puts copy peers' bytes into our registered memory.
// Under ThreadSanitizer those copies are ignored: the reader (the application, after a Flush
// completed on the initiator) is ordered after them only through UCX's uninstrumented shared
// memory or socket acknowledgements, which TSan cannot see, so every landed byte would be a
// false race. Our own state touched in UCX callbacks is guarded by the lane's mutex, held around
// this call.
unsigned ProgressWorker(void* worker) {
#if defined(__SANITIZE_THREAD__)
  __tsan_ignore_thread_begin();
#endif
  const unsigned events = ucp_worker_progress(static_cast<ucp_worker_h>(worker));
#if defined(__SANITIZE_THREAD__)
  __tsan_ignore_thread_end();
#endif
  return events;
}

// Error handler for every endpoint: arg is its LaneRef. Runs in UCX calls on that lane's
// worker, under the lane's mutex.
void OnEndpointError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* ref = static_cast<LaneRef*>(arg);
  if (ref->peer->lane_failed[ref->lane] == UCS_OK) ref->peer->lane_failed[ref->lane] = status;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> UcxTuningEnvironment(const UcxOptions& options) {
  std::vector<std::pair<std::string, std::string>> env;
  if (options.tcp_tx_seg_bytes != 0) {
    env.emplace_back("UCX_TCP_TX_SEG_SIZE", std::to_string(options.tcp_tx_seg_bytes));
  }
  if (options.tcp_rx_seg_bytes != 0) {
    env.emplace_back("UCX_TCP_RX_SEG_SIZE", std::to_string(options.tcp_rx_seg_bytes));
  }
  return env;
}

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(const UcxOptions& options) {
  if (options.lanes < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ucx options: lanes is %d; at least 1 is needed", options.lanes));
  }
  if (options.max_write_bytes == 0) {
    return absl::InvalidArgumentError("ucx options: max_write_bytes is 0; it must be > 0");
  }
  constexpr uint64_t kMinSeg = uint64_t{1} << 10, kMaxSeg = uint64_t{16} << 20;
  if (options.tcp_tx_seg_bytes != 0 &&
      (options.tcp_tx_seg_bytes < kMinSeg || options.tcp_tx_seg_bytes > kMaxSeg)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ucx options: tcp_tx_seg_bytes is %u; it must be 0 (UCX's default) or in [%u, %u]",
        options.tcp_tx_seg_bytes, kMinSeg, kMaxSeg));
  }
  if (options.tcp_rx_seg_bytes != 0 && options.tcp_rx_seg_bytes < options.tcp_tx_seg_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ucx options: tcp_rx_seg_bytes is %u, smaller than tcp_tx_seg_bytes %u; a peer's rx "
        "segment must hold this side's tx segment",
        options.tcp_rx_seg_bytes, options.tcp_tx_seg_bytes));
  }
  std::unique_ptr<UcxTransport> transport(new UcxTransport(options));
  absl::Status status = transport->Init(options);
  if (!status.ok()) {
    transport->Close();
    return status;
  }
  for (auto& lane : transport->lanes_) {
    lane->thread = std::thread([t = transport.get(), l = lane.get()] { t->RunLane(*l); });
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
          .max_inflight_bytes_per_endpoint = options.max_inflight_bytes_per_endpoint,
      } {}

absl::Status UcxTransport::Init(const UcxOptions& options) {
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return FromUcs(s, "ucx: ucp_config_read");
  if (!options.tls.empty() &&
      (s = ucp_config_modify(config, "TLS", options.tls.c_str())) != UCS_OK) {
    ucp_config_release(config);
    return absl::InvalidArgumentError(
        absl::StrFormat("ucx options: tls \"%s\" was rejected by UCX: %s", options.tls, Ucs(s)));
  }
  if (!options.net_devices.empty() &&
      (s = ucp_config_modify(config, "NET_DEVICES", options.net_devices.c_str())) != UCS_OK) {
    ucp_config_release(config);
    return absl::InvalidArgumentError(absl::StrFormat(
        "ucx options: net_devices \"%s\" was rejected by UCX: %s", options.net_devices, Ucs(s)));
  }
  // Allocate wants UCX's posix segments, which another process maps through an fd, before its
  // SysV ones, which no fd names (UCX's default order is sysv first).
  if (std::getenv("UCX_ALLOC_PRIO") == nullptr &&
      (s = ucp_config_modify(config, "ALLOC_PRIO", "md:posix,md:sysv,huge,thp,md:*,mmap,heap")) !=
          UCS_OK) {
    ucp_config_release(config);
    return FromUcs(s, "ucx: setting ALLOC_PRIO");
  }
  // UCX takes a transport's settings by their name inside the transport ("TX_SEG_SIZE" for
  // UCX_TCP_TX_SEG_SIZE), and only when that transport is loaded: it warns about the rest.
  const bool tcp = options.tls.empty() || options.tls.find("tcp") != std::string::npos;
  for (const auto& [name, value] : UcxTuningEnvironment(options)) {
    if (!tcp || std::getenv(name.c_str()) != nullptr) continue;  // the operator's setting wins
    const std::string key = name.substr(std::string("UCX_TCP_").size());
    if ((s = ucp_config_modify(config, key.c_str(), value.c_str())) != UCS_OK) {
      ucp_config_release(config);
      return FromUcs(s, absl::StrFormat("ucx: setting %s=%s", name, value));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA;
  params.mt_workers_shared = 1;  // workers of different lanes run at once
  ucp_context_h context = nullptr;
  s = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (s != UCS_OK) {
    return FromUcs(s, absl::StrFormat("ucx: ucp_init with tls \"%s\"", options.tls));
  }
  context_ = context;
  // UCX 1.13 has no peer-failure handler on shared memory; tcp has one.
  peer_errors_ = options.tls.empty() || options.tls.find("tcp") != std::string::npos;
  for (int index = 0; index < options.lanes; ++index) {
    auto lane = std::make_unique<Lane>();
    lane->index = index;
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // only under the lane's mutex
    s = ucp_worker_create(context, &wp, &lane->worker);
    if (s != UCS_OK) {
      return FromUcs(s, absl::StrFormat("ucx: ucp_worker_create for lane %d", index));
    }
    Lane& added = *lanes_.emplace_back(std::move(lane));
    ucp_address_t* address = nullptr;
    size_t length = 0;
    s = ucp_worker_get_address(added.worker, &address, &length);
    if (s != UCS_OK) {
      return FromUcs(s, absl::StrFormat("ucx: ucp_worker_get_address for lane %d", index));
    }
    added.address.assign(reinterpret_cast<const char*>(address), length);
    ucp_worker_release_address(added.worker, address);
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
  for (const auto& [id, entry] : regions_) {
    KVRAIL_RETURN_IF_ERROR(CheckDisjoint(region, id, entry->base, entry->length));
  }
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = region.base;
  mp.length = region.length;
  auto state = std::make_unique<RegionState>();
  state->base = base;
  state->length = region.length;
  ucs_status_t s = ucp_mem_map(static_cast<ucp_context_h>(context_), &mp, &state->memh);
  if (s != UCS_OK) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "local region [0x%x, +%u): ucp_mem_map failed: %s", base, region.length, Ucs(s)));
  }
  void* packed = nullptr;
  size_t packed_size = 0;
  s = ucp_rkey_pack(static_cast<ucp_context_h>(context_), state->memh, &packed, &packed_size);
  if (s != UCS_OK) {
    ucp_mem_unmap(static_cast<ucp_context_h>(context_), state->memh);
    return absl::InvalidArgumentError(absl::StrFormat(
        "local region [0x%x, +%u): ucp_rkey_pack failed: %s", base, region.length, Ucs(s)));
  }
  state->rkey.assign(static_cast<const char*>(packed), packed_size);
  ucp_rkey_buffer_release(packed);
  const RegionId id = next_region_++;
  AllLanes writing(lanes_);
  regions_.emplace(id, std::move(state));
  ++version_;
  return id;
}

absl::StatusOr<SharedRegion> UcxTransport::Allocate(uint64_t length) {
  if (length == 0) {
    return absl::InvalidArgumentError("Allocate: length is 0; at least 1 byte is needed");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return absl::FailedPreconditionError("Allocate: the transport is closed");
    auto context = static_cast<ucp_context_h>(context_);
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = nullptr;
    mp.length = length;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    auto state = std::make_unique<RegionState>();
    if (ucp_mem_map(context, &mp, &state->memh) == UCS_OK) {
      ucp_mem_attr_t attr{};
      attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
      absl::StatusOr<BackingFd> backing = absl::UnknownError("ucp_mem_query failed");
      if (ucp_mem_query(state->memh, &attr) == UCS_OK && attr.length >= length) {
        backing = FindBackingFd(attr.address);
      }
      void* packed = nullptr;
      size_t packed_size = 0;
      // Only a UCX segment that another process can open is the "ucx-shm" placement; memory
      // UCX took from mmap or the heap (no shared-memory transport loaded) is given back.
      if (backing.ok() && backing->contiguous >= length &&
          (state->shared_fd = fcntl(backing->fd, F_DUPFD_CLOEXEC, 0)) >= 0 &&
          ucp_rkey_pack(context, state->memh, &packed, &packed_size) == UCS_OK) {
        state->rkey.assign(static_cast<const char*>(packed), packed_size);
        ucp_rkey_buffer_release(packed);
        state->base = reinterpret_cast<uintptr_t>(attr.address);
        state->length = length;
        SharedRegion shared{.region = next_region_++,
                            .base = attr.address,
                            .length = length,
                            .fd = state->shared_fd,
                            .fd_offset = backing->offset,
                            .placement = "ucx-shm"};
        AllLanes writing(lanes_);
        regions_.emplace(shared.region, std::move(state));
        ++version_;
        return shared;
      }
      state->Release(context);
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
  auto it = regions_.find(region);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrFormat("Deregister: region %d is not registered", region));
  }
  {
    AllLanes writing(lanes_);  // no post reads the region while it goes
    it->second->Release(static_cast<ucp_context_h>(context_));
    regions_.erase(it);
    ++version_;
  }
  if (auto owned = allocated_.find(region); owned != allocated_.end()) allocated_.erase(owned);
  return absl::OkStatus();
}

absl::StatusOr<v1::HandshakeDescriptor> UcxTransport::LocalDescriptor() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("LocalDescriptor: the transport is closed");
  v1::HandshakeDescriptor descriptor;
  descriptor.set_version(version_);
  descriptor.set_transport(v1::TRANSPORT_KIND_UCX);
  for (const auto& lane : lanes_) descriptor.add_lanes()->set_address(lane->address);
  for (const auto& [id, entry] : regions_) {
    v1::Region* region = descriptor.add_regions();
    region->set_base(entry->base);
    region->set_length(entry->length);
    region->set_remote_key(entry->rkey);
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
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("Connect: the transport is closed");
  const int lanes = capabilities_.lanes;
  auto state = std::make_shared<PeerState>(std::move(regions), lanes);
  state->rkeys.assign(lanes, std::vector<ucp_rkey_h>(peer.regions_size(), nullptr));
  absl::Status failure;
  for (int index = 0; index < lanes && failure.ok(); ++index) {
    Lane& lane = *lanes_[index];
    std::lock_guard<std::mutex> lane_lock(lane.mu);
    const int remote_lane = index % peer.lanes_size();
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(peer.lanes(remote_lane).address().data());
    ep.err_handler.cb = OnEndpointError;
    ep.err_handler.arg = &state->refs[index];
    // Peer-failure handling where the transports support it (tcp); shared memory has no peer
    // failure handler in UCX 1.13, so it falls back, once per transport, to no error handling.
    ep.err_mode = peer_errors_ ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ucs_status_t s = ucp_ep_create(lane.worker, &ep, &state->eps[index]);
    if (s == UCS_ERR_UNREACHABLE && peer_errors_) {
      peer_errors_ = false;
      ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      s = ucp_ep_create(lane.worker, &ep, &state->eps[index]);
    }
    if (s != UCS_OK) {
      state->eps[index] = nullptr;
      failure = absl::UnavailableError(
          absl::StrFormat("peer descriptor: lane %d: ucp_ep_create to peer lane %d failed: %s",
                          index, remote_lane, Ucs(s)));
      break;
    }
    for (int r = 0; r < peer.regions_size(); ++r) {
      s = ucp_ep_rkey_unpack(state->eps[index], peer.regions(r).remote_key().data(),
                             &state->rkeys[index][r]);
      if (s != UCS_OK) {
        state->rkeys[index][r] = nullptr;
        failure = absl::InvalidArgumentError(absl::StrFormat(
            "peer descriptor: region %d: remote key is not a UCX rkey this transport can use "
            "(ucp_ep_rkey_unpack: %s)",
            r, Ucs(s)));
        break;
      }
    }
    if (!failure.ok()) break;
    // Finish UCX's wireup now, with a bounded wait, so that an unreachable peer is reported
    // here and no wireup message is left pending when either side's worker is destroyed (UCX
    // 1.13 asserts on a pending wireup reply at ucp_worker_destroy).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    ucp_request_param_t param{};
    ucs_status_ptr_t request = ucp_ep_flush_nbx(state->eps[index], &param);
    s = UCS_OK;
    if (UCS_PTR_IS_ERR(request)) {
      s = UCS_PTR_STATUS(request);
    } else if (request != nullptr) {
      while ((s = ucp_request_check_status(request)) == UCS_INPROGRESS &&
             std::chrono::steady_clock::now() < deadline) {
        ProgressWorker(lane.worker);
      }
      ucp_request_free(request);  // released by UCX when it completes, if it has not
      if (s == UCS_INPROGRESS) s = UCS_ERR_TIMED_OUT;
    }
    if (s != UCS_OK) {
      failure = absl::UnavailableError(absl::StrFormat(
          "peer descriptor: lane %d: the peer's worker could not be reached (wireup flush: %s)",
          index, Ucs(s)));
    }
  }
  AllLanes writing(lanes_);
  if (!failure.ok()) {
    ClosePeer(state, "connect failed");
    return failure;
  }
  const PeerId id = next_peer_++;
  state->id = id;
  peers_.emplace(id, std::move(state));
  return id;
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

void UcxTransport::OnPutDone(void* request, int status_int, void* user_data) {
  const auto status = static_cast<ucs_status_t>(status_int);
  auto* op = static_cast<Op*>(user_data);
  ucp_request_free(request);
  --op->requests;
  if (op->delivered) {
    if (op->requests == 0) op->home->RecycleLocked(op);
    return;
  }
  if (op->flush) {
    absl::Status result = std::exchange(op->peer->lane_errors[op->lane], absl::OkStatus());
    if (result.ok() && status != UCS_OK) {
      result = FromUcs(status, absl::StrFormat("flush to peer %d lane %d", op->peer->id, op->lane));
    }
    op->home->FinishLocked(op, std::move(result));
    return;
  }
  if (status != UCS_OK && op->status.ok()) {
    op->status =
        FromUcs(status, absl::StrFormat("batch to peer %d lane %d: put", op->peer->id, op->lane));
    if (op->status.code() == absl::StatusCode::kCancelled) {
      // Cancelled by UCX because the endpoint failed, not by Disconnect or Close.
      op->status = absl::UnavailableError(op->status.message());
    }
  }
  if (op->requests == 0) op->home->FinishLocked(op, op->status);
}

absl::StatusOr<UcxTransport::Started> UcxTransport::Start(
    PeerId peer, int lane, const Completion& done, absl::FunctionRef<std::string()> context) {
  if (!done) return absl::InvalidArgumentError(context() + ": the completion is empty");
  if (absl::Status checked = CheckLane(lane, capabilities_.lanes); !checked.ok()) {
    return AddContext(checked, context());
  }
  // Only this lane's mutex: writers of the peers and regions hold every lane's (AllLanes), so
  // lanes post at once and nothing they share is written on the way.
  Lane& home = *lanes_[lane];
  std::unique_lock<std::mutex> lock(home.mu);
  auto found = FindPeerLocked(peer, lane);
  if (!found.ok()) return AddContext(found.status(), context());
  return Started{std::move(lock), &home, *found};
}

absl::Status UcxTransport::PostWrites(PeerId peer, int lane, RegionId source,
                                      absl::Span<const Write> writes, Completion done) {
  // Formatted only on the way to an error: posting is the hot path.
  const auto context = [&] {
    return absl::StrFormat("PostWrites to peer %d lane %d from region %d", peer, lane, source);
  };
  KVRAIL_ASSIGN_OR_RETURN(Started started, Start(peer, lane, done, context));
  Lane& home = *started.home;
  PeerState& state = *started.state;
  auto region = regions_.find(source);
  if (region == regions_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("%s: source region %d is not registered", context(), source));
  }
  if (absl::Status checked = CheckWrites(writes, region->second->length, state.regions,
                                         capabilities_.max_write_bytes, &home.region_of);
      !checked.ok()) {
    return AddContext(checked, context());
  }
  Op* op = home.NewOpLocked(state, lane, /*flush=*/false, std::move(done));
  if (state.lane_failed[lane] != UCS_OK) {
    home.FinishLocked(op, FromUcs(state.lane_failed[lane],
                                  absl::StrFormat("%s: the peer's endpoint failed", context())));
    return absl::OkStatus();
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = [](void* request, ucs_status_t status, void* user_data) {
    OnPutDone(request, static_cast<int>(status), user_data);
  };
  param.user_data = op;
  const std::byte* base = reinterpret_cast<const std::byte*>(region->second->base);
  for (size_t i = 0; i < writes.size(); ++i) {
    const Write& w = writes[i];
    ucs_status_ptr_t request =
        ucp_put_nbx(state.eps[lane], base + w.local_offset, w.length, w.remote_address,
                    state.rkeys[lane][home.region_of[i]], &param);
    if (request == nullptr) continue;
    if (UCS_PTR_IS_ERR(request)) {
      op->status =
          FromUcs(UCS_PTR_STATUS(request),
                  absl::StrFormat("%s: write %d of %d: ucp_put_nbx", context(), i, writes.size()));
      if (op->status.code() == absl::StatusCode::kCancelled) {
        op->status = absl::UnavailableError(op->status.message());
      }
      break;
    }
    ++op->requests;
  }
  if (op->requests == 0) home.FinishLocked(op, op->status);
  return absl::OkStatus();
}

absl::Status UcxTransport::Flush(PeerId peer, int lane, Completion done) {
  const auto context = [&] { return absl::StrFormat("Flush of peer %d lane %d", peer, lane); };
  KVRAIL_ASSIGN_OR_RETURN(Started started, Start(peer, lane, done, context));
  Lane& home = *started.home;
  PeerState& state = *started.state;
  Op* op = home.NewOpLocked(state, lane, /*flush=*/true, std::move(done));
  if (state.lane_failed[lane] != UCS_OK) {
    absl::Status result = std::exchange(state.lane_errors[lane], absl::OkStatus());
    if (result.ok()) {
      result = FromUcs(state.lane_failed[lane],
                       absl::StrFormat("%s: the peer's endpoint failed", context()));
    }
    home.FinishLocked(op, std::move(result));
    return absl::OkStatus();
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = [](void* request, ucs_status_t status, void* user_data) {
    OnPutDone(request, static_cast<int>(status), user_data);
  };
  param.user_data = op;
  ucs_status_ptr_t request = ucp_ep_flush_nbx(state.eps[lane], &param);
  if (request == nullptr) {
    home.FinishLocked(op, std::exchange(state.lane_errors[lane], absl::OkStatus()));
  } else if (UCS_PTR_IS_ERR(request)) {
    absl::Status result = std::exchange(state.lane_errors[lane], absl::OkStatus());
    if (result.ok()) {
      result = absl::UnavailableError(
          absl::StrFormat("%s: ucp_ep_flush_nbx: %s", context(), Ucs(UCS_PTR_STATUS(request))));
    }
    home.FinishLocked(op, std::move(result));
  } else {
    op->requests = 1;
  }
  return absl::OkStatus();
}

void UcxTransport::ClosePeer(const std::shared_ptr<PeerState>& peer, const char* why) {
  for (auto& lane_ptr : lanes_) {
    Lane& lane = *lane_ptr;
    const int index = lane.index;
    auto& ops = peer->ops[index];
    while (!ops.empty()) {
      Op* op = ops.front();
      lane.FinishLocked(op, absl::CancelledError(absl::StrFormat(
                                "%s to peer %d lane %d: %s before it completed",
                                op->flush ? "flush" : "batch", peer->id, index, why)));
    }
    // A flushing close, not UCP_EP_CLOSE_FLAG_FORCE: UCX 1.13 aborts the TARGET process
    // ("ucp_request.inl: Fatal: unexpected error: Endpoint timeout" in ucp_put_handler) when the
    // initiator force-closes while emulated puts are still arriving, because the target's put
    // acknowledgement then fails. The user's completions were cancelled above; UCX finishes the
    // puts already posted, and a dead peer fails the flush (tcp) or the wait in the lane's
    // teardown ends it. The lane's rkeys go once its endpoint is closed.
    if (peer->eps[index] != nullptr) {
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = 0;
      ucs_status_ptr_t request = ucp_ep_close_nbx(peer->eps[index], &param);
      peer->eps[index] = nullptr;
      if (request != nullptr && !UCS_PTR_IS_ERR(request)) {
        lane.closing.emplace_back(request, peer);
      } else {
        peer->DestroyRkeys(index);
      }
    } else {
      peer->DestroyRkeys(index);
    }
    lane.Kick();
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

void UcxTransport::RunLane(Lane& lane) {
  // Named for top -H, perf and gdb: "ucx-lane0", "ucx-lane1", ...
  pthread_setname_np(pthread_self(), absl::StrFormat("ucx-lane%d", lane.index).c_str());
  int idle = 0;
  constexpr int kDeliveriesPerProgress = 8;
  int unpolled = 0;               // delivery rounds since the last progress
  std::vector<Ready> delivering;  // keeps its capacity from round to round
  std::unique_lock<std::mutex> lock(lane.mu);
  while (true) {
    if (lane.stop) {
      // Endpoints closed by Close finish after a little progress; then let messages in flight
      // (wireup, acknowledgements of peers' puts) drain before the worker goes.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!lane.closing.empty() && std::chrono::steady_clock::now() < deadline) {
        ProgressWorker(lane.worker);
        lane.ReapClosedLocked();
      }
      for (auto& [request, peer] : lane.closing) peer->DestroyRkeys(lane.index);
      lane.closing.clear();
      for (int quiet = 0, rounds = 0; quiet < 16 && rounds < 100000; ++rounds) {
        quiet = ProgressWorker(lane.worker) == 0 ? quiet + 1 : 0;
      }
      std::vector<Ready> ready;
      ready.swap(lane.ready);
      lock.unlock();
      for (Ready& r : ready) r.done(std::move(r.status));
      return;
    }
    // Completions delivered last round may have posted puts that finished at once (over shared
    // memory a put is a copy, done before ucp_put_nbx returns): deliver those before polling
    // UCX again, polling at least every kDeliveriesPerProgress rounds so that flushes, wireup
    // and peers' messages still move. Polling once per post, perf put about 8 % of a lane's
    // time in ucp_worker_progress at 64 KiB writes over shm.
    unsigned events = 0;
    if (lane.ready.empty() || ++unpolled >= kDeliveriesPerProgress) {
      unpolled = 0;
      events = ProgressWorker(lane.worker);
    }
    if (!lane.closing.empty()) lane.ReapClosedLocked();
    if (!lane.ready.empty()) {
      delivering.swap(lane.ready);
      lock.unlock();
      for (Ready& r : delivering) r.done(std::move(r.status));
      delivering.clear();  // destroy the callables without the lock
      lock.lock();
      idle = 0;
      continue;
    }
    if (events > 0 || std::exchange(lane.kick, false)) {
      idle = 0;
      continue;
    }
    // Back off when idle: spin a little, then sleep up to 1 ms; new work wakes us at once.
    ++idle;
    if (idle < 64) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    } else {
      const auto nap = std::chrono::microseconds(std::min(1000, 10 * (idle - 63)));
      lane.changed.wait_for(lock, nap, [&lane] { return lane.kick || lane.stop; });
    }
  }
}

void UcxTransport::ReleaseAll() {
  std::lock_guard<std::mutex> lock(mu_);
  if (released_) return;
  released_ = true;
  for (auto& [id, region] : regions_) region->Release(static_cast<ucp_context_h>(context_));
  regions_.clear();
  allocated_.clear();
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
    }
    for (auto& lane : lanes_) {
      lane->stop = true;
      lane->changed.notify_all();
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
