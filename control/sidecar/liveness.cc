#include "control/sidecar/liveness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvrail::sidecar {

namespace {

// A connection attempt under way: the socket, or the answer already known.
struct Attempt {
  int fd = -1;
  Reach reach = Reach::kUnknown;
};

// Starts a non-blocking connect to host:port; an attempt with no fd is already answered.
Attempt StartConnect(const std::string& host, int port) {
  Attempt attempt;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::string name = host;
  if (name.size() > 2 && name.front() == '[' && name.back() == ']') {
    name = name.substr(1, name.size() - 2);
  }
  if (getaddrinfo(name.c_str(), absl::StrCat(port).c_str(), &hints, &found) != 0) return attempt;
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    if (connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
      attempt.reach = Reach::kListening;
      close(fd);
    } else if (errno == EINPROGRESS) {
      attempt.fd = fd;
    } else {
      if (errno == ECONNREFUSED) attempt.reach = Reach::kRefused;
      close(fd);
    }
  }
  freeaddrinfo(found);
  return attempt;
}

// How a connect that became writable ended.
Reach Finished(int fd) {
  int error = 0;
  socklen_t length = sizeof(error);
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
  return error == 0 ? Reach::kListening : error == ECONNREFUSED ? Reach::kRefused : Reach::kUnknown;
}

// Waits for every attempt with a socket, all at once, until `timeout` has passed; closes them.
void Settle(std::vector<Attempt>& attempts, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    std::vector<pollfd> waiting;
    std::vector<size_t> which;
    for (size_t i = 0; i < attempts.size(); ++i) {
      if (attempts[i].fd < 0) continue;
      waiting.push_back({attempts[i].fd, POLLOUT, 0});
      which.push_back(i);
    }
    const absl::Duration left = deadline - absl::Now();
    if (waiting.empty() || left <= absl::ZeroDuration()) break;
    const int ms =
        static_cast<int>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))));
    if (poll(waiting.data(), waiting.size(), ms) < 0 && errno != EINTR) break;
    for (size_t k = 0; k < waiting.size(); ++k) {
      if (waiting[k].revents == 0) continue;
      Attempt& attempt = attempts[which[k]];
      attempt.reach = Finished(attempt.fd);
      close(attempt.fd);
      attempt.fd = -1;
    }
  }
  for (Attempt& attempt : attempts) {
    if (attempt.fd >= 0) close(attempt.fd);  // no answer in time: kUnknown
    attempt.fd = -1;
  }
}

// "tcp://host:port" or "host:port" as (host, port); port 0 when it does not parse.
std::pair<std::string, int> SplitEndpoint(const std::string& endpoint) {
  std::string address = endpoint;
  if (absl::StartsWith(address, "tcp://")) address = address.substr(6);
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 1 || port > 65535) {
    return {"", 0};
  }
  return {address.substr(0, colon), port};
}

}  // namespace

Reach ProbeTcp(const std::string& host, int port, absl::Duration timeout) {
  std::vector<Attempt> attempts = {StartConnect(host, port)};
  Settle(attempts, timeout);
  return attempts[0].reach;
}

Reach ProbeEndpoint(const std::string& endpoint, absl::Duration timeout) {
  return ProbeEndpoints({endpoint}, timeout)[0];
}

std::vector<Reach> ProbeEndpoints(const std::vector<std::string>& endpoints,
                                  absl::Duration timeout) {
  std::vector<Attempt> attempts;
  attempts.reserve(endpoints.size());
  for (const std::string& endpoint : endpoints) {
    const auto [host, port] = SplitEndpoint(endpoint);
    attempts.push_back(port == 0 ? Attempt{} : StartConnect(host, port));
  }
  Settle(attempts, timeout);
  std::vector<Reach> out;
  out.reserve(attempts.size());
  for (const Attempt& attempt : attempts) out.push_back(attempt.reach);
  return out;
}

}  // namespace kvrail::sidecar
