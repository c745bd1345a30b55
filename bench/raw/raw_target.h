// The target (decode) side of `kvrail bench raw`, as in real use a process of its own: it
// has its transport (made by transport::MakeTransport, as both sides' are) allocate its arena
// (Transport::Allocate: UCX's own shared memory when a shared-memory transport is loaded, so
// peers' puts are plain stores; a memfd over tcp and over verbs), hands
// its handshake descriptor to the initiator on stdout, and keeps its progress thread running
// (over tcp UCX emulates puts over active messages, so the target must progress) until it is
// told to exit. On request it checks bytes of its arena against the pattern the initiator's
// source holds.
//
// Protocol, one line each way:
// A verbs target answers its initiator's queue-pair exchange from the verbs backend's own
// connect endpoint, and lands its writes on its lane threads (libibverbs: the NIC does).
//
//   target -> initiator:  "placement <ucx-shm|memfd>", then
//                         "descriptor <hex of the serialised v1::HandshakeDescriptor>"
//   initiator -> target:  "verify <offset> <length> <pattern offset>"  answered "ok" or
//                         "mismatch <offset>"; "exit" (or end of file) ends the target.
#ifndef KVRAIL_BENCH_RAW_RAW_TARGET_H_
#define KVRAIL_BENCH_RAW_RAW_TARGET_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/raw/raw_flags.h"
#include "cluster/process/subprocess.h"
#include "engine/transport/factory.h"
#include "engine/transport/ucx/ucx_transport.h"
#include "proto/kvrail/v1/handshake.pb.h"

namespace kvrail::bench {

// The seed of the pattern every source arena of the bench holds (engine/memory/pattern.h).
inline constexpr uint64_t kRawPatternSeed = 0x6b7672616c;

struct RawTargetOptions {
  RawLink link = RawLink::kShm;
  int lanes = 1;
  uint64_t arena_bytes = 0;
  std::string net_device;  // UCX_NET_DEVICES for tcp; empty: "lo" (ignored for shm and verbs)
  // verbs: the provider the initiator uses ("libibverbs", "softverbs"), set as
  // KVRAIL_VERBS_PROVIDER in the target's environment so both ends agree; empty: inherited.
  std::string verbs_provider;
  // UCX: how the target's lanes store what lands (a tcp write message's bytes), as the bench
  // raw's --landing-stores.
  transport::LandingStores landing_stores = transport::LandingStores::kAuto;
};

// The transport both sides of a measurement make (transport::MakeTransport): UCX "sm,self" for
// shm; UCX "tcp" on `net_device` (default "lo") for tcp and netns; the verbs backend for verbs,
// its provider from KVRAIL_VERBS_PROVIDER (else libibverbs). Either way the transport takes any
// block whole (max_write_bytes: the largest block); slices are the bench's to choose. UCX links
// store what lands with `stores` (verbs takes none).
transport::TransportSpec TransportSpecFor(RawLink link, int lanes, const std::string& net_device,
                                          transport::LandingStores stores);

// The UCX settings of a UCX row's spec (tcp, shm, netns), for what only UCX knows: the tuning
// environment ucx_perftest is given (transport::UcxTuningEnvironment).
transport::UcxOptions UcxOptionsFor(RawLink link, int lanes, const std::string& net_device);

// The body of `kvrail bench raw-target`: serves the protocol above on `in` / `out` until "exit"
// or end of file. Errors are returned (the caller prints them); the protocol answers stay on
// `out`.
absl::Status RunRawTarget(const RawTargetOptions& options, std::FILE* in, std::FILE* out);

// The initiator's handle on a target process.
class TargetProcess {
 public:
  // Runs `exec_prefix` + `self_exe bench raw-target ...` and reads its descriptor.
  static absl::StatusOr<TargetProcess> Start(const std::vector<std::string>& exec_prefix,
                                             const std::string& self_exe,
                                             const RawTargetOptions& options);

  const v1::HandshakeDescriptor& descriptor() const { return descriptor_; }
  // Where Transport::Allocate placed the target's arena ("ucx-shm", "memfd").
  const std::string& placement() const { return placement_; }
  // The absolute address of the target arena's first byte (its only region).
  uint64_t arena_address() const { return descriptor_.regions(0).base(); }

  // DataLoss naming the first differing offset when target bytes [offset, offset + length) do
  // not hold the source pattern's bytes [pattern_offset, pattern_offset + length).
  absl::Status Verify(uint64_t offset, uint64_t length, uint64_t pattern_offset);

  // Tells the target to exit and waits for it; an error when it exits with a failure.
  absl::Status Stop();

 private:
  explicit TargetProcess(std::unique_ptr<process::Subprocess> child) : child_(std::move(child)) {}
  std::unique_ptr<process::Subprocess> child_;
  v1::HandshakeDescriptor descriptor_;
  std::string placement_;
};

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_RAW_RAW_TARGET_H_
