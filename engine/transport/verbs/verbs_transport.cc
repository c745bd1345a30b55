#include "engine/transport/verbs/verbs_transport.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <utility>

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
#include "engine/transport/verbs/verbs_rail.h"

namespace kvrail::transport {
namespace verbs_internal {

struct RegionState {
  bool cuda = false;
  uint64_t base = 0;             // the work requests' source addresses start here
  std::vector<ibv_mr*> mrs;      // one per rail
  std::unique_ptr<Arena> arena;  // Allocate's memfd placement
  // Batches holding this region as their source and not yet complete; Deregister waits for
  // them (their work requests name the region's lkeys).
  std::mutex mu;
  std::condition_variable idle;
  int inflight = 0;
};

struct Op {
  bool flush = false;
  int attempts = 1;  // QPs this batch was posted on (a rail failure resends it on another)
  Completion done;
  std::shared_ptr<RegionState> source;
  std::vector<Write> writes;
  std::vector<int> remote_region;  // each write's index in the peer's regions
  size_t next = 0;                 // the first write not yet posted
  uint64_t last_wr = 0;            // the sequence number of its last posted work request
};

struct QpState {
  enum class State { kConnecting, kReady, kBroken, kClosed };
  std::mutex mu;
  LaneState* lane = nullptr;
  int lane_index = 0;
  PeerState* peer = nullptr;          // owns this
  std::weak_ptr<PeerState> peer_ref;  // the same, for the reconnect worker
  State state = State::kConnecting;
  ibv_qp* qp = nullptr;
  int rail = 0;          // the local rail the QP is on (its lane's home rail unless failed over)
  bool probing = false;  // the rail is being probed back into rotation by this QP
  int remote_lane = 0;   // the peer's lane it connects to
  uint32_t remote_rail = 0;
  std::string connection_id;  // at the peer's connect endpoint
  int generation = 0;
  bool reconnecting = false;
  absl::Status error;  // why the QP broke
  uint64_t next_wr = 1;
  uint64_t completed_wr = 0;
  uint32_t outstanding = 0;
  std::deque<Op*> waiting;  // not yet wholly posted, in order
  std::deque<Op*> posted;   // wholly posted (flushes: queued behind them), in order
  absl::Status since_flush;
  // Reused for each post: the work requests and their scatter-gather entries.
  std::vector<ibv_send_wr> wrs;
  std::vector<ibv_sge> sges;
};

struct PeerState {
  PeerId id = 0;
  std::string name;  // its session id, or "peer <id>"
  RemoteRegions remote;
  std::vector<std::vector<uint32_t>> rkeys;  // [region][rail]
  std::vector<v1::VerbsLaneAddress> lanes;
  std::string connection_base;
  std::vector<std::shared_ptr<QpState>> qps;  // one per local lane
  std::atomic<bool> closed{false};

