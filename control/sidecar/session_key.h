// A decode sidecar's session key (control/wire/proof.h): 32 random bytes that prove a CachePD
// message naming the session came from it. Its digest goes into the session's handshake
// descriptor; the key itself travels only in owner proofs, on the decode's own PUSH routes.
// libsodium: randombytes_buf, BLAKE2b (crypto_generichash), sodium_memcmp.
#ifndef KVRAIL_CONTROL_SIDECAR_SESSION_KEY_H_
#define KVRAIL_CONTROL_SIDECAR_SESSION_KEY_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvrail::sidecar {

class SessionKey {
 public:
  // 32 bytes from the system's random source.
  static SessionKey Generate();

  const std::string& bytes() const { return bytes_; }
  std::string Digest() const { return DigestOf(bytes_); }

  // The digest a descriptor publishes for `key`: BLAKE2b-256 of a kvrail label and the key.
  static std::string DigestOf(absl::string_view key);
  // Whether `key` is the key behind `digest` (a 32-byte digest; in constant time).
  static bool Matches(absl::string_view key, absl::string_view digest);

  // The sender proof's tag of a status message (control/wire/proof.h): BLAKE2b-256 keyed with
  // `key` over the frames, each preceded by its length, so no two messages share a tag.
  static std::string Tag(absl::string_view key, absl::Span<const std::string> frames);
  // Whether `tag` is Tag(key, frames), in constant time.
  static bool TagMatches(absl::string_view key, absl::Span<const std::string> frames,
                         absl::string_view tag);

 private:
  explicit SessionKey(std::string bytes) : bytes_(std::move(bytes)) {}
  std::string bytes_;
};

}  // namespace kvrail::sidecar

#endif  // KVRAIL_CONTROL_SIDECAR_SESSION_KEY_H_
