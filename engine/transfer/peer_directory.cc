#include "engine/transfer/peer_directory.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "control/error/error.h"

namespace kvrail::transfer {

PeerDirectory::PeerDirectory(transport::Transport* transport,
                             transport::DescriptorCache* descriptors)
    : transport_(transport), descriptors_(descriptors) {}

absl::StatusOr<PeerLink> PeerDirectory::ConnectLocked(const std::string& session_id,
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
  link.regions = std::make_shared<const transport::RemoteRegions>(*std::move(regions));
  links_[session_id] = link;
  ++connects_;
  return link;
}

absl::StatusOr<PeerLink> PeerDirectory::Get(const std::string& session_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = links_.find(session_id);
    if (it != links_.end()) return it->second;
  }
  // The fetch may take a while: not under the lock.
  KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<const v1::HandshakeDescriptor> descriptor,
                          descriptors_->Get(session_id));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = links_.find(session_id);
  if (it != links_.end()) return it->second;  // another thread connected meanwhile
  return ConnectLocked(session_id, *descriptor);
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

void PeerDirectory::Drop(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = links_.find(session_id);
  if (it == links_.end()) return;
  (void)transport_->Disconnect(it->second.peer);
  links_.erase(it);
  descriptors_->Invalidate(session_id);
}

uint64_t PeerDirectory::connects() const {
  std::lock_guard<std::mutex> lock(mu_);
  return connects_;
}

}  // namespace kvrail::transfer
