#include "control/sidecar/descriptor_registry.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "control/registry/keys.h"

namespace kvrail::sidecar {

absl::StatusOr<std::unique_ptr<DescriptorPublisher>> DescriptorPublisher::Start(
    const std::string& endpoint, absl::Duration ttl, std::string session_id, int tp_rank) {
  auto leased = registry::LeasePublisher::Start(endpoint, ttl);
  if (!leased.ok()) return leased.status();
  auto publisher = std::unique_ptr<DescriptorPublisher>(new DescriptorPublisher());
  publisher->leased_ = *std::move(leased);
  publisher->session_id_ = std::move(session_id);
  publisher->tp_rank_ = tp_rank;
  return publisher;
}

void DescriptorPublisher::Offer(const v1::HandshakeDescriptor& descriptor) {
  std::string bytes;
  if (!descriptor.SerializeToString(&bytes)) return;
  registry::SessionEntry entry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes == published_) return;
    published_ = bytes;
    entry.version = ++version_;
  }
  entry.descriptor = std::move(bytes);
  entry.tp_rank = tp_rank_;
  entry.lease_ttl_s = absl::ToInt64Seconds(leased_->ttl());
  leased_->Publish(registry::SessionKey(session_id_), registry::EncodeSessionEntry(entry));
  spdlog::info("decode: registry entry {} published version={}", registry::SessionKey(session_id_),
               entry.version);
}

absl::StatusOr<std::unique_ptr<RegistryDescriptors>> RegistryDescriptors::Start(
    const std::string& endpoint, Hooks hooks) {
  auto descriptors = std::unique_ptr<RegistryDescriptors>(new RegistryDescriptors());
  descriptors->hooks_ = std::move(hooks);
  auto watcher = registry::PrefixWatcher::Start(
      endpoint, std::string(registry::kSessionsPrefix),
      [raw = descriptors.get()](const registry::WatchEvent& event) { raw->OnEvent(event); });
  if (!watcher.ok()) return watcher.status();
  descriptors->watcher_ = *std::move(watcher);
  return descriptors;
}

RegistryDescriptors::~RegistryDescriptors() { Stop(); }

void RegistryDescriptors::Stop() {
  if (watcher_) watcher_->Stop();
}

std::optional<v1::HandshakeDescriptor> RegistryDescriptors::Lookup(const std::string& session) {
  std::optional<v1::HandshakeDescriptor> found;
  int64_t version = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(session);
    if (it == entries_.end()) return std::nullopt;
    found = it->second.descriptor;
    version = it->second.version;
  }
  hits_.fetch_add(1);
  // Logged outside mu_, which the watcher's thread needs: a write to a full stderr pipe blocks.
  spdlog::info(
      "prefill: descriptor of session {} taken from the registry (version {}), no "
      "handshake",
      session, version);
  return found;
}

void RegistryDescriptors::OnEvent(const registry::WatchEvent& event) {
  const std::string session = registry::SessionIdOfKey(event.key);
  if (session.empty()) return;
  if (event.type == registry::WatchEvent::Type::kDelete) {
    int64_t ttl = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = entries_.find(session);
      if (it == entries_.end()) return;
      ttl = it->second.lease_ttl_s;
      entries_.erase(it);
    }
    if (hooks_.gone) {
      hooks_.gone(session, absl::StrCat("decode session ", session, "'s registry entry ", event.key,
                                        " expired or was revoked",
                                        ttl > 0 ? absl::StrCat(" (lease ttl ", ttl, " s)") : "",
                                        ": the sidecar stopped renewing it"));
    }
    return;
  }
  auto entry = registry::DecodeSessionEntry(event.key, event.value);
  v1::HandshakeDescriptor descriptor;
  if (entry.ok() && !descriptor.ParseFromString(entry->descriptor)) {
    entry = absl::InvalidArgumentError(absl::StrCat(
        "registry entry ", event.key, ": \"descriptor\" is not a HandshakeDescriptor"));
  }
  if (!entry.ok()) {
    spdlog::warn("prefill: {}; ignored", std::string(entry.status().message()));
    return;
  }
  bool changed = false;
  bool learned = false;
  const int64_t version = entry->version;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& known = entries_[session];
    learned = known.version == 0;
    changed = known.version != 0 && known.version != version;
    known.descriptor = std::move(descriptor);
    known.version = version;
    known.lease_ttl_s = entry->lease_ttl_s;
  }
  // Once per session (and per change): from here on a room of it takes no handshake.
  if (learned || changed) {
    spdlog::info("prefill: descriptor of session {} read from the registry (version {})", session,
                 version);
  }
  if (changed && hooks_.changed) hooks_.changed(session);
}

}  // namespace kvrail::sidecar
