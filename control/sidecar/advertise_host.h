// The address a sidecar tells its peers (`--advertise-host`), apart from the one it binds
// (`--host`): in its registration with the bootstrap server, its registration frames and, on a
// decode, its session id and descriptor. A sidecar in a container binds the container's address
// (or 0.0.0.0) and must advertise one its peers can reach; one that advertises an address
// nobody reaches fails every room it is part of, far from the cause (SGLang #23342), so the
// address is checked when the sidecar starts.
#ifndef KVRAIL_CONTROL_SIDECAR_ADVERTISE_HOST_H_
#define KVRAIL_CONTROL_SIDECAR_ADVERTISE_HOST_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kvrail::sidecar {

// True for the hosts that bind every interface: "0.0.0.0", "::", "[::]", "*" and "".
bool IsWildcardHost(absl::string_view host);

// The IP addresses of this host's interfaces that are up (getifaddrs), as text ("127.0.0.1",
// "10.0.0.5", "fe80::1"), loopback included.
absl::StatusOr<std::vector<std::string>> HostAddresses();

// The address to advertise, from the flags: `advertise_host` when given, else `bind_host`,
// else (a wildcard bind) the first IPv4 address of `host_addresses` that is not loopback, else
// the first that is not loopback at all, else 127.0.0.1. Pure. InvalidArgument when the
// advertised host is itself a wildcard, which no peer can reach.
absl::StatusOr<std::string> ChooseAdvertiseHost(absl::string_view bind_host,
                                                absl::string_view advertise_host,
                                                const std::vector<std::string>& host_addresses);

// Checks that peers can reach `advertise` at `port`, a port this process listens on at
// `bind_host`: `advertise` (or, for a name, one of its addresses) is one of `host_addresses` and
// the bind covers it (a wildcard bind, or the same address), or else a TCP connect from here to
// advertise:port succeeds within `timeout`. FailedPrecondition otherwise, in one line naming
// the address, this host's addresses and the rule.
absl::Status CheckAdvertiseHost(absl::string_view advertise, absl::string_view bind_host, int port,
                                const std::vector<std::string>& host_addresses,
                                absl::Duration timeout);

}  // namespace kvrail::sidecar

#endif  // KVRAIL_CONTROL_SIDECAR_ADVERTISE_HOST_H_
