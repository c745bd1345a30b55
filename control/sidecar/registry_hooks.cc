// --registry on a sidecar (descriptor_registry.h): where the registry joins the sidecar's
// parts. A decode publishes its descriptor once attached and whenever it changes (checked each
// heartbeat); a prefill's DescriptorCache asks the registry before the handshake, and a
// session whose entry is deleted is dropped as the --registration-ttl path drops one.
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "control/registry/etcd_client.h"
#include "control/sidecar/decode_sidecar.h"
#include "control/sidecar/prefill_sidecar.h"
#include "engine/base/error.h"

namespace kvrail::sidecar {

namespace {

// --registry's etcd endpoint, once --registry-ttl is checked.
absl::StatusOr<std::string> RegistryEndpoint(const SidecarOptions& options) {
  KVRAIL_ASSIGN_OR_RETURN(const std::string endpoint, registry::ParseRegistryUrl(options.registry));
  if (options.registry_ttl < absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--registry-ttl ", absl::FormatDuration(options.registry_ttl), " must be at least 1 s"));
  }
  return endpoint;
}

}  // namespace

absl::Status DecodeSidecar::StartRegistry() {
  if (options.registry.empty()) return absl::OkStatus();
  KVRAIL_ASSIGN_OR_RETURN(const std::string endpoint, RegistryEndpoint(options));
  KVRAIL_ASSIGN_OR_RETURN(
      registry_publisher,
      DescriptorPublisher::Start(endpoint, options.registry_ttl, session_id, options.tp_rank));
  return absl::OkStatus();
}

absl::Status PrefillSidecar::StartRegistry() {
  if (options.registry.empty()) return absl::OkStatus();
  KVRAIL_ASSIGN_OR_RETURN(const std::string endpoint, RegistryEndpoint(options));
  RegistryDescriptors::Hooks hooks;
  hooks.changed = [this](const std::string& session) {
    const bool registered = Owned([&] { return rooms && rooms->Registration(session) != nullptr; });
    if (!registered) return;
    bool changed = false;
    absl::StatusOr<std::shared_ptr<const v1::HandshakeDescriptor>> refreshed =
        descriptors->Refresh(session, &changed);
    if (refreshed.ok()) {
      spdlog::info("prefill: session {}: the registry has a new descriptor version={}", session,
                   (*refreshed)->version());
    }
  };
  hooks.gone = [this](const std::string& session, const std::string& reason) {
    Owned([&] {
      if (!rooms || rooms->Registration(session) == nullptr) return;
      DropSessionLocked(session, reason, Drop::kRegistry, RoomNow());
    });
  };
  KVRAIL_ASSIGN_OR_RETURN(registry_descriptors,
                          RegistryDescriptors::Start(endpoint, std::move(hooks)));
  return absl::OkStatus();
}

transport::DescriptorCache::Fetcher PrefillSidecar::WithRegistry(
    transport::DescriptorCache::Fetcher fallback) {
  // Under CURVE a descriptor must come from the session's own authenticated endpoint.
  if (options.registry.empty() || options.curve != nullptr) return fallback;
  return [this, fallback = std::move(fallback)](
             absl::string_view session) -> absl::StatusOr<v1::HandshakeDescriptor> {
    if (registry_descriptors) {
      if (auto found = registry_descriptors->Lookup(std::string(session))) return *found;
    }
    if (fallback) return fallback(session);
    return transport::FetchDescriptor(session, options.handshake_timeout);
  };
}

void DecodeSidecar::PublishDescriptor() {
  if (!registry_publisher) return;
  absl::StatusOr<v1::HandshakeDescriptor> descriptor = descriptor_source();
  if (descriptor.ok()) registry_publisher->Offer(*descriptor);
}

void DecodeSidecar::StopRegistry() {
  if (registry_publisher) registry_publisher->Stop();  // the entry goes at once
}

void PrefillSidecar::StopRegistry() {
  if (registry_descriptors) registry_descriptors->Stop();
}

}  // namespace kvrail::sidecar
