#include "control/bootstrap/bearer_token.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kvrail::bootstrap {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

// Equal when every byte is; the loop runs over all of `expected` whatever `got` holds.
bool ConstantTimeEquals(absl::string_view got, absl::string_view expected) {
  volatile unsigned char difference = got.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < got.size() ? static_cast<unsigned char>(got[i]) : 0;
    difference = difference | (g ^ static_cast<unsigned char>(expected[i]));
  }
  return difference == 0;
}

}  // namespace

absl::Status ValidateBearerToken(absl::string_view token) {
  if (token.empty()) return absl::InvalidArgumentError("bootstrap token: is empty");
  if (token.size() > kMaxBearerTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat("bootstrap token: is ", token.size(),
                                                   " bytes, more than the ", kMaxBearerTokenBytes,
                                                   " a token may have"));
  }
  size_t padding = token.size();
  while (padding > 0 && token[padding - 1] == '=') --padding;
  for (size_t i = 0; i < padding; ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (!absl::ascii_isalnum(c) &&
        absl::string_view("-._~+/").find(static_cast<char>(c)) == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bootstrap token: byte ", i,
          " is not a b64token character (letters, digits, -._~+/, then = padding; RFC 6750 "
          "§2.1)"));
    }
  }
  if (padding == 0) return absl::InvalidArgumentError("bootstrap token: is only = padding");
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadBearerTokenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("token file ", path, ": cannot be read"));
  std::ostringstream content;
  content << in.rdbuf();
  const std::string token(absl::StripAsciiWhitespace(content.str()));
  absl::Status valid = ValidateBearerToken(token);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": ", valid.message()));
  }
  return token;
}

std::string BearerAuthorization(absl::string_view token) { return absl::StrCat(kBearer, token); }

bool AuthorizationCarries(absl::string_view authorization, absl::string_view token) {
  if (authorization.size() < kBearer.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kBearer.size()), kBearer)) {
    return false;
  }
  return ConstantTimeEquals(authorization.substr(kBearer.size()), token);
}

}  // namespace kvrail::bootstrap
