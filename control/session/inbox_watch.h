// Says when ZeroMQ cuts a peer's connection to an inbox, which it otherwise does in silence.
//
// A PULL socket with ZMQ_MAXMSGSIZE drops a peer that announces a larger frame by closing its
// connection, and so it does for a peer that breaks ZMTP (a plain socket writing garbage, a
// failed handshake): no message reaches the application and no error is returned, so the
// refusal would go unlogged (issue 12: "a 64 MiB frame was dropped without a log line").
// ZeroMQ's monitor reports only that a connection closed, the same event as when a peer closes
// its own socket. The watch tells the two apart: it keeps a duplicate of each accepted
// connection's descriptor, and when ZeroMQ reports the connection closed it peeks at that
// duplicate. A peer that closed its socket has sent FIN (the peek reads end of stream); a peer
// that ZeroMQ cut is still there, usually with the rest of its oversized frame unread.
//
// One thread per watched inbox, polling the monitor every 100 ms; a duplicate is held from
// ZeroMQ's accept until it reports the close, so a connection costs two descriptors meanwhile.
#ifndef KVRAIL_CONTROL_SESSION_INBOX_WATCH_H_
#define KVRAIL_CONTROL_SESSION_INBOX_WATCH_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace kvrail::session {

// A peer's connection ZeroMQ cut: the peer's "host:port" and why, in words.
using OnConnectionCut = std::function<void(const std::string& peer, const std::string& why)>;

class InboxWatch {
 public:
  // Starts watching `socket` (a libzmq socket bound on tcp `port`, of `context`). Must be called
  // by the thread that owns the socket, before the socket is used elsewhere. `on_cut` runs on
  // the watch's thread. `max_frame_bytes` only words the reason.
  static absl::StatusOr<std::unique_ptr<InboxWatch>> Start(void* context, void* socket,
                                                           uint16_t port, int64_t max_frame_bytes,
                                                           OnConnectionCut on_cut);
  // Stops the thread and closes the duplicates. Call before the socket closes, so that its own
  // close is not reported.
  ~InboxWatch();
  InboxWatch(const InboxWatch&) = delete;
  InboxWatch& operator=(const InboxWatch&) = delete;

 private:
  InboxWatch() = default;
  void Run(void* monitor);

  uint16_t port_ = 0;
  int64_t max_frame_bytes_ = 0;
  OnConnectionCut on_cut_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kvrail::session

#endif  // KVRAIL_CONTROL_SESSION_INBOX_WATCH_H_
