#include "engine/transport/ucx/ucx_transport.h"

#include <fcntl.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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

// One batch or flush. Freed once it is delivered and no UCX request still points at it.
struct Op {
  PeerState* peer = nullptr;  // kept alive by the transport until its endpoints are closed
  int lane = 0;
  bool flush = false;
  int requests = 0;  // UCX requests outstanding with this op as user data
  bool delivered = false;
  absl::Status status;  // the first failure of a batch's puts
  Completion done;
  class UcxTransport* transport = nullptr;
};

struct PeerState {
  PeerId id = 0;
  RemoteRegions regions;
  std::vector<ucp_ep_h> eps;                   // per local lane
  std::vector<std::vector<ucp_rkey_h>> rkeys;  // [lane][descriptor region index]
  std::vector<absl::Status> lane_errors;       // first failure since the lane's last Flush
  std::vector<ucs_status_t> lane_failed;       // set by UCX's error handler
  std::vector<Op*> ops;                        // undelivered
  bool disconnected = false;
  explicit PeerState(RemoteRegions r) : regions(std::move(r)) {}
  // Runs under the transport's mutex (every owner drops it there), before the workers go.
  ~PeerState() {
    for (auto& lane : rkeys) {
      for (ucp_rkey_h rkey : lane) {
        if (rkey != nullptr) ucp_rkey_destroy(rkey);
      }
    }
  }
};

// What an endpoint's error handler needs.
struct LaneRef {
  PeerState* peer;
  int lane;
};

namespace {

std::string Ucs(ucs_status_t status) { return ucs_status_string(status); }

absl::Status FromUcs(ucs_status_t status, const std::string& context) {
  if (status == UCS_OK) return absl::OkStatus();
  const std::string message = absl::StrFormat("%s: UCX: %s", context, Ucs(status));
  if (status == UCS_ERR_CANCELED) return absl::CancelledError(message);
  return absl::UnavailableError(message);
}

// Frees the endpoint-close requests that have finished and drops them from `requests`.
void ReapClosedEndpoints(std::vector<void*>& requests) {
  requests.erase(std::remove_if(requests.begin(), requests.end(),
                                [](void* request) {
                                  if (ucp_request_check_status(request) == UCS_INPROGRESS) {
                                    return false;
                                  }
                                  ucp_request_free(request);
                                  return true;
                                }),
                 requests.end());
}

}  // namespace
}  // namespace ucx_internal

using ucx_internal::FromUcs;
using ucx_internal::LaneRef;
using ucx_internal::Op;
using ucx_internal::PeerState;
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
// false race. Our own state touched in UCX callbacks is guarded by mu_, held around this call.
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

// Error handler for every endpoint: arg is the PeerState, lane found by matching the endpoint.
void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* peer = static_cast<PeerState*>(arg);
  for (size_t lane = 0; lane < peer->eps.size(); ++lane) {
    if (peer->eps[lane] == ep && peer->lane_failed[lane] == UCS_OK) {
      peer->lane_failed[lane] = status;
    }
  }
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
  transport->progress_ = std::thread([t = transport.get()] { t->RunProgress(); });
  transport->progress_id_ = transport->progress_.get_id();
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
  params.mt_workers_shared = 1;  // one mutex guards every worker, but there are several
  ucp_context_h context = nullptr;
  s = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (s != UCS_OK) {
    return FromUcs(s, absl::StrFormat("ucx: ucp_init with tls \"%s\"", options.tls));
  }
  context_ = context;
  // UCX 1.13 has no peer-failure handler on shared memory; tcp has one.
  peer_errors_ = options.tls.empty() || options.tls.find("tcp") != std::string::npos;
  for (int lane = 0; lane < options.lanes; ++lane) {
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    ucp_worker_h worker = nullptr;
    s = ucp_worker_create(context, &wp, &worker);
    if (s != UCS_OK) return FromUcs(s, absl::StrFormat("ucx: ucp_worker_create for lane %d", lane));
    workers_.push_back(worker);
    ucp_address_t* address = nullptr;
    size_t length = 0;
    s = ucp_worker_get_address(worker, &address, &length);
    if (s != UCS_OK) {
      return FromUcs(s, absl::StrFormat("ucx: ucp_worker_get_address for lane %d", lane));
    }
    addresses_.emplace_back(reinterpret_cast<const char*>(address), length);
    ucp_worker_release_address(worker, address);
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
    const bool overlap = base <= entry->base ? entry->base - base < region.length
                                             : base - entry->base < entry->length;
    if (overlap) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "local region [0x%x, +%u) overlaps registered region %d [0x%x, +%u); regions must be "
          "disjoint",
          base, region.length, id, entry->base, entry->length));
    }
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
  it->second->Release(static_cast<ucp_context_h>(context_));
  regions_.erase(it);
  if (auto owned = allocated_.find(region); owned != allocated_.end()) allocated_.erase(owned);
  ++version_;
  return absl::OkStatus();
}

