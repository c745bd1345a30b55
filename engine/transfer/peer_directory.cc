#include "engine/transfer/peer_directory.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/base/error.h"

namespace kvrail::transfer {

PeerDirectory::PeerDirectory(transport::Transport* transport,
                             transport::DescriptorCache* descriptors, PeerDirectoryOptions options)
    : transport_(transport), descriptors_(descriptors), options_(options) {}

absl::StatusOr<PeerLink> PeerDirectory::ConnectLocked(const std::string& session_id,
                                                      const v1::HandshakeDescriptor& descriptor) {
  KVRAIL_ASSIGN_OR_RETURN(PeerLink link, Dial(session_id, descriptor));
  links_[session_id] = link;
  ++connects_;
  return link;
}

absl::StatusOr<PeerLink> PeerDirectory::Dial(const std::string& session_id,
                                             const v1::HandshakeDescriptor& descriptor) {
  const std::string context = absl::StrCat("data-plane peer ", session_id);
  absl::StatusOr<transport::RemoteRegions> regions =
      transport::RemoteRegions::FromDescriptor(descriptor);
  if (!regions.ok()) return AddContext(regions.status(), context);
  absl::StatusOr<transport::PeerId> peer = transport_->Connect(descriptor);
  if (!peer.ok()) return AddContext(peer.status(), context);
  PeerLink link;
  link.session_id = session_id;
  link.peer = *peer;
  link.version = descriptor.version();
  link.cachepd_endpoint = descriptor.cachepd_endpoint();
  link.regions = std::make_shared<const transport::RemoteRegions>(*std::move(regions));
  return link;
}

absl::StatusOr<PeerLink> PeerDirectory::Get(const std::string& session_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = links_.find(session_id);
    if (it != links_.end()) return it->second;
    auto failed = failures_.find(session_id);
    if (failed != failures_.end()) {
      if (absl::Now() < failed->second.until) return failed->second.status;
      failures_.erase(failed);
    }
  }
  // The fetch and the connect may take a while (a peer that does not answer costs its
  // timeout): not under the lock, so other sessions' lookups go on.
  absl::StatusOr<PeerLink> dialed = [&]() -> absl::StatusOr<PeerLink> {
    absl::Time started = absl::Now();
    absl::StatusOr<std::shared_ptr<const v1::HandshakeDescriptor>> descriptor =
        descriptors_->Get(session_id);
    if (options_.on_fetch) options_.on_fetch(absl::Now() - started, descriptor.status());
    if (!descriptor.ok()) return descriptor.status();
    started = absl::Now();
    absl::StatusOr<PeerLink> link = Dial(session_id, **descriptor);
    if (options_.on_connect) options_.on_connect(absl::Now() - started, link.status());
    return link;
  }();
  std::unique_lock<std::mutex> lock(mu_);
  if (!dialed.ok()) {
    if (options_.retry_after > absl::ZeroDuration()) {
      failures_[session_id] = Failure{
          AddContext(dialed.status(),
                     absl::StrCat("(remembered for ", absl::FormatDuration(options_.retry_after),
                                  " after it failed)")),
          absl::Now() + options_.retry_after};
    }
    return dialed.status();
  }
  auto it = links_.find(session_id);
  if (it != links_.end()) {  // another thread connected meanwhile: keep that one
    const PeerLink kept = it->second;
    lock.unlock();
    (void)transport_->Disconnect(dialed->peer);
    return kept;
  }
  links_[session_id] = *dialed;
  ++connects_;
  return *dialed;
}

absl::StatusOr<PeerLink> PeerDirectory::Refresh(const std::string& session_id,
                                                bool connection_failed) {
  absl::StatusOr<std::shared_ptr<const v1::HandshakeDescriptor>> descriptor =
      descriptors_->Refresh(session_id);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = links_.find(session_id);
  if (!descriptor.ok()) {
    if (connection_failed && it != links_.end()) {
      (void)transport_->Disconnect(it->second.peer);
      links_.erase(it);
    }
    return descriptor.status();
  }
  if (it != links_.end()) {
    if (!connection_failed && it->second.version == (*descriptor)->version()) return it->second;
    (void)transport_->Disconnect(it->second.peer);
    links_.erase(it);
  }
  return ConnectLocked(session_id, **descriptor);
}

std::optional<transport::PeerId> PeerDirectory::Drop(const std::string& session_id) {
  PeerLink dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failures_.erase(session_id);
    auto it = links_.find(session_id);
    if (it == links_.end()) {
      descriptors_->Invalidate(session_id);
      return std::nullopt;
    }
    dropped = it->second;
    links_.erase(it);
  }
  (void)transport_->Disconnect(dropped.peer);  // NotFound if the scheduler disconnected it
  descriptors_->Invalidate(session_id);
  return dropped.peer;
}

size_t PeerDirectory::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return links_.size();
}

uint64_t PeerDirectory::connects() const {
  std::lock_guard<std::mutex> lock(mu_);
  return connects_;
}

}  // namespace kvrail::transfer
