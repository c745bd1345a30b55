// --registry etcd://host:port (README, "etcd registry"): data-plane descriptors through etcd
// beside the peer-to-peer handshake, which stays the default and the fallback.
//
// A decode sidecar publishes the descriptor its handshake endpoint serves under
// /kvrail/v1/sessions/<session id>, leased (DescriptorPublisher): again, version+1, whenever it
// changes, and revoked at a clean Stop. A prefill sidecar follows that prefix
// (RegistryDescriptors): its DescriptorCache looks a session up there first, so no handshake
// round trip; a new version refreshes the cached descriptor; a deleted entry (the lease expired:
// the decode stopped renewing it) drops the session and fails its rooms, naming the expiry.
#ifndef KVRAIL_CONTROL_SIDECAR_DESCRIPTOR_REGISTRY_H_
#define KVRAIL_CONTROL_SIDECAR_DESCRIPTOR_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "control/registry/lease_publisher.h"
#include "control/registry/prefix_watcher.h"
#include "proto/kvrail/v1/handshake.pb.h"

namespace kvrail::sidecar {

// Decode: its descriptor in the registry.
class DescriptorPublisher {
 public:
  // A lease of `ttl` at `endpoint` ("host:port"); Unavailable naming the endpoint when etcd does
  // not answer.
  static absl::StatusOr<std::unique_ptr<DescriptorPublisher>> Start(const std::string& endpoint,
                                                                    absl::Duration ttl,
                                                                    std::string session_id,
                                                                    int tp_rank);
  // Publishes `descriptor` (never waits for etcd) when its bytes differ from what was published
  // last, as the next version. Thread-safe.
  void Offer(const v1::HandshakeDescriptor& descriptor);
  // Revokes the lease: the entry goes at once. Idempotent.
  void Stop() { leased_->Stop(); }

 private:
  DescriptorPublisher() = default;
  std::unique_ptr<registry::LeasePublisher> leased_;
  std::string session_id_;
  int tp_rank_ = 0;
  std::mutex mu_;
  std::string published_;  // serialized, guarded by mu_
  int64_t version_ = 0;    // guarded by mu_
};

// Prefill: the registry's descriptors, followed by a watch.
class RegistryDescriptors {
 public:
  struct Hooks {
    // A session's entry has a new version (called on the watcher's thread).
    std::function<void(const std::string& session)> changed;
    // A session's entry was deleted; `reason` names the key and the lease's ttl.
    std::function<void(const std::string& session, const std::string& reason)> gone;
  };
  // Lists and watches /kvrail/v1/sessions/ at `endpoint`; Unavailable naming the endpoint when
  // etcd does not answer. Hooks may be empty.
  static absl::StatusOr<std::unique_ptr<RegistryDescriptors>> Start(const std::string& endpoint,
                                                                    Hooks hooks);
  ~RegistryDescriptors();  // Stop()

  // The descriptor the registry holds for `session`, or nullopt (none, or not a valid one).
  std::optional<v1::HandshakeDescriptor> Lookup(const std::string& session);
  // Lookups answered from the registry (each one a handshake round trip saved).
  uint64_t hits() const { return hits_.load(); }
  void Stop();

 private:
  RegistryDescriptors() = default;
  void OnEvent(const registry::WatchEvent& event);

  Hooks hooks_;
  std::mutex mu_;
  struct Entry {
    v1::HandshakeDescriptor descriptor;
    int64_t version = 0;
    int64_t lease_ttl_s = 0;
  };
  std::map<std::string, Entry> entries_;  // by session id, guarded by mu_
  std::atomic<uint64_t> hits_{0};
  std::unique_ptr<registry::PrefixWatcher> watcher_;
};

}  // namespace kvrail::sidecar

#endif  // KVRAIL_CONTROL_SIDECAR_DESCRIPTOR_REGISTRY_H_