  explicit PeerState(RemoteRegions r) : remote(std::move(r)) {}
};

struct LaneState {
  int index = 0;
  Rail* rail = nullptr;  // its home rail
  int rail_index = 0;
  // One completion queue and event channel per rail: a QP failed over to another rail completes
  // there (a QP's CQ must belong to its device).
  std::vector<ibv_comp_channel*> channels;
  std::vector<ibv_cq*> cqs;
  int wake_fd = -1;
  std::thread thread;
  std::thread::id thread_id;
  std::mutex mu;
  std::map<uint32_t, std::shared_ptr<QpState>> by_qp_num;
  std::vector<std::pair<Completion, absl::Status>> ready;
  bool stop = false;
};

struct Responder {
  std::vector<ibv_qp*> qps;
};

}  // namespace verbs_internal

using verbs_internal::LaneState;
using verbs_internal::Op;
using verbs_internal::PeerState;
using verbs_internal::QpState;
using verbs_internal::RegionState;
using verbs_internal::Responder;

namespace {

// Deep enough for every work request of 256 peers at the default max_send_wr: a completion queue
// that overruns is fatal to it, on a NIC as in the software provider.
constexpr int kCqDepth = 1 << 16;
constexpr int kPollBatch = 32;

absl::Status VerbsCallError(const char* call, int error, absl::string_view where) {
  return absl::UnavailableError(
      absl::StrCat(call, " (", where, "): ", std::strerror(error), " (errno ", error, ")"));
}

uint32_t RandomPsn() {
  thread_local std::mt19937 random(std::random_device{}());
  return random() & 0xffffff;
}

std::string PackRkeys(const std::vector<ibv_mr*>& mrs) {
  std::string out;
  for (ibv_mr* mr : mrs) {
    for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<char>(mr->rkey >> shift));
  }
  return out;
}

// The text of a work completion's status, as rdma-core names it, and what it usually means.
std::string WcStatusText(ibv_wc_status status) {
  std::string text = absl::StrCat(ibv_wc_status_str(status));
  switch (status) {
    case IBV_WC_REM_ACCESS_ERR:
      return absl::StrCat("IBV_WC_REM_ACCESS_ERR: ", text,
                          " (the peer's region was deregistered, or its key or bounds refused "
                          "the write)");
    case IBV_WC_RETRY_EXC_ERR:
      return absl::StrCat("IBV_WC_RETRY_EXC_ERR: ", text,
                          " (the peer did not acknowledge: its process died or stopped, or the "
                          "link is down)");
    case IBV_WC_WR_FLUSH_ERR:
      return absl::StrCat("IBV_WC_WR_FLUSH_ERR: ", text);
    case IBV_WC_LOC_PROT_ERR:
      return absl::StrCat("IBV_WC_LOC_PROT_ERR: ", text);
    default:
      return absl::StrCat("work completion status ", static_cast<int>(status), ": ", text);
  }
}

}  // namespace

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

  for (const auto& rail : rails_) {
    ibv_cq* cq = api_.create_cq(rail->context(), kCqDepth, nullptr, nullptr, 0);
    if (cq == nullptr) return VerbsCallError("ibv_create_cq", errno, rail->device());
    responder_cqs_.push_back(cq);
  }
  std::vector<uint32_t> gbps;
  for (const auto& rail : rails_) gbps.push_back(rail->gbps());
  const std::vector<int> home = AssignLanesToRails(options_.lanes, gbps);
  health_ =
      std::make_unique<RailHealth>(static_cast<int>(rails_.size()), options_.rail_probe_after);
  for (int i = 0; i < options_.lanes; ++i) {
    auto lane = std::make_unique<LaneState>();
    lane->index = i;
    lane->rail_index = home[i];
    lane->rail = rails_[lane->rail_index].get();
    for (const auto& rail : rails_) {
      const std::string where = absl::StrCat(rail->device(), ", lane ", i);
      ibv_comp_channel* channel = api_.create_comp_channel(rail->context());
      if (channel == nullptr) return VerbsCallError("ibv_create_comp_channel", errno, where);
      lane->channels.push_back(channel);
      ibv_cq* cq = api_.create_cq(rail->context(), kCqDepth, lane.get(), channel, 0);
      if (cq == nullptr) return VerbsCallError("ibv_create_cq", errno, where);
      lane->cqs.push_back(cq);
    }
    const std::string where = absl::StrCat(lane->rail->device(), ", lane ", i);
    lane->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (lane->wake_fd < 0) return VerbsCallError("eventfd", errno, where);
    lanes_.push_back(std::move(lane));
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
    l->thread = std::thread([this, l] { RunLane(*l); });
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
    Wake(*lane);
    if (lane->thread.joinable()) lane->thread.join();
  }
  for (auto& lane : lanes_) {
    for (ibv_cq* cq : lane->cqs) api_.destroy_cq(cq);
    for (ibv_comp_channel* channel : lane->channels) api_.destroy_comp_channel(channel);
    if (lane->wake_fd >= 0) close(lane->wake_fd);
  }
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
    region->set_remote_key(PackRkeys(entry.entry->mrs));
    region->set_memory_kind(entry.entry->cuda ? v1::MEMORY_KIND_CUDA : v1::MEMORY_KIND_HOST);
  }
  return descriptor;
}

// ---------------------------------------------------------------------------------------------
// Queue pairs.

