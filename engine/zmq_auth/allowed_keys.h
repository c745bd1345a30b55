// The public keys a peer accepts (docs/SECURITY.md, "Authentication (CURVE)"): every *.pub file
// of one directory (key_file.h), each bound to its role, rank and name.
#ifndef KVRAIL_ENGINE_ZMQ_AUTH_ALLOWED_KEYS_H_
#define KVRAIL_ENGINE_ZMQ_AUTH_ALLOWED_KEYS_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/zmq_auth/key_file.h"

namespace kvrail::zmq_auth {

class AllowedKeys {
 public:
  // Reads every *.pub of `dir` (other files are ignored, so a peer's own .key may sit beside
  // them). Fails naming the file for one that does not parse, and refuses a public key listed
  // twice with different identities (one key must mean one role and rank), or two keys under
  // one name. An empty directory is refused too: it would let nobody in.
  static absl::StatusOr<AllowedKeys> LoadDirectory(const std::string& dir);
  // The same rules over keys already read; `source` names them in errors.
  static absl::StatusOr<AllowedKeys> FromKeys(const std::vector<KeyFile>& keys,
                                              absl::string_view source = "allowed keys");

  // The identity bound to `public_key` (Z85), or nullptr.
  const KeyIdentity* Find(absl::string_view public_key) const;
  // The identity bound to a 32-byte binary key (a ZAP request's CURVE credential), or nullptr.
  const KeyIdentity* FindBinary(absl::string_view key_bytes) const;

  // The public key (Z85) listed for `identity` (names are unique), or nullopt.
  std::optional<std::string> PublicKeyOf(const KeyIdentity& identity) const;

  size_t size() const { return by_key_.size(); }

 private:
  std::map<std::string, KeyIdentity, std::less<>> by_key_;  // Z85 -> identity
};

}  // namespace kvrail::zmq_auth

#endif  // KVRAIL_ENGINE_ZMQ_AUTH_ALLOWED_KEYS_H_
