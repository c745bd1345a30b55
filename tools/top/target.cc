#include "tools/top/target.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace kvrail::top {
namespace {

absl::Status BadTarget(absl::string_view text, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat("endpoint '", text, "': ", rule));
}

}  // namespace

absl::StatusOr<Target> ParseTarget(absl::string_view text) {
  constexpr char kRule[] = "expected host:port or http://host:port/path";
  Target target;
  target.name = std::string(text);
  absl::string_view rest = text;
  if (absl::StartsWith(rest, "https://")) {
    return BadTarget(text, "https is not supported (metrics are served over http)");
  }
  const bool url = absl::ConsumePrefix(&rest, "http://");
  const size_t slash = rest.find('/');
  if (slash != absl::string_view::npos) {
    if (!url) return BadTarget(text, kRule);
    target.path = std::string(rest.substr(slash));
    rest = rest.substr(0, slash);
  }
  const size_t colon = rest.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return BadTarget(text, kRule);
  absl::string_view host = rest.substr(0, colon);
  if (absl::StartsWith(host, "[")) {
    if (!absl::EndsWith(host, "]") || host.size() < 3) return BadTarget(text, kRule);
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != absl::string_view::npos) {
    return BadTarget(text, "an IPv6 address goes in brackets: [::1]:9100");
  }
  int port = 0;
  if (!absl::SimpleAtoi(rest.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return BadTarget(text, "the port must be a number from 1 to 65535");
  }
  target.host = std::string(host);
  target.port = port;
  return target;
}

}  // namespace kvrail::top
