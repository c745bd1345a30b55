#include "engine/zmq_auth/allowed_keys.h"

#include <dirent.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kvrail::zmq_auth {

absl::StatusOr<AllowedKeys> AllowedKeys::FromKeys(const std::vector<KeyFile>& keys,
                                                  absl::string_view source) {
  AllowedKeys allowed;
  std::map<std::string, std::string> key_of_name;
  for (const KeyFile& key : keys) {
    const std::string who = UserId(key.identity);
    auto [it, inserted] = allowed.by_key_.emplace(key.public_key, key.identity);
    if (!inserted && it->second != key.identity) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": public key ", key.public_key, " is listed as ", UserId(it->second), " and as ",
          who, ": one key must mean one role and rank"));
    }
    auto [named, fresh] = key_of_name.emplace(key.identity.name, key.public_key);
    if (!fresh && named->second != key.public_key) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": two public keys are named \"", key.identity.name, "\""));
    }
  }
  if (allowed.by_key_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": no public key (*.pub) to accept: nobody could connect"));
  }
  return allowed;
}

absl::StatusOr<AllowedKeys> AllowedKeys::LoadDirectory(const std::string& dir) {
  DIR* listing = opendir(dir.c_str());
  if (listing == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("allowed keys directory ", dir, ": cannot be read: ", std::strerror(errno)));
  }
  std::vector<std::string> names;
  while (const dirent* entry = readdir(listing)) {
    if (absl::EndsWith(entry->d_name, ".pub")) names.emplace_back(entry->d_name);
  }
  closedir(listing);
  std::sort(names.begin(), names.end());  // errors name the same file every run
  std::vector<KeyFile> keys;
  for (const std::string& name : names) {
    absl::StatusOr<KeyFile> key = ReadPublicKeyFile(absl::StrCat(dir, "/", name));
    if (!key.ok()) return key.status();
    keys.push_back(*std::move(key));
  }
  return FromKeys(keys, absl::StrCat("allowed keys directory ", dir));
}

const KeyIdentity* AllowedKeys::Find(absl::string_view public_key) const {
  auto it = by_key_.find(public_key);
  return it == by_key_.end() ? nullptr : &it->second;
}

std::optional<std::string> AllowedKeys::PublicKeyOf(const KeyIdentity& identity) const {
  for (const auto& [key, listed] : by_key_) {
    if (listed == identity) return key;
  }
  return std::nullopt;
}

const KeyIdentity* AllowedKeys::FindBinary(absl::string_view key_bytes) const {
  if (key_bytes.size() != 32) return nullptr;
  char z85[kZ85KeyChars + 1];
  if (zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(key_bytes.data()), 32) == nullptr) {
    return nullptr;
  }
  return Find(z85);
}

}  // namespace kvrail::zmq_auth