absl::StatusOr<ibv_qp*> VerbsTransport::CreateQp(const Rail& rail, ibv_cq* cq,
                                                 const std::string& where) {
  ibv_qp_init_attr init = {};
  init.send_cq = cq;
  init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;
  init.cap.max_send_wr = options_.max_send_wr;
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  ibv_qp* qp = api_.create_qp(rail.pd(), &init);
  if (qp == nullptr) return VerbsCallError("ibv_create_qp", errno, where);
  ibv_qp_attr attr = {};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = rail.port();
  attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  if (int rc = api_.modify_qp(qp, &attr,
                              IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
      rc != 0) {
    api_.destroy_qp(qp);
    return VerbsCallError("ibv_modify_qp to INIT", rc, where);
  }
  return qp;
}

absl::Status VerbsTransport::QpToRtr(ibv_qp* qp, const Rail& rail, const v1::VerbsQpInfo& remote,
                                     ibv_mtu mtu) {
  ibv_qp_attr attr = {};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = mtu;
  attr.dest_qp_num = remote.qp_num();
  attr.rq_psn = remote.psn();
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = 12;
  attr.ah_attr.is_global = 1;
  attr.ah_attr.dlid = static_cast<uint16_t>(remote.lid());
  attr.ah_attr.port_num = rail.port();
  std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid().data(), 16);
  attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(rail.gid_index());
  attr.ah_attr.grh.hop_limit = 64;
  if (int rc = api_.modify_qp(qp, &attr,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
      rc != 0) {
    return VerbsCallError(
        "ibv_modify_qp to RTR", rc,
        absl::StrCat(rail.device(), " to remote QP ", remote.qp_num(), " GID ",
                     GidText(*reinterpret_cast<const ibv_gid*>(remote.gid().data()))));
  }
  return absl::OkStatus();
}

absl::Status VerbsTransport::QpToRts(ibv_qp* qp, uint32_t psn) {
  ibv_qp_attr attr = {};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = options_.qp_timeout;
  attr.retry_cnt = options_.qp_retry_cnt;
  attr.rnr_retry = 7;
  attr.sq_psn = psn;
  attr.max_rd_atomic = 1;
  if (int rc = api_.modify_qp(qp, &attr,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
      rc != 0) {
    return VerbsCallError("ibv_modify_qp to RTS", rc, absl::StrCat("QP ", qp->qp_num));
  }
  return absl::OkStatus();
}

void VerbsTransport::DestroyQp(ibv_qp* qp) {
  if (qp == nullptr) return;
  ibv_qp_attr attr = {};
  attr.qp_state = IBV_QPS_ERR;
  api_.modify_qp(qp, &attr, IBV_QP_STATE);
  api_.destroy_qp(qp);
}

// ---------------------------------------------------------------------------------------------
// Connecting.

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
    const std::string& key = peer.regions(r).remote_key();
    if (key.size() % 4 != 0 || key.size() < 4 * rails || key.size() > 4 * 64) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": region ", r, " has a ", key.size(),
                                                     "-byte remote key; a verbs peer gives 4 "
                                                     "bytes per rail, and its lanes name ",
                                                     rails, " rails"));
    }
    std::vector<uint32_t> rkeys(key.size() / 4);
    for (uint32_t rail = 0; rail < rkeys.size(); ++rail) {
      for (int b = 0; b < 4; ++b) {
        rkeys[rail] |= uint32_t{static_cast<uint8_t>(key[4 * rail + b])} << (8 * b);
      }
    }
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

absl::Status VerbsTransport::ConnectLanes(PeerState& peer, const std::vector<int>& lanes,
                                          absl::Duration timeout) {
  for (int lane_index : lanes) {
    QpState& qp = *peer.qps[lane_index];
    LaneState& lane = *qp.lane;
    int rail_index;
    int remote_lane;
    int generation;
    {
      std::lock_guard<std::mutex> lock(qp.mu);
      rail_index = qp.rail;
      remote_lane = qp.remote_lane;
      generation = ++qp.generation;
    }
    const Rail& rail = *rails_[rail_index];
    const v1::VerbsLaneAddress& remote = peer.lanes[remote_lane];
    KVRAIL_ASSIGN_OR_RETURN(
        ibv_qp * raw,
        CreateQp(rail, lane.cqs[rail_index], absl::StrCat(rail.device(), ", lane ", lane_index)));
    const uint32_t psn = RandomPsn();
    v1::VerbsConnectRequest request;
    request.set_connection_id(absl::StrCat(peer.connection_base, ".", lane_index, ".", generation));
    request.set_provider(api_.provider);
    v1::VerbsQpInfo* info = request.add_qps();
    info->set_lane(remote_lane);
    info->set_qp_num(raw->qp_num);
    info->set_psn(psn);
    info->set_lid(rail.lid());
    info->set_gid(std::string(reinterpret_cast<const char*>(rail.gid().raw), 16));
    info->set_mtu_bytes(MtuBytes(rail.mtu()));
    auto reply = RequestVerbsConnect(remote.connect_endpoint(), request, timeout);
    absl::Status status = reply.status();
    if (status.ok() && reply->qps_size() != 1) {
      status = absl::DataLossError(absl::StrCat("verbs connect to ", remote.connect_endpoint(),
                                                ": answered ", reply->qps_size(), " QPs for 1"));
    }
    const ibv_mtu mtu = MtuFromBytes(
        std::min<uint32_t>(MtuBytes(rail.mtu()), status.ok() ? reply->qps(0).mtu_bytes() : 0));
    if (status.ok()) status = QpToRtr(raw, rail, reply->qps(0), mtu);
    if (status.ok()) status = QpToRts(raw, psn);
    if (!status.ok()) {
      DestroyQp(raw);
      if (reply.ok()) {
        v1::VerbsRelease release;
        release.set_connection_id(request.connection_id());
        SendVerbsRelease(remote.connect_endpoint(), release, absl::ZeroDuration());
      }
      return absl::Status(status.code(), absl::StrCat(peer.name, ", lane ", lane_index, " on ",
                                                      rail.device(), ": ", status.message()));
    }
    std::lock_guard<std::mutex> lock(qp.mu);
    if (qp.state == QpState::State::kClosed || peer.closed.load()) {
      DestroyQp(raw);
      return absl::CancelledError(absl::StrCat(peer.name, ": disconnected while connecting"));
    }
    qp.qp = raw;
    qp.connection_id = request.connection_id();
    qp.remote_rail = peer.lanes[reply->qps(0).lane() % peer.lanes.size()].rail();
    qp.state = QpState::State::kReady;
    qp.error = absl::OkStatus();
    qp.outstanding = 0;
    qp.completed_wr = qp.next_wr - 1;
    {
      std::lock_guard<std::mutex> lane_lock(lane.mu);
      lane.by_qp_num[raw->qp_num] = peer.qps[lane_index];
    }
    PumpLocked(qp);
  }
  return absl::OkStatus();
}