absl::StatusOr<v1::HandshakeDescriptor> UcxTransport::LocalDescriptor() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("LocalDescriptor: the transport is closed");
  v1::HandshakeDescriptor descriptor;
  descriptor.set_version(version_);
  descriptor.set_transport(v1::TRANSPORT_KIND_UCX);
  for (const std::string& address : addresses_) descriptor.add_lanes()->set_address(address);
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
  if (peer.transport() != v1::TRANSPORT_KIND_UCX) {
    return absl::InvalidArgumentError(
        absl::StrFormat("peer descriptor: transport is %s; this is the ucx transport",
                        v1::TransportKind_Name(peer.transport())));
  }
  if (peer.lanes_size() == 0) {
    return absl::InvalidArgumentError("peer descriptor: no lanes; at least 1 is needed");
  }
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
  auto state = std::make_shared<PeerState>(std::move(regions));
  const int lanes = capabilities_.lanes;
  state->eps.assign(lanes, nullptr);
  state->rkeys.assign(lanes, std::vector<ucp_rkey_h>(peer.regions_size(), nullptr));
  state->lane_errors.assign(lanes, absl::OkStatus());
  state->lane_failed.assign(lanes, UCS_OK);
  absl::Status failure;
  for (int lane = 0; lane < lanes && failure.ok(); ++lane) {
    const int remote_lane = lane % peer.lanes_size();
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(peer.lanes(remote_lane).address().data());
    ep.err_handler.cb = OnEndpointError;
    ep.err_handler.arg = state.get();
    // Peer-failure handling where the transports support it (tcp); shared memory has no peer
    // failure handler in UCX 1.13, so it falls back, once per transport, to no error handling.
    ep.err_mode = peer_errors_ ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ucs_status_t s =
        ucp_ep_create(static_cast<ucp_worker_h>(workers_[lane]), &ep, &state->eps[lane]);
    if (s == UCS_ERR_UNREACHABLE && peer_errors_) {
      peer_errors_ = false;
      ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      s = ucp_ep_create(static_cast<ucp_worker_h>(workers_[lane]), &ep, &state->eps[lane]);
    }
    if (s != UCS_OK) {
      state->eps[lane] = nullptr;
      failure = absl::UnavailableError(
          absl::StrFormat("peer descriptor: lane %d: ucp_ep_create to peer lane %d failed: %s",
                          lane, remote_lane, Ucs(s)));
      break;
    }
    for (int r = 0; r < peer.regions_size(); ++r) {
      s = ucp_ep_rkey_unpack(state->eps[lane], peer.regions(r).remote_key().data(),
                             &state->rkeys[lane][r]);
      if (s != UCS_OK) {
        state->rkeys[lane][r] = nullptr;
        failure = absl::InvalidArgumentError(absl::StrFormat(
            "peer descriptor: region %d: remote key is not a UCX rkey this transport can use "
            "(ucp_ep_rkey_unpack: %s)",
            r, Ucs(s)));
        break;
      }
    }
  }
  // Finish UCX's wireup now, with a bounded wait, so that an unreachable peer is reported here
  // and no wireup message is left pending when either side's worker is destroyed (UCX 1.13
  // asserts on a pending wireup reply at ucp_worker_destroy).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int lane = 0; lane < lanes && failure.ok(); ++lane) {
    ucp_request_param_t param{};
    ucs_status_ptr_t request = ucp_ep_flush_nbx(state->eps[lane], &param);
    ucs_status_t s = UCS_OK;
    if (UCS_PTR_IS_ERR(request)) {
      s = UCS_PTR_STATUS(request);
    } else if (request != nullptr) {
      while ((s = ucp_request_check_status(request)) == UCS_INPROGRESS &&
             std::chrono::steady_clock::now() < deadline) {
        ProgressWorker(workers_[lane]);
      }
      ucp_request_free(request);  // released by UCX when it completes, if it has not
      if (s == UCS_INPROGRESS) s = UCS_ERR_TIMED_OUT;
    }
    if (s != UCS_OK) {
      failure = absl::UnavailableError(absl::StrFormat(
          "peer descriptor: lane %d: the peer's worker could not be reached (wireup flush: %s)",
          lane, Ucs(s)));
    }
  }
  if (!failure.ok()) {
    ClosePeerLocked(*state, "connect failed");
    closing_peers_.push_back(std::move(state));
    kick_ = true;
    changed_.notify_all();
    return failure;
  }
  const PeerId id = next_peer_++;
  state->id = id;
  peers_.emplace(id, std::move(state));
  return id;
}

