// CURVE key files (docs/SECURITY.md, "Authentication (CURVE)"): who a ZeroMQ peer is, and the
// files `kvrail keygen` writes.
//
//   NAME.key  {"role": "decode", "rank": 3, "name": "decode-3", "public": "<Z85>",
//              "secret": "<Z85>"}   mode 0600: the peer's own keypair
//   NAME.pub  the same without "secret": what other peers list in their allowed directory
//
// A key is bound to a role and a rank, so that the holder of decode 3's key cannot speak as
// prefill 1: the ZAP handler (zap_handler.h) sets each authenticated connection's ZeroMQ
// User-Id to "<role>:<rank>:<name>", and the receiver checks it against what the message
// claims. Keys are CURVE's (Curve25519), 32 bytes, written in Z85 (40 characters, ZMQ RFC 32).
#ifndef KVRAIL_ENGINE_ZMQ_AUTH_KEY_FILE_H_
#define KVRAIL_ENGINE_ZMQ_AUTH_KEY_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::zmq_auth {

enum class KeyRole { kPrefill, kDecode, kEngine };

// "prefill", "decode", "engine".
absl::string_view RoleName(KeyRole role);
// The inverse of RoleName; InvalidArgument naming the role otherwise.
absl::StatusOr<KeyRole> ParseRole(absl::string_view name);

// The largest rank a key may carry (CACHEPD's ranks fit in 0..1023; a bootstrap world in 2^20).
inline constexpr int kMaxKeyRank = 1 << 20;
// Z85 text of a 32-byte CURVE key.
inline constexpr size_t kZ85KeyChars = 40;

struct KeyIdentity {
  KeyRole role = KeyRole::kDecode;
  // Prefill: the rank its status frames carry (its rank within its DP group, stage-major:
  // pp_rank * tp_size + tp_rank, CACHEPD §3.4, §10.1). Decode: its attention TP rank (the
  // registration's frame 7). Engine: the rank of the sidecar it drives.
  int rank = 0;
  std::string name;  // 1..64 of [A-Za-z0-9._-]; defaults to "<role>-<rank>"
};

bool operator==(const KeyIdentity& a, const KeyIdentity& b);
inline bool operator!=(const KeyIdentity& a, const KeyIdentity& b) { return !(a == b); }

// "<role>:<rank>:<name>", the User-Id the ZAP handler gives an authenticated connection.
std::string UserId(const KeyIdentity& identity);
// The inverse of UserId; InvalidArgument naming the text otherwise.
absl::StatusOr<KeyIdentity> ParseUserId(absl::string_view user_id);

struct KeyFile {
  KeyIdentity identity;
  std::string public_key;  // Z85, kZ85KeyChars
  std::string secret_key;  // Z85, kZ85KeyChars; empty in a .pub file
};

// Whether `z85` is 40 characters that decode to 32 bytes. InvalidArgument naming `what` and
// the rule otherwise.
absl::Status CheckZ85Key(absl::string_view z85, absl::string_view what);

// Parses the JSON text of a key file read from `path` (named in every error with the rule it
// broke). `want_secret`: a .key file, which must hold "secret", whose public half must be
// "public"; otherwise a .pub file, which must not. Unknown members are refused.
absl::StatusOr<KeyFile> ParseKeyFile(absl::string_view text, absl::string_view path,
                                     bool want_secret);

// Reads a .pub file.
absl::StatusOr<KeyFile> ReadPublicKeyFile(const std::string& path);
// Reads a .key file; refused (PermissionDenied) when group or others may read or write it, as
// ssh refuses such a private key.
absl::StatusOr<KeyFile> ReadSecretKeyFile(const std::string& path);

// A fresh keypair for `identity` (zmq_curve_keypair). An empty name becomes "<role>-<rank>".
absl::StatusOr<KeyFile> GenerateKeyFile(KeyIdentity identity);

// Writes dir/NAME.key (mode 0600) and dir/NAME.pub (0644) for `key`; never overwrites a file
// (AlreadyExists naming it). Returns the path of the .key file.
absl::StatusOr<std::string> WriteKeyFiles(const std::string& dir, const KeyFile& key);

}  // namespace kvrail::zmq_auth

#endif  // KVRAIL_ENGINE_ZMQ_AUTH_KEY_FILE_H_
