#include "control/sidecar/liveness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvrail::sidecar {

Reach ProbeTcp(const std::string& host, int port, absl::Duration timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::string name = host;
  if (name.size() > 2 && name.front() == '[' && name.back() == ']') {
    name = name.substr(1, name.size() - 2);
  }
  if (getaddrinfo(name.c_str(), absl::StrCat(port).c_str(), &hints, &found) != 0) {
    return Reach::kUnknown;
  }
  Reach reach = Reach::kUnknown;
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    if (connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
      reach = Reach::kListening;
    } else if (errno == ECONNREFUSED) {
      reach = Reach::kRefused;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
      if (poll(&p, 1, ms) == 1) {
        int error = 0;
        socklen_t length = sizeof(error);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
        reach = error == 0              ? Reach::kListening
                : error == ECONNREFUSED ? Reach::kRefused
                                        : Reach::kUnknown;
      }
    }
    close(fd);
  }
  freeaddrinfo(found);
  return reach;
}

Reach ProbeEndpoint(const std::string& endpoint, absl::Duration timeout) {
  std::string address = endpoint;
  if (absl::StartsWith(address, "tcp://")) address = address.substr(6);
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 1 || port > 65535) {
    return Reach::kUnknown;
  }
  return ProbeTcp(address.substr(0, colon), port, timeout);
}

}  // namespace kvrail::sidecar
