#include "control/session/inbox_watch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/sync/thread_name.h"

namespace kvrail::session {
namespace {

// "host:port" of a socket address; empty when it is not IPv4 or IPv6.
std::string AddressText(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&address);
    if (inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host)) == nullptr) return "";
    return absl::StrCat(host, ":", ntohs(in->sin_port));
  }
  if (address.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&address);
    if (inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host)) == nullptr) return "";
    return absl::StrCat("[", host, "]:", ntohs(in6->sin6_port));
  }
  return "";
}

uint16_t LocalPort(int fd) {
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0) return 0;
  if (local.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
  if (local.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port);
  }
  return 0;
}

struct Connection {
  int copy = -1;     // our duplicate of ZeroMQ's descriptor
  std::string peer;  // "host:port"
};

}  // namespace

absl::StatusOr<std::unique_ptr<InboxWatch>> InboxWatch::Start(void* context, void* socket,
                                                              uint16_t port,
                                                              int64_t max_frame_bytes,
                                                              OnConnectionCut on_cut) {
  std::unique_ptr<InboxWatch> watch(new InboxWatch());
  watch->port_ = port;
  watch->max_frame_bytes_ = max_frame_bytes;
  watch->on_cut_ = std::move(on_cut);
  const std::string address = absl::StrCat("inproc://kvrail-inbox-watch-", port, "-",
                                           reinterpret_cast<uintptr_t>(watch.get()));
  // Handshakes that broke the protocol (garbage, another security mechanism), not those whose
  // connection merely closed (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL: a liveness probe's connect
  // and close looks so), nor a key that ZAP refused (the ZAP handler logs that).
  const int events = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED |
                     ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
  if (zmq_socket_monitor(socket, address.c_str(), events) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot monitor the inbox on port ", port, ": ", zmq_strerror(zmq_errno())));
  }
  void* monitor = zmq_socket(context, ZMQ_PAIR);
  if (monitor == nullptr || zmq_connect(monitor, address.c_str()) != 0) {
    const int error = zmq_errno();
    if (monitor != nullptr) zmq_close(monitor);
    zmq_socket_monitor(socket, nullptr, 0);
    return absl::InternalError(
        absl::StrCat("cannot read the inbox's monitor on port ", port, ": ", zmq_strerror(error)));
  }
  // The thread owns the monitor socket from here on (thread creation orders the handover).
  watch->thread_ = std::thread([w = watch.get(), monitor] { w->Run(monitor); });
  NameThread(watch->thread_, "kvrail-inbwatch");
  return watch;
}

InboxWatch::~InboxWatch() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void InboxWatch::Run(void* monitor) {
  std::map<int, Connection> connections;  // by ZeroMQ's descriptor
  // Handshakes ZeroMQ reported failed whose connection's close has not come yet. The event
  // names no descriptor, but ZeroMQ closes that connection right after it: the next close is
  // taken as its, whether or not the peer has hung up by then (a peer whose mechanism does not
  // match often has).
  int failed_handshakes = 0;
  int refused_by_zap = 0;  // likewise, for keys ZAP refused: their close is not reported
  const int linger = 0;
  zmq_setsockopt(monitor, ZMQ_LINGER, &linger, sizeof(linger));
  const int timeout_ms = 100;
  zmq_setsockopt(monitor, ZMQ_RCVTIMEO, &timeout_ms, sizeof(timeout_ms));
  while (!stop_.load()) {
    // Frame 1: the event (uint16) and its value (uint32: the descriptor); frame 2: the endpoint.
    zmq_msg_t event;
    zmq_msg_init(&event);
    if (zmq_msg_recv(&event, monitor, 0) < 0) {
      zmq_msg_close(&event);
      if (zmq_errno() == EAGAIN || zmq_errno() == EINTR) continue;
      break;  // the context is terminating
    }
    uint16_t id = 0;
    uint32_t value = 0;
    const bool whole = zmq_msg_size(&event) == 6;
    if (whole) {
      std::memcpy(&id, zmq_msg_data(&event), sizeof(id));
      std::memcpy(&value, static_cast<const char*>(zmq_msg_data(&event)) + 2, sizeof(value));
    }
    const bool more = zmq_msg_more(&event);
    zmq_msg_close(&event);
    if (more) {
      zmq_msg_t endpoint;
      zmq_msg_init(&endpoint);
      zmq_msg_recv(&endpoint, monitor, 0);
      zmq_msg_close(&endpoint);
    }
    if (!whole) continue;
    const int fd = static_cast<int>(value);
    if (id == ZMQ_EVENT_ACCEPTED) {
      auto old = connections.find(fd);
      if (old != connections.end()) {
        close(old->second.copy);
        connections.erase(old);
      }
      // ZeroMQ may have closed the descriptor (and the number been reused) by now: keep the
      // duplicate only if it is still a connection to this inbox's port.
      const int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
      if (copy < 0) continue;
      sockaddr_storage peer{};
      socklen_t length = sizeof(peer);
      if (LocalPort(copy) != port_ ||
          getpeername(copy, reinterpret_cast<sockaddr*>(&peer), &length) != 0) {
        close(copy);
        continue;
      }
      connections[fd] = Connection{copy, AddressText(peer)};
    } else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
      ++failed_handshakes;
    } else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      ++refused_by_zap;
    } else if (id == ZMQ_EVENT_DISCONNECTED) {
      const bool handshake_failed = failed_handshakes > 0;
      if (handshake_failed) --failed_handshakes;
      const bool zap_refused = !handshake_failed && refused_by_zap > 0;
      if (zap_refused) --refused_by_zap;
      auto found = connections.find(fd);
      if (zap_refused) {
        if (found != connections.end()) {
          close(found->second.copy);
          connections.erase(found);
        }
        continue;
      }
      if (found == connections.end()) {
        // ZeroMQ closed it before its accept was read here (a handshake that failed at once):
        // its address is gone with it, but the refusal is still said.
        if (handshake_failed && !stop_.load()) {
          on_cut_("an unknown peer",
                  "cut by ZeroMQ: its handshake broke the protocol (a ZMTP error, or a security "
                  "mechanism other than this socket's)");
        }
        continue;
      }
      char byte = 0;
      const ssize_t peeked = recv(found->second.copy, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      const bool peer_closed =
          peeked == 0 || (peeked < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
      close(found->second.copy);
      const std::string peer = std::move(found->second.peer);
      connections.erase(found);
      if ((peer_closed && !handshake_failed) || stop_.load()) continue;
      // Bytes still unread make an oversized frame likely, but their absence proves nothing
      // (the sender may not have written the rest yet), so the reason names every cause.
      on_cut_(peer, handshake_failed
                        ? std::string("cut by ZeroMQ: its handshake broke the protocol (a ZMTP "
                                      "error, or a security mechanism other than this socket's)")
                        : absl::StrCat("cut by ZeroMQ: a frame over ", max_frame_bytes_,
                                       " bytes (ZMQ_MAXMSGSIZE), a ZMTP error or a failed "
                                       "handshake"));
    }
  }
  for (auto& [fd, connection] : connections) close(connection.copy);
  zmq_close(monitor);
}

}  // namespace kvrail::session
