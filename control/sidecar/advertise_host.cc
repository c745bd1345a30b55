#include "control/sidecar/advertise_host.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvrail::sidecar {
namespace {

// "[::1]" -> "::1": the form getifaddrs and inet_pton use.
std::string Unbracketed(absl::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::string(host);
}

bool IsLoopback(const std::string& address) {
  return absl::StartsWith(address, "127.") || address == "::1";
}

std::string AddressText(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text,
              sizeof(text));
  } else if (address->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, text,
              sizeof(text));
  }
  return text;
}

// The addresses `host` names: itself when it is an address, else what the resolver says.
absl::StatusOr<std::vector<std::string>> Resolve(const std::string& host) {
  in6_addr scratch;
  if (inet_pton(AF_INET, host.c_str(), &scratch) == 1 ||
      inet_pton(AF_INET6, host.c_str(), &scratch) == 1) {
    return std::vector<std::string>{host};
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int error = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (error != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--advertise-host ", host, " does not resolve (", gai_strerror(error),
                     "): peers must reach this sidecar at the address it advertises"));
  }
  std::vector<std::string> addresses;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const std::string text = AddressText(a->ai_addr);
    if (!text.empty() && std::find(addresses.begin(), addresses.end(), text) == addresses.end()) {
      addresses.push_back(text);
    }
  }
  freeaddrinfo(found);
  return addresses;
}

// A TCP connect to address:port, given up after `timeout`; OK once it is established.
absl::Status TryConnect(const std::string& address, int port, absl::Duration timeout) {
  sockaddr_storage storage{};
  socklen_t length = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
  if (inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    length = sizeof(*v4);
  } else if (inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    length = sizeof(*v6);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(address, " is not an IP address"));
  }
  const int fd = socket(storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(std::strerror(errno));
  int error = 0;
  if (connect(fd, reinterpret_cast<sockaddr*>(&storage), length) != 0) {
    error = errno;
    if (error == EINPROGRESS) {
      pollfd poll_fd{fd, POLLOUT, 0};
      const int ready = poll(&poll_fd, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
      socklen_t size = sizeof(error);
      if (ready == 1) {
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
      } else {
        error = ETIMEDOUT;
      }
    }
  }
  close(fd);
  if (error != 0) return absl::UnavailableError(std::strerror(error));
  return absl::OkStatus();
}

}  // namespace

bool IsWildcardHost(absl::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]" || host == "*";
}

absl::StatusOr<std::vector<std::string>> HostAddresses() {
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) {
    return absl::UnavailableError(
        absl::StrCat("getifaddrs: this host's addresses cannot be listed: ", std::strerror(errno)));
  }
  std::vector<std::string> addresses;
  for (ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0) continue;
    const std::string text = AddressText(i->ifa_addr);
    if (!text.empty() && std::find(addresses.begin(), addresses.end(), text) == addresses.end()) {
      addresses.push_back(text);
    }
  }
  freeifaddrs(interfaces);
  return addresses;
}

absl::StatusOr<std::string> ChooseAdvertiseHost(absl::string_view bind_host,
                                                absl::string_view advertise_host,
                                                const std::vector<std::string>& host_addresses) {
  if (!advertise_host.empty()) {
    if (IsWildcardHost(advertise_host)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--advertise-host ", advertise_host,
                       " binds every interface but names none: advertise an address peers reach"));
    }
    return std::string(advertise_host);
  }
  if (!IsWildcardHost(bind_host)) return std::string(bind_host);
  for (const bool v4_only : {true, false}) {
    for (const std::string& address : host_addresses) {
      if (IsLoopback(address) || absl::StartsWith(address, "fe80:")) continue;
      if (v4_only && address.find(':') != std::string::npos) continue;
      return address.find(':') == std::string::npos ? address : absl::StrCat("[", address, "]");
    }
  }
  return std::string("127.0.0.1");
}

absl::Status CheckAdvertiseHost(absl::string_view advertise, absl::string_view bind_host, int port,
                                const std::vector<std::string>& host_addresses,
                                absl::Duration timeout) {
  const std::string host = Unbracketed(advertise);
  absl::StatusOr<std::vector<std::string>> resolved = Resolve(host);
  if (!resolved.ok()) return resolved.status();
  const std::string bind = Unbracketed(bind_host);
  for (const std::string& address : *resolved) {
    const bool local =
        std::find(host_addresses.begin(), host_addresses.end(), address) != host_addresses.end();
    if (local && (IsWildcardHost(bind_host) || bind == address || bind == host)) {
      return absl::OkStatus();
    }
  }
  std::string failure;
  for (const std::string& address : *resolved) {
    const absl::Status reached = TryConnect(address, port, timeout);
    if (reached.ok()) return absl::OkStatus();
    absl::StrAppend(&failure, failure.empty() ? "" : "; ", address, ":", port, ": ",
                    reached.message());
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "--advertise-host ", advertise, " is neither an address of this host that --host ", bind_host,
      " binds (this host's addresses: ", absl::StrJoin(host_addresses, ", "),
      ") nor reachable from it (TCP connect to ", failure, " within ",
      absl::FormatDuration(timeout),
      "): peers told to reach this sidecar there could not; advertise an address they reach "
      "(in a container: the host's, with the ports published)"));
}

}  // namespace kvrail::sidecar
