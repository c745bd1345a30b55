// Connections to decode peers by CachePD session id: the prefill side of the data-plane
// handshake (engine/transport/handshake). A session's descriptor is fetched once and connected
// once; Refresh fetches again and reconnects when the peer's descriptor version changed or the
// caller saw the connection fail.
#ifndef KVRAIL_ENGINE_TRANSFER_PEER_DIRECTORY_H_
#define KVRAIL_ENGINE_TRANSFER_PEER_DIRECTORY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
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
  // The descriptor's cachepd_endpoint: the CachePD socket its owner registers with.
  std::string cachepd_endpoint;
};

struct PeerDirectoryOptions {
  // After a session's fetch or connect failed, Get answers with that failure at once for this
  // long instead of trying again: rooms queued behind a dead peer fail at once, not one
  // handshake timeout each. Zero remembers nothing.
  absl::Duration retry_after = absl::Seconds(2);
  // When set, called after each descriptor fetch and each Connect that Get makes (not for a
  // link it has already), on the caller's thread with no lock held: how long it took and how
  // it ended. For metrics: must be quick.
  std::function<void(absl::Duration, const absl::Status&)> on_fetch;
  std::function<void(absl::Duration, const absl::Status&)> on_connect;
};

class PeerDirectory {
 public:
  // Neither is owned; both must outlive the directory.
  PeerDirectory(transport::Transport* transport, transport::DescriptorCache* descriptors,
                PeerDirectoryOptions options = {});

  // The link to `session_id`, fetching and connecting on first use; both run without the
  // directory's lock, so a peer that does not answer delays only its own callers. Errors name
  // the session: the fetch's (DeadlineExceeded when nobody answers) or the Connect's, and for
  // retry_after after one, the same error at once.
  absl::StatusOr<PeerLink> Get(const std::string& session_id);

  // Fetches the descriptor again. When its version differs from the connected one, or
  // `connection_failed`, disconnects the old peer id (its writes still in flight fail with
  // Cancelled) and connects anew. Returns the link in force afterwards.
  absl::StatusOr<PeerLink> Refresh(const std::string& session_id, bool connection_failed = false);

  // Disconnects and forgets `session_id` (its decode sidecar went away, or its connection
  // failed), and forgets its descriptor and any remembered failure. Returns the peer id it
  // disconnected, if it had one (the scheduler may then forget it too).
  std::optional<transport::PeerId> Drop(const std::string& session_id);

  // Sessions connected.
  size_t size() const;

  // Connects made so far (first connections and reconnections).
  uint64_t connects() const;

 private:
  absl::StatusOr<PeerLink> ConnectLocked(const std::string& session_id,
                                         const v1::HandshakeDescriptor& descriptor);
  // Connects to `descriptor`; takes no lock of the directory's.
  absl::StatusOr<PeerLink> Dial(const std::string& session_id,
                                const v1::HandshakeDescriptor& descriptor);

  transport::Transport* transport_;
  transport::DescriptorCache* descriptors_;
  const PeerDirectoryOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, PeerLink> links_;
  struct Failure {
    absl::Status status;
    absl::Time until;
  };
  std::map<std::string, Failure> failures_;
  uint64_t connects_ = 0;
};

}  // namespace kvrail::transfer

#endif  // KVRAIL_ENGINE_TRANSFER_PEER_DIRECTORY_H_