v1::VerbsConnectReply VerbsTransport::OnConnectRequest(const v1::VerbsConnectRequest& request) {
  v1::VerbsConnectReply reply;
  if (request.provider() != api_.provider) {
    reply.set_error(absl::StrCat("this transport runs verbs provider \"", api_.provider,
                                 "\", the request comes from \"", request.provider(), "\""));
    return reply;
  }
  if (request.connection_id().empty() || request.connection_id().size() > 256 ||
      request.qps_size() < 1 || request.qps_size() > 64) {
    reply.set_error("a connect request needs a connection id of 1 to 256 bytes and 1 to 64 QPs");
    return reply;
  }
  {
    std::lock_guard<std::mutex> lock(responders_mu_);
    if (responders_.count(request.connection_id()) != 0) {
      reply.set_error(absl::StrCat("connection \"", request.connection_id(), "\" exists already"));
      return reply;
    }
    if (static_cast<int>(responders_.size()) >= options_.max_connections) {
      reply.set_error(absl::StrCat("this transport holds ", responders_.size(),
                                   " connections, its limit (max_connections)"));
      return reply;
    }
  }
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (closed_) {
      reply.set_error("the transport is closed");
      return reply;
    }
  }
  auto responder = std::make_unique<Responder>();
  auto fail = [&](const absl::Status& status) {
    for (ibv_qp* qp : responder->qps) DestroyQp(qp);
    reply.Clear();
    reply.set_error(std::string(status.message()));
    return reply;
  };
  for (const v1::VerbsQpInfo& remote : request.qps()) {
    if (remote.gid().size() != 16) {
      return fail(absl::InvalidArgumentError("a requester QP's GID must be 16 bytes"));
    }
    LaneState& lane = *lanes_[remote.lane() % lanes_.size()];
    absl::StatusOr<ibv_qp*> qp =
        CreateQp(*lane.rail, responder_cqs_[lane.rail_index],
                 absl::StrCat(lane.rail->device(), ", lane ", lane.index, " (responder)"));
    if (!qp.ok()) return fail(qp.status());
    responder->qps.push_back(*qp);
    const ibv_mtu mtu =
        MtuFromBytes(std::min<uint32_t>(MtuBytes(lane.rail->mtu()), remote.mtu_bytes()));
    if (absl::Status s = QpToRtr(*qp, *lane.rail, remote, mtu); !s.ok()) return fail(s);
    const uint32_t psn = RandomPsn();
    if (absl::Status s = QpToRts(*qp, psn); !s.ok()) return fail(s);
    v1::VerbsQpInfo* info = reply.add_qps();
    info->set_lane(lane.index);
    info->set_qp_num((*qp)->qp_num);
    info->set_psn(psn);
    info->set_lid(lane.rail->lid());
    info->set_gid(std::string(reinterpret_cast<const char*>(lane.rail->gid().raw), 16));
    info->set_mtu_bytes(MtuBytes(lane.rail->mtu()));
  }
  std::lock_guard<std::mutex> lock(responders_mu_);
  responders_[request.connection_id()] = std::move(responder);
  return reply;
}

void VerbsTransport::OnRelease(const v1::VerbsRelease& release) {
  std::unique_ptr<Responder> responder;
  {
    std::lock_guard<std::mutex> lock(responders_mu_);
    auto it = responders_.find(release.connection_id());
    if (it == responders_.end()) return;
    responder = std::move(it->second);
    responders_.erase(it);
  }
  for (ibv_qp* qp : responder->qps) DestroyQp(qp);
}

