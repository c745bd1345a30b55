// AttachArena: the arena and its data-plane registration, then the role's ledger and what it
// announces (SidecarCore::StartRooms, AnnounceArena: a prefill's bootstrap registration).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "control/bootstrap/client.h"
#include "control/plan/layerwise.h"
#include "control/sidecar/sidecar_core.h"
#include "engine/base/error.h"
#include "engine/memory/cuda_arena_staging.h"
#include "engine/memory/host_arena_staging.h"
#include "engine/memory/populate.h"

namespace kvrail::sidecar {

// A refused attach leaves nothing behind, so the engine may try again. The arena's setup
// (shared memory, CUDA IPC, the transport's registration) and the bootstrap's HTTP run under
// attach_mu, never on the owner thread.
absl::Status SidecarCore::Attach(const v1::AttachArena& attach, v1::EngineReply& reply) {
  MutexLock attach_lock(&attach_mu);
  std::optional<absl::Status> reattached = Owned([&]() -> std::optional<absl::Status> {
    if (!attached) return std::nullopt;
    return ReattachLocked(attach, reply);
  });
  if (reattached) return *reattached;
  absl::StatusOr<layout::Contract> parsed = layout::ParseContract(attach.contract());
  if (!parsed.ok()) return AddContext(parsed.status(), "AttachArena: contract");
  KVRAIL_RETURN_IF_ERROR(AddContext(layout::ValidateContract(*parsed), "AttachArena: contract"));
  // Every page of every field inside the arena the contract sizes: the copies of a room are
  // then inside the arena whatever a peer's manifest names (bounds before bytes).
  KVRAIL_RETURN_IF_ERROR(AddContext(layout::CheckArenaFits(*parsed), "AttachArena: contract"));
  absl::Status status = AttachArenaMemory(attach, *parsed);
  if (status.ok()) status = StartRooms(attach, *parsed);
  // Announced once the rooms can take a peer's message: a decode's registration may follow a
  // prefill's bootstrap registration at once.
  if (status.ok()) status = AnnounceArena();
  if (!status.ok()) {
    ReleaseArena();
    return status;
  }
  if (allocated) {
    reply.set_arena_path(absl::StrCat("/proc/", getpid(), "/fd/", allocated->fd));
    reply.set_arena_offset(allocated->fd_offset);
    reply.set_arena_placement(allocated->placement);
    spdlog::info(
        "{} rank {}: arena allocated bytes={} placement={} path={} offset={} populated_ms={}",
        role_name, options.tp_rank, arena_bytes, allocated->placement, reply.arena_path(),
        allocated->fd_offset,
        options.populate_arena ? absl::StrFormat("%.1f", absl::ToDoubleMilliseconds(populate_time))
                               : std::string("off"));
  } else {
    spdlog::info("{} rank {}: arena of {} bytes attached", role_name, options.tp_rank, arena_bytes);
  }
  return absl::OkStatus();
}

// An engine that restarted attaches again. The same arena (the same shared-memory name, or the
// same allocate_bytes, with the same contract) is taken as that: the rooms of the engine that
// went away fail (fenced as any abort: their writes stop before their peers are told), and the
// new engine gets the arena's reply again. Anything else is refused.
absl::Status SidecarCore::ReattachLocked(const v1::AttachArena& attach, v1::EngineReply& reply) {
  absl::StatusOr<std::string> wire = layout::SerializeContract(contract);
  absl::StatusOr<layout::Contract> offered = layout::ParseContract(attach.contract());
  absl::StatusOr<std::string> offered_wire =
      offered.ok() ? layout::SerializeContract(*offered) : offered.status();
  const bool same_contract = wire.ok() && offered_wire.ok() && *wire == *offered_wire;
  const bool same_arena = (host_arena && attach.shm_name() == host_arena->name() &&
                           attach.cuda_ipc_handle().empty() && attach.allocate_bytes() == 0) ||
                          (allocated && attach.allocate_bytes() == allocated->length &&
                           attach.shm_name().empty() && attach.cuda_ipc_handle().empty());
  if (!same_contract || !same_arena) {
    return absl::FailedPreconditionError(
        "AttachArena: an arena is attached already (an engine attaching again must name the same "
        "arena and contract)");
  }
  const std::string reason = "the engine attached again: its rooms from before are void";
  VoidRoomsLocked(reason);
  if (allocated) {
    reply.set_arena_path(absl::StrCat("/proc/", getpid(), "/fd/", allocated->fd));
    reply.set_arena_offset(allocated->fd_offset);
    reply.set_arena_placement(allocated->placement);
  }
  spdlog::info("{} rank {}: the engine attached again; its earlier rooms failed", role_name,
               options.tp_rank);
  return absl::OkStatus();
}

absl::Status SidecarCore::AttachArenaMemory(const v1::AttachArena& attach,
                                            const layout::Contract& parsed) {
  std::vector<std::string> sources;  // where the engine says the arena lives
  if (!attach.shm_name().empty()) sources.push_back("shm_name");
  if (!attach.cuda_ipc_handle().empty()) sources.push_back("cuda_ipc_handle");
  if (attach.allocate_bytes() != 0) sources.push_back("allocate_bytes");
  if (sources.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AttachArena: give exactly one of shm_name, cuda_ipc_handle or allocate_bytes; got ",
        sources.empty() ? "none" : absl::StrJoin(sources, " and ")));
  }
  const uint64_t needed = static_cast<uint64_t>(parsed.ArenaBytes());
  transport::LocalRegion local;
  // A CUDA arena the transport cannot reach (and, with --emulate-gpu-arena, a shared-memory
  // one) is staged through a host mirror that the data plane reads and writes instead.
  bool staged = false;
  if (!attach.shm_name().empty()) {
    absl::StatusOr<Arena> arena = Arena::OpenShared(attach.shm_name());
    if (!arena.ok()) return AddContext(arena.status(), "AttachArena");
    host_arena = *std::move(arena);
    local = {host_arena->data(), host_arena->size(), false};
    staged = options.emulate_gpu_arena;
  } else if (!attach.cuda_ipc_handle().empty()) {
    staged = !transport->capabilities().gpu_memory;
    if (options.verify_digest && !staged) {
      // A room digest reads the arena's bytes on the host; device memory the data plane reaches
      // itself would need a copy back or a hash on the GPU, neither of which kvrail has. A
      // staged arena is hashed in its host mirror.
      return absl::FailedPreconditionError(
          "AttachArena: --verify-digest hashes the arena on the host, and cuda_ipc_handle names "
          "GPU memory that this transport writes directly: attach a host arena (shm_name or "
          "allocate_bytes) or start the sidecar without --verify-digest");
    }
    // What needs no GPU to check is checked first, each in one line.
    if (attach.cuda_device() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AttachArena: cuda_device ", attach.cuda_device(), " is not a device index"));
    }
    if (needed > attach.cuda_bytes()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "AttachArena: cuda_bytes is %d, less than the %d bytes the contract describes "
          "(CACHEPD §4.6)",
          attach.cuda_bytes(), needed));
    }
    absl::StatusOr<CudaArena> arena = ImportCudaIpc(attach.cuda_ipc_handle(), attach.cuda_bytes(),
                                                    attach.cuda_device(), attach.cuda_offset());
    if (!arena.ok()) return AddContext(arena.status(), "AttachArena: CUDA IPC handle");
    cuda_arena = *std::move(arena);
    local = {cuda_arena->data(), cuda_arena->size(), true};
  } else {
    if (needed > attach.allocate_bytes()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "AttachArena: allocate_bytes is %d, less than the %d bytes the contract describes "
          "(CACHEPD §4.6)",
          attach.allocate_bytes(), needed));
    }
    // Allocate registers the memory itself: no Register below.
    absl::StatusOr<transport::SharedRegion> shared = transport->Allocate(attach.allocate_bytes());
    if (!shared.ok()) {
      return AddContext(shared.status(),
                        absl::StrCat("AttachArena: allocating ", attach.allocate_bytes(),
                                     " bytes on the data plane"));
    }
    allocated = *std::move(shared);
    region = allocated->region;
    local = {allocated->base, allocated->length, false};
    if (options.populate_arena) {
      const absl::Time started = absl::Now();
      KVRAIL_RETURN_IF_ERROR(AddContext(PopulatePages(local.base, local.length),
                                        "AttachArena: populating the allocated arena"));
      populate_time = absl::Now() - started;
    }
  }
  if (needed > local.length) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AttachArena: the contract describes %d bytes, the arena holds only %d (CACHEPD §4.6)",
        needed, local.length));
  }
  if (staged) {
    KVRAIL_ASSIGN_OR_RETURN(local, MirrorArena(static_cast<uint8_t*>(local.base), needed));
  }
  if (!allocated && !mirror) {
    absl::StatusOr<transport::RegionId> id = transport->Register(local);
    if (!id.ok()) return AddContext(id.status(), "AttachArena: registering with the data plane");
    region = *id;
  }
  contract = parsed;
  contract_layers = 0;
  for (const layout::FieldLayout& field : parsed.plan.fields) {
    absl::StatusOr<int64_t> layer = plan::FieldLayer(field.field_id);
    if (!layer.ok()) {  // not the "layer.<N>.<suffix>" convention: no layer count
      contract_layers = 0;
      break;
    }
    contract_layers = std::max(contract_layers, static_cast<uint64_t>(*layer) + 1);
  }
  arena_base = reinterpret_cast<uintptr_t>(local.base);
  arena_bytes = local.length;
  metrics.SetArena(allocated ? allocated->placement : cuda_arena ? "cuda" : "shm", arena_bytes);
  return absl::OkStatus();
}

