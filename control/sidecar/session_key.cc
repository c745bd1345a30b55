#include "control/sidecar/session_key.h"

#include <sodium.h>

#include <cstdlib>
#include <utility>

#include "control/wire/byte_order.h"
#include "control/wire/proof.h"

namespace kvrail::sidecar {
namespace {

constexpr absl::string_view kLabel = "kvrail session key digest v1";

void InitSodium() {
  // Thread-safe and idempotent; fails only when the system has no random source at all.
  if (sodium_init() < 0) std::abort();
}

}  // namespace

SessionKey SessionKey::Generate() {
  InitSodium();
  std::string bytes(wire::kSessionKeyBytes, '\0');
  randombytes_buf(bytes.data(), bytes.size());
  return SessionKey(std::move(bytes));
}

std::string SessionKey::DigestOf(absl::string_view key) {
  InitSodium();
  std::string digest(crypto_generichash_BYTES, '\0');
  crypto_generichash_state state;
  crypto_generichash_init(&state, nullptr, 0, digest.size());
  crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(kLabel.data()),
                            kLabel.size());
  crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(key.data()), key.size());
  crypto_generichash_final(&state, reinterpret_cast<unsigned char*>(digest.data()), digest.size());
  return digest;
}

std::string SessionKey::Tag(absl::string_view key, absl::Span<const std::string> frames) {
  InitSodium();
  std::string tag(crypto_generichash_BYTES, '\0');
  crypto_generichash_state state;
  crypto_generichash_init(&state, reinterpret_cast<const unsigned char*>(key.data()), key.size(),
                          tag.size());
  for (const std::string& frame : frames) {
    const std::string length = wire::EncodeLittleEndian64(frame.size());
    crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(length.data()),
                              length.size());
    crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(frame.data()),
                              frame.size());
  }
  crypto_generichash_final(&state, reinterpret_cast<unsigned char*>(tag.data()), tag.size());
  return tag;
}

bool SessionKey::TagMatches(absl::string_view key, absl::Span<const std::string> frames,
                            absl::string_view tag) {
  const std::string expected = Tag(key, frames);
  return tag.size() == expected.size() &&
         sodium_memcmp(expected.data(), tag.data(), expected.size()) == 0;
}

bool SessionKey::Matches(absl::string_view key, absl::string_view digest) {
  const std::string expected = DigestOf(key);
  return digest.size() == expected.size() &&
         sodium_memcmp(expected.data(), digest.data(), expected.size()) == 0;
}

}  // namespace kvrail::sidecar