// ---------------------------------------------------------------------------------------------
// Posting.

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
  KVRAIL_RETURN_IF_ERROR(CheckWrites(writes, r->length, p->second->remote,
                                     capabilities_.max_write_bytes, &op->remote_region));
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

void VerbsTransport::PumpLocked(QpState& qp) {
  while (qp.state == QpState::State::kReady && !qp.waiting.empty()) {
    Op* op = qp.waiting.front();
    if (op->flush) {
      qp.waiting.pop_front();
      if (qp.posted.empty()) {
        FinishFlushLocked(qp, op);
      } else {
        qp.posted.push_back(op);
      }
      continue;
    }
    const uint32_t room = options_.max_send_wr - qp.outstanding;
    if (room == 0) return;
    const size_t count = std::min<size_t>(room, op->writes.size() - op->next);
    qp.wrs.resize(count);
    qp.sges.resize(count);
    LaneState& lane = *qp.lane;
    const uint32_t lkey = op->source->mrs[qp.rail]->lkey;
    const PeerState& peer = *qp.peer;
    for (size_t i = 0; i < count; ++i) {
      const Write& write = op->writes[op->next + i];
      ibv_sge& sge = qp.sges[i];
      sge.addr = op->source->base + write.local_offset;
      sge.length = static_cast<uint32_t>(write.length);
      sge.lkey = lkey;
      ibv_send_wr& wr = qp.wrs[i];
      wr = {};
      wr.wr_id = qp.next_wr + i;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.send_flags = i + 1 == count ? IBV_SEND_SIGNALED : 0;
      wr.wr.rdma.remote_addr = write.remote_address;
      wr.wr.rdma.rkey = peer.rkeys[op->remote_region[op->next + i]][qp.remote_rail];
      wr.next = i + 1 == count ? nullptr : &qp.wrs[i + 1];
    }
    ibv_send_wr* bad = nullptr;
    if (int rc = api_.post_send(qp.qp, qp.wrs.data(), &bad); rc != 0) {
      FailQpLocked(qp,
                   VerbsCallError("ibv_post_send", rc,
                                  absl::StrCat(rails_[qp.rail]->device(), ", lane ", lane.index,
                                               ", to ", peer.name)),
                   /*path_failure=*/false);
      return;
    }
    qp.outstanding += count;
    qp.next_wr += count;
    op->next += count;
    if (op->next == op->writes.size()) {
      op->last_wr = qp.next_wr - 1;
      qp.waiting.pop_front();
      qp.posted.push_back(op);
    }
  }
}

void VerbsTransport::FinishLocked(QpState& qp, Op* op, absl::Status status) {
  std::unique_ptr<Op> owned(op);
  if (owned->source != nullptr) {
    std::lock_guard<std::mutex> lock(owned->source->mu);
    if (--owned->source->inflight == 0) owned->source->idle.notify_all();
  }
  QueueCompletion(*qp.lane, std::move(owned->done), std::move(status));
}

void VerbsTransport::FinishFlushLocked(QpState& qp, Op* flush, const absl::Status& otherwise) {
  absl::Status status = qp.since_flush.ok() ? otherwise : qp.since_flush;
  qp.since_flush = absl::OkStatus();
  FinishLocked(qp, flush, std::move(status));
}

void VerbsTransport::NoteFailureLocked(QpState& qp, const absl::Status& status) {
  if (qp.since_flush.ok()) qp.since_flush = status;
}

void VerbsTransport::QueueCompletion(LaneState& lane, Completion done, absl::Status status) {
  {
    std::lock_guard<std::mutex> lock(lane.mu);
    lane.ready.emplace_back(std::move(done), std::move(status));
  }
  Wake(lane);
}

void VerbsTransport::Wake(LaneState& lane) {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(lane.wake_fd, &one, sizeof(one));
}