absl::StatusOr<transport::LocalRegion> SidecarCore::MirrorArena(uint8_t* unreachable,
                                                                uint64_t bytes) {
  // Allocate registers the mirror itself; Deregister frees it (ReleaseArena).
  absl::StatusOr<transport::SharedRegion> shared = transport->Allocate(bytes);
  if (!shared.ok()) {
    return AddContext(shared.status(), absl::StrCat("AttachArena: allocating the ", bytes,
                                                    "-byte host mirror of a staged arena"));
  }
  mirror = *std::move(shared);
  region = mirror->region;
  uint8_t* const host = static_cast<uint8_t*>(mirror->base);
  if (cuda_arena) {
    StagingOptions staging_options;
    staging_options.device = cuda_arena->device();
    staging_options.chunk_bytes = options.staging_chunk_bytes;
    staging_options.depth = options.staging_depth;
    absl::StatusOr<std::unique_ptr<CudaArenaStaging>> cuda =
        CudaArenaStaging::Create(unreachable, host, bytes, staging_options);
    if (!cuda.ok()) {
      return AddContext(cuda.status(),
                        "AttachArena: the transport cannot reach GPU memory, and staging it "
                        "through host memory failed");
    }
    staging = *std::move(cuda);
  } else {
    staging = std::make_unique<HostArenaStaging>(unreachable, host, bytes);
  }
  spdlog::info("{} rank {}: arena staged through a host mirror: {}", role_name, options.tp_rank,
               staging->Describe());
  return transport::LocalRegion{host, bytes, false};
}

void SidecarCore::ReleaseArena() {
  ForgetRooms();
  if (region != 0) {
    const absl::Status released = transport->Deregister(region);
    if (!released.ok()) {
      spdlog::warn("{}: withdrawing the arena: {}", role_name, DescribeError(released));
    } else if (allocated) {
      spdlog::info("{} rank {}: arena freed bytes={} placement={}", role_name, options.tp_rank,
                   allocated->length, allocated->placement);
    }
  }
  region = 0;
  staging.reset();  // before the memory it copies between
  mirror.reset();
  allocated.reset();
  host_arena.reset();
  cuda_arena.reset();
  arena_base = 0;
  arena_bytes = 0;
}

}  // namespace kvrail::sidecar