absl::StatusOr<std::shared_ptr<PeerState>> UcxTransport::FindPeerLocked(PeerId peer,
                                                                        int lane) const {
  if (closed_) return absl::FailedPreconditionError("the transport is closed");
  KVRAIL_RETURN_IF_ERROR(CheckLane(lane, capabilities_.lanes));
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("peer %d is not connected (never connected, or disconnected)", peer));
  }
  return it->second;
}

void UcxTransport::FinishLocked(Op* op, absl::Status status) {
  if (!op->delivered) {
    op->delivered = true;
    PeerState* peer = op->peer;
    peer->ops.erase(std::find(peer->ops.begin(), peer->ops.end(), op));
    if (!op->flush && !status.ok() && peer->lane_errors[op->lane].ok()) {
      peer->lane_errors[op->lane] = status;
    }
    ready_.push_back({std::move(op->done), std::move(status)});
  }
  if (op->requests == 0) delete op;
}

void UcxTransport::OnPutDone(void* request, int status_int, void* user_data) {
  const auto status = static_cast<ucs_status_t>(status_int);
  auto* op = static_cast<Op*>(user_data);
  UcxTransport* self = op->transport;
  ucp_request_free(request);
  --op->requests;
  if (op->delivered) {
    if (op->requests == 0) delete op;
    return;
  }
  if (op->flush) {
    absl::Status result = std::exchange(op->peer->lane_errors[op->lane], absl::OkStatus());
    if (result.ok() && status != UCS_OK) {
      result = FromUcs(status, absl::StrFormat("flush to peer %d lane %d", op->peer->id, op->lane));
    }
    self->FinishLocked(op, std::move(result));
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
  if (op->requests == 0) self->FinishLocked(op, op->status);
}

absl::Status UcxTransport::PostWrites(PeerId peer, int lane, RegionId source,
                                      absl::Span<const Write> writes, Completion done) {
  const std::string context =
      absl::StrFormat("PostWrites to peer %d lane %d from region %d", peer, lane, source);
  if (!done) return absl::InvalidArgumentError(context + ": the completion is empty");
  std::lock_guard<std::mutex> lock(mu_);
  auto found = FindPeerLocked(peer, lane);
  if (!found.ok()) return AddContext(found.status(), context);
  PeerState& state = **found;
  auto region = regions_.find(source);
  if (region == regions_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("%s: source region %d is not registered", context, source));
  }
  KVRAIL_RETURN_IF_ERROR(AddContext(
      CheckWrites(writes, region->second->length, state.regions, capabilities_.max_write_bytes),
      context));
  auto* op = new Op;
  op->peer = &state;
  op->lane = lane;
  op->done = std::move(done);
  op->transport = this;
  state.ops.push_back(op);
  kick_ = true;
  changed_.notify_all();
  if (state.lane_failed[lane] != UCS_OK) {
    FinishLocked(op, FromUcs(state.lane_failed[lane],
                             absl::StrFormat("%s: the peer's endpoint failed", context)));
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
    const int index = *state.regions.Find(w.remote_address, w.length);
    ucs_status_ptr_t request = ucp_put_nbx(state.eps[lane], base + w.local_offset, w.length,
                                           w.remote_address, state.rkeys[lane][index], &param);
    if (request == nullptr) continue;
    if (UCS_PTR_IS_ERR(request)) {
      op->status =
          FromUcs(UCS_PTR_STATUS(request),
                  absl::StrFormat("%s: write %d of %d: ucp_put_nbx", context, i, writes.size()));
      if (op->status.code() == absl::StatusCode::kCancelled) {
        op->status = absl::UnavailableError(op->status.message());
      }
      break;
    }
    ++op->requests;
  }
  if (op->requests == 0) FinishLocked(op, op->status);
  return absl::OkStatus();
}

absl::Status UcxTransport::Flush(PeerId peer, int lane, Completion done) {
  const std::string context = absl::StrFormat("Flush of peer %d lane %d", peer, lane);
  if (!done) return absl::InvalidArgumentError(context + ": the completion is empty");
  std::lock_guard<std::mutex> lock(mu_);
  auto found = FindPeerLocked(peer, lane);
  if (!found.ok()) return AddContext(found.status(), context);
  PeerState& state = **found;
  auto* op = new Op;
  op->peer = &state;
  op->lane = lane;
  op->flush = true;
  op->done = std::move(done);
  op->transport = this;
  state.ops.push_back(op);
  kick_ = true;
  changed_.notify_all();
  if (state.lane_failed[lane] != UCS_OK) {
    absl::Status result = std::exchange(state.lane_errors[lane], absl::OkStatus());
    if (result.ok()) {
      result = FromUcs(state.lane_failed[lane],
                       absl::StrFormat("%s: the peer's endpoint failed", context));
    }
    FinishLocked(op, std::move(result));
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
    FinishLocked(op, std::exchange(state.lane_errors[lane], absl::OkStatus()));
  } else if (UCS_PTR_IS_ERR(request)) {
    absl::Status result = std::exchange(state.lane_errors[lane], absl::OkStatus());
    if (result.ok()) {
      result = absl::UnavailableError(
          absl::StrFormat("%s: ucp_ep_flush_nbx: %s", context, Ucs(UCS_PTR_STATUS(request))));
    }
    FinishLocked(op, std::move(result));
  } else {
    op->requests = 1;
  }
  return absl::OkStatus();
}