void VerbsTransport::FailQpLocked(QpState& qp, const absl::Status& status, bool path_failure) {
  if (qp.state != QpState::State::kReady) return;
  qp.state = QpState::State::kBroken;
  qp.error = status;
  // To the error state: nothing of it lands any more; destroyed on the worker, and the peer's
  // responder QP is released.
  RetireQpLocked(qp, Destroy::kOnWorker);
  // A path that failed (no acknowledgement within the retry budget) with more than one rail:
  // the rail leaves rotation and its batches are sent again, whole, on a QP over another rail
  // (RDMA writes of the same bytes to the same addresses may land twice; nothing else writes
  // there while the room is in flight). A batch that has been sent on max_attempts QPs fails.
  const bool failover = path_failure && rails_.size() > 1;
  if (failover) {
    const int failed_rail = qp.rail;
    {
      std::lock_guard<std::mutex> lock(health_mu_);
      health_->ReportFailure(failed_rail, absl::Now());
      ++failovers_;
    }
    qp.probing = false;
    qp.rail = ChooseRail(qp.lane->rail_index, failed_rail);
    // The peer's side of the path may be what failed: ask for a lane on another of its rails.
    const PeerState& peer = *qp.peer;
    const int peer_lanes = static_cast<int>(peer.lanes.size());
    for (int step = 1; step <= peer_lanes; ++step) {
      const int candidate = (qp.remote_lane + step) % peer_lanes;
      if (peer.lanes[candidate].rail() != qp.remote_rail || step == peer_lanes) {
        qp.remote_lane = candidate;
        break;
      }
    }
    std::deque<Op*> again;
    for (Op* op : qp.posted) again.push_back(op);
    for (Op* op : qp.waiting) again.push_back(op);
    qp.posted.clear();
    qp.waiting.clear();
    for (Op* op : again) {
      if (!op->flush && op->next > 0) {
        if (op->attempts >= options_.max_attempts) {
          NoteFailureLocked(qp, status);
          FinishLocked(qp, op, status);
          continue;
        }
        ++op->attempts;
        op->next = 0;
      }
      qp.waiting.push_back(op);
    }
  } else {
    NoteFailureLocked(qp, status);
    // Every batch and flush already posted failed with it; those still waiting go to the next QP.
    for (Op* op : qp.posted) {
      if (op->flush) {
        FinishFlushLocked(qp, op);
      } else {
        FinishLocked(qp, op, status);
      }
    }
    qp.posted.clear();
    // A batch partly posted cannot be resumed on another QP (part of it may have landed): it
    // fails.
    if (!qp.waiting.empty() && !qp.waiting.front()->flush && qp.waiting.front()->next > 0) {
      FinishLocked(qp, qp.waiting.front(), status);
      qp.waiting.pop_front();
    }
    // Flushes at the head report the failure; batches behind them wait for a new QP.
    while (!qp.waiting.empty() && qp.waiting.front()->flush) {
      Op* flush = qp.waiting.front();
      qp.waiting.pop_front();
      FinishFlushLocked(qp, flush);
    }
  }
  qp.outstanding = 0;
  qp.completed_wr = qp.next_wr - 1;
  if (!qp.waiting.empty() && !qp.reconnecting) {
    if (std::shared_ptr<PeerState> peer = qp.peer_ref.lock()) {
      ScheduleReconnect(std::move(peer), qp.lane_index);
    }
  }
}

int VerbsTransport::ChooseRail(int home, int avoid) {
  std::lock_guard<std::mutex> lock(health_mu_);
  const absl::Time now = absl::Now();
  if (home != avoid && health_->InRotation(home, now)) return home;
  for (int rail : health_->Up(now)) {
    if (rail != avoid) return rail;
  }
  return home;
}

void VerbsTransport::ScheduleReconnect(std::shared_ptr<PeerState> peer, int lane) {
  // Called with the QP's mutex held.
  QpState& qp = *peer->qps[lane];
  qp.reconnecting = true;
  std::lock_guard<std::mutex> lock(worker_mu_);
  if (worker_stop_) {
    qp.reconnecting = false;
    return;
  }
  worker_jobs_.push_back([this, peer, lane] {
    absl::Status status = peer->closed.load()
                              ? absl::CancelledError("disconnected")
                              : ConnectLanes(*peer, {lane}, options_.reconnect_timeout);
    QpState& qp = *peer->qps[lane];
    std::lock_guard<std::mutex> qp_lock(qp.mu);
    qp.reconnecting = false;
    if (status.ok()) return;  // ConnectLanes pumped what was waiting
    // The batches that waited for the new QP fail with the old QP's error and the reconnect's.
    const absl::Status failed(
        qp.error.ok() ? absl::StatusCode::kUnavailable : qp.error.code(),
        absl::StrCat(qp.error.message(), "; reconnecting failed: ", status.message()));
    while (!qp.waiting.empty()) {
      Op* op = qp.waiting.front();
      qp.waiting.pop_front();
      if (op->flush) {
        FinishFlushLocked(qp, op, failed);
      } else {
        NoteFailureLocked(qp, failed);
        FinishLocked(qp, op,
                     qp.state == QpState::State::kClosed ? absl::CancelledError("peer disconnected")
                                                         : failed);
      }
    }
  });
  worker_cv_.notify_one();
}

