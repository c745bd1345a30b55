// Connections to decode peers by CachePD session id: the prefill side of the data-plane
// handshake (engine/transport/handshake). A session's descriptor is fetched once and connected
// once; Refresh fetches again and reconnects when the peer's descriptor version changed or the
// caller saw the connection fail.
#ifndef KVRAIL_ENGINE_TRANSFER_PEER_DIRECTORY_H_
#define KVRAIL_ENGINE_TRANSFER_PEER_DIRECTORY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "engine/transport/bounds.h"
#include "engine/transport/handshake/handshake.h"
#include "engine/transport/transport.h"

namespace kvrail::transfer {

// A connected peer: what the scheduler needs to post to it.
struct PeerLink {
  std::string session_id;
  transport::PeerId peer = 0;
  uint64_t version = 0;  // of the descriptor connected to
  std::shared_ptr<const transport::RemoteRegions> regions;
};

class PeerDirectory {
 public:
  // Neither is owned; both must outlive the directory.
  PeerDirectory(transport::Transport* transport, transport::DescriptorCache* descriptors);

  // The link to `session_id`, fetching and connecting on first use. Errors name the session:
  // the fetch's (DeadlineExceeded when nobody answers) or the Connect's.
  absl::StatusOr<PeerLink> Get(const std::string& session_id);

  // Fetches the descriptor again. When its version differs from the connected one, or
  // `connection_failed`, disconnects the old peer id (its writes still in flight fail with
  // Cancelled) and connects anew. Returns the link in force afterwards.
  absl::StatusOr<PeerLink> Refresh(const std::string& session_id, bool connection_failed = false);

  // Disconnects and forgets `session_id` (its decode sidecar went away). No-op when unknown.
  void Drop(const std::string& session_id);

  // Connects made so far (first connections and reconnections).
  uint64_t connects() const;

 private:
  absl::StatusOr<PeerLink> ConnectLocked(const std::string& session_id,
                                         const v1::HandshakeDescriptor& descriptor);

  transport::Transport* transport_;
  transport::DescriptorCache* descriptors_;
  mutable std::mutex mu_;
  std::map<std::string, PeerLink> links_;
  uint64_t connects_ = 0;
};

}  // namespace kvrail::transfer

#endif  // KVRAIL_ENGINE_TRANSFER_PEER_DIRECTORY_H_