void UcxTransport::ClosePeerLocked(PeerState& peer, const char* why) {
  peer.disconnected = true;
  while (!peer.ops.empty()) {
    Op* op = peer.ops.front();
    FinishLocked(op, absl::CancelledError(
                         absl::StrFormat("%s to peer %d lane %d: %s before it completed",
                                         op->flush ? "flush" : "batch", peer.id, op->lane, why)));
  }
  // A flushing close, not UCP_EP_CLOSE_FLAG_FORCE: UCX 1.13 aborts the TARGET process
  // ("ucp_request.inl: Fatal: unexpected error: Endpoint timeout" in ucp_put_handler) when the
  // initiator force-closes while emulated puts are still arriving, because the target's put
  // acknowledgement then fails. The user's completions were cancelled above; UCX finishes the
  // puts already posted, and a dead peer fails the flush (tcp) or the wait in Teardown ends it.
  // The rkeys are destroyed with the PeerState, once the endpoints are closed.
  for (size_t lane = 0; lane < peer.eps.size(); ++lane) {
    if (peer.eps[lane] == nullptr) continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = 0;
    ucs_status_ptr_t request = ucp_ep_close_nbx(peer.eps[lane], &param);
    peer.eps[lane] = nullptr;
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) closing_.push_back(request);
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
  std::shared_ptr<PeerState> state = std::move(it->second);
  peers_.erase(it);
  ClosePeerLocked(*state, "the peer was disconnected");
  closing_peers_.push_back(std::move(state));
  kick_ = true;
  changed_.notify_all();
  return absl::OkStatus();
}

void UcxTransport::TeardownLocked(std::unique_lock<std::mutex>& lock) {
  for (auto& [id, peer] : peers_) {
    ClosePeerLocked(*peer, "the transport was closed");
    closing_peers_.push_back(peer);
  }
  peers_.clear();
  // Force-closed endpoints finish after a little progress.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!closing_.empty() && std::chrono::steady_clock::now() < deadline) {
    for (void* worker : workers_) ProgressWorker(worker);
    ucx_internal::ReapClosedEndpoints(closing_);
  }
  closing_peers_.clear();
  // Let messages in flight (wireup, acknowledgements of peers' puts) drain before the workers go.
  for (int quiet = 0, rounds = 0; quiet < 16 && rounds < 100000; ++rounds) {
    unsigned events = 0;
    for (void* worker : workers_) events += ProgressWorker(worker);
    quiet = events == 0 ? quiet + 1 : 0;
  }
  for (auto& [id, region] : regions_) region->Release(static_cast<ucp_context_h>(context_));
  regions_.clear();
  for (void* worker : workers_) ucp_worker_destroy(static_cast<ucp_worker_h>(worker));
  workers_.clear();
  torn_down_ = true;
  (void)lock;
}

void UcxTransport::RunProgress() {
  int idle = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (closed_ && !torn_down_) TeardownLocked(lock);
    unsigned events = 0;
    if (!torn_down_) {
      for (void* worker : workers_) events += ProgressWorker(worker);
      if (!closing_.empty()) {
        ucx_internal::ReapClosedEndpoints(closing_);
        if (closing_.empty()) closing_peers_.clear();
      }
    }
    if (!ready_.empty()) {
      std::deque<Ready> ready = std::move(ready_);
      ready_.clear();
      lock.unlock();
      for (Ready& r : ready) r.done(std::move(r.status));
      ready.clear();  // destroy the callables without the lock
      lock.lock();
      idle = 0;
      continue;
    }
    if (torn_down_) return;
    if (events > 0 || std::exchange(kick_, false)) {
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
      changed_.wait_for(lock, nap, [this] { return kick_ || closed_; });
    }
  }
}

void UcxTransport::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    changed_.notify_all();
  }
  if (OnProgressThread()) return;
  std::lock_guard<std::mutex> lock(join_mu_);
  if (progress_.joinable()) {
    progress_.join();
  } else {
    // Create failed before the thread started: tear down here.
    std::unique_lock<std::mutex> l(mu_);
    if (!torn_down_) TeardownLocked(l);
  }
}

}  // namespace kvrail::transport