void VerbsTransport::RunWorker() {
  std::unique_lock<std::mutex> lock(worker_mu_);
  absl::Time next_probe = absl::Now() + options_.rail_probe_after;
  while (true) {
    const bool woken = worker_cv_.wait_for(
        lock, absl::ToChronoNanoseconds(std::max(next_probe - absl::Now(), absl::ZeroDuration())),
        [this] { return worker_stop_ || !worker_jobs_.empty(); });
    if (!woken) {
      lock.unlock();
      if (rails_.size() > 1) ProbeRails();
      next_probe = absl::Now() + options_.rail_probe_after;
      lock.lock();
      continue;
    }
    if (worker_jobs_.empty()) return;
    std::function<void()> job = std::move(worker_jobs_.front());
    worker_jobs_.pop_front();
    lock.unlock();
    job();
    lock.lock();
  }
}

void VerbsTransport::ProbeRails() {
  // A rail out of rotation whose backoff has passed is probed by one idle QP that failed over
  // from it: that QP moves back, and its next completion puts the rail back into rotation (or
  // its failure takes the rail out again, for twice as long, costing that batch one resend).
  // A rail with nobody to probe it returns to rotation at once: whoever uses it next finds out.
  std::vector<std::shared_ptr<PeerState>> peers;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (closed_) return;
    for (const auto& [id, peer] : peers_) peers.push_back(peer);
  }
  while (true) {
    std::optional<int> probe;
    {
      std::lock_guard<std::mutex> lock(health_mu_);
      probe = health_->TakeProbe(absl::Now());
    }
    if (!probe) break;
    bool taken = false;
    for (const auto& peer : peers) {
      for (int lane = 0; lane < static_cast<int>(peer->qps.size()) && !taken; ++lane) {
        QpState& qp = *peer->qps[lane];
        std::lock_guard<std::mutex> lock(qp.mu);
        if (qp.state != QpState::State::kReady || qp.rail == *probe ||
            qp.lane->rail_index != *probe || !qp.posted.empty() || !qp.waiting.empty() ||
            qp.reconnecting) {
          continue;
        }
        // Not a failure: the QP is idle. It is replaced by one on its home rail.
        RetireQpLocked(qp, Destroy::kOnWorker);
        qp.state = QpState::State::kBroken;
        qp.error = absl::UnavailableError("moved back to its home rail");
        qp.rail = *probe;
        qp.probing = true;
        qp.remote_lane = lane % static_cast<int>(peer->lanes.size());
        ScheduleReconnect(peer, lane);
        taken = true;
      }
      if (taken) break;
    }
    if (!taken) {
      std::lock_guard<std::mutex> lock(health_mu_);
      health_->ReportSuccess(*probe, absl::Now());
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Completions.

void VerbsTransport::OnCompletion(LaneState& lane, const ibv_wc& wc) {
  std::shared_ptr<QpState> found;
  {
    std::lock_guard<std::mutex> lock(lane.mu);
    auto it = lane.by_qp_num.find(wc.qp_num);
    if (it == lane.by_qp_num.end()) return;  // a QP destroyed since: its ops were failed then
    found = it->second;
  }
  QpState& qp = *found;
  std::lock_guard<std::mutex> lock(qp.mu);
  if (qp.state != QpState::State::kReady || qp.qp == nullptr || qp.qp->qp_num != wc.qp_num) return;
  if (wc.status != IBV_WC_SUCCESS) {
    FailQpLocked(qp,
                 absl::UnavailableError(absl::StrCat(WcStatusText(wc.status), ", ",
                                                     rails_[qp.rail]->device(), " lane ",
                                                     lane.index, ", writing to ", qp.peer->name)),
                 /*path_failure=*/wc.status == IBV_WC_RETRY_EXC_ERR);
    return;
  }
  if (qp.probing) {
    qp.probing = false;
    std::lock_guard<std::mutex> health_lock(health_mu_);
    health_->ReportSuccess(qp.rail, absl::Now());
  }
  if (wc.wr_id <= qp.completed_wr || wc.wr_id >= qp.next_wr) return;
  qp.outstanding -= static_cast<uint32_t>(wc.wr_id - qp.completed_wr);
  qp.completed_wr = wc.wr_id;
  while (!qp.posted.empty()) {
    Op* op = qp.posted.front();
    if (op->flush) {
      qp.posted.pop_front();
      FinishFlushLocked(qp, op);
    } else if (op->last_wr <= qp.completed_wr) {
      qp.posted.pop_front();
      FinishLocked(qp, op, absl::OkStatus());
    } else {
      break;
    }
  }
  PumpLocked(qp);
}

void VerbsTransport::RunLane(LaneState& lane) {
  std::vector<ibv_wc> wcs(kPollBatch);
  std::vector<std::pair<Completion, absl::Status>> ready;
  const size_t rails = lane.cqs.size();
  std::vector<bool> armed(rails, false);
  std::vector<pollfd> fds(rails + 1);
  for (size_t r = 0; r < rails; ++r) fds[r] = {lane.channels[r]->fd, POLLIN, 0};
  fds[rails] = {lane.wake_fd, POLLIN, 0};
  while (true) {
    bool polled = false;
    for (ibv_cq* cq : lane.cqs) {
      int n;
      while ((n = api_.poll_cq(cq, kPollBatch, wcs.data())) > 0) {
        polled = true;
        for (int i = 0; i < n; ++i) OnCompletion(lane, wcs[i]);
      }
    }
    bool stop;
    {
      std::lock_guard<std::mutex> lock(lane.mu);
      ready.swap(lane.ready);
      stop = lane.stop;
    }
    for (auto& [done, status] : ready) done(std::move(status));
    const bool delivered = !ready.empty();
    ready.clear();
    if (stop) {
      std::lock_guard<std::mutex> lock(lane.mu);
      if (lane.ready.empty()) return;
      continue;
    }
    if (delivered || polled) continue;
    // Arm, then look again: a completion that came before arming raises no event.
    bool armed_now = false;
    for (size_t r = 0; r < rails; ++r) {
      if (!armed[r]) {
        api_.req_notify_cq(lane.cqs[r], 0);
        armed[r] = true;
        armed_now = true;
      }
    }
    if (armed_now) continue;
    if (poll(fds.data(), fds.size(), 100) <= 0) continue;
    for (size_t r = 0; r < rails; ++r) {
      if ((fds[r].revents & POLLIN) == 0) continue;
      ibv_cq* cq = nullptr;
      void* context = nullptr;
      if (api_.get_cq_event(lane.channels[r], &cq, &context) == 0) {
        api_.ack_cq_events(cq, 1);
        armed[r] = false;
      }
    }
    if (fds[rails].revents & POLLIN) {
      uint64_t count;
      [[maybe_unused]] ssize_t r = read(lane.wake_fd, &count, sizeof(count));
    }
  }
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

void VerbsTransport::ClosePeer(PeerState& peer, const absl::Status& cancelled) {
  peer.closed.store(true);
  for (auto& qp_ptr : peer.qps) {
    QpState& qp = *qp_ptr;
    std::lock_guard<std::mutex> lock(qp.mu);
    qp.state = QpState::State::kClosed;
    // The fence: once the QP is in the error state and destroyed, nothing of it lands.
    RetireQpLocked(qp, Destroy::kNow);
    for (Op* op : qp.posted) FinishLocked(qp, op, cancelled);
    for (Op* op : qp.waiting) FinishLocked(qp, op, cancelled);
    qp.posted.clear();
    qp.waiting.clear();
  }
}

void VerbsTransport::RetireQpLocked(QpState& qp, Destroy when) {
  if (qp.qp == nullptr) return;
  {
    std::lock_guard<std::mutex> lane_lock(qp.lane->mu);
    qp.lane->by_qp_num.erase(qp.qp->qp_num);
  }
  ibv_qp* const retired = qp.qp;
  qp.qp = nullptr;
  // The fence, before anyone hears of the failure or the disconnect.
  ibv_qp_attr attr = {};
  attr.qp_state = IBV_QPS_ERR;
  api_.modify_qp(retired, &attr, IBV_QP_STATE);
  if (when == Destroy::kNow) api_.destroy_qp(retired);
  v1::VerbsRelease release;
  release.set_connection_id(qp.connection_id);
  const std::string endpoint = qp.peer->lanes[qp.remote_lane].connect_endpoint();
  std::lock_guard<std::mutex> lock(worker_mu_);
  if (worker_stop_) {
    // Close: the worker is gone or going; a release that cannot wait is sent from here, handed
    // to the socket without waiting.
    if (when == Destroy::kOnWorker) api_.destroy_qp(retired);
    SendVerbsRelease(endpoint, release, absl::ZeroDuration());
    return;
  }
  // The worker runs every job queued before it stops, and Close joins it before the CQs and
  // the protection domain go: a QP destroyed there is destroyed before them.
  worker_jobs_.push_back(
      [this, endpoint, release, destroy = when == Destroy::kOnWorker ? retired : nullptr] {
        if (destroy != nullptr) api_.destroy_qp(destroy);
        SendVerbsRelease(endpoint, release);
      });
  worker_cv_.notify_one();
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
      for (ibv_qp* qp : responder->qps) DestroyQp(qp);
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
    Wake(*lane);
    if (lane->thread.joinable()) lane->thread.join();
  }
}

}  // namespace kvrail::transport
