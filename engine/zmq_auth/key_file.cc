#include "engine/zmq_auth/key_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace kvrail::zmq_auth {
namespace {

using nlohmann::json;

constexpr size_t kMaxNameChars = 64;
constexpr size_t kMaxKeyFileBytes = 4096;

absl::Status NameOk(absl::string_view name, absl::string_view what) {
  if (name.empty() || name.size() > kMaxNameChars) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": name \"", name, "\" must be 1 to 64 characters"));
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": name \"", name, "\" may hold only letters, digits, '.', '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

absl::Status RankOk(int64_t rank, absl::string_view what) {
  if (rank < 0 || rank > kMaxKeyRank) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", rank, " is outside 0..", kMaxKeyRank));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("key file ", path, ": cannot be read: ", std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().size() > kMaxKeyFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key file ", path, ": larger than ", kMaxKeyFileBytes, " bytes"));
  }
  return text.str();
}

std::string KeyJson(const KeyFile& key, bool with_secret) {
  nlohmann::ordered_json body;
  body["role"] = std::string(RoleName(key.identity.role));
  body["rank"] = key.identity.rank;
  body["name"] = key.identity.name;
  body["public"] = key.public_key;
  if (with_secret) body["secret"] = key.secret_key;
  return body.dump(2) + "\n";
}

absl::Status WriteNew(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == EEXIST) {
      return absl::AlreadyExistsError(
          absl::StrCat(path, " exists: kvrail keygen never overwrites a key"));
    }
    return absl::UnavailableError(absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  // The umask may have narrowed the mode; a .pub is meant to be readable.
  bool ok = fchmod(fd, mode) == 0;
  size_t written = 0;
  while (ok && written < text.size()) {
    const ssize_t n = write(fd, text.data() + written, text.size() - written);
    if (n <= 0) {
      ok = false;
      break;
    }
    written += static_cast<size_t>(n);
  }
  ok = close(fd) == 0 && ok;
  if (!ok) {
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view RoleName(KeyRole role) {
  switch (role) {
    case KeyRole::kPrefill:
      return "prefill";
    case KeyRole::kDecode:
      return "decode";
    case KeyRole::kEngine:
      return "engine";
  }
  return "unknown";
}

absl::StatusOr<KeyRole> ParseRole(absl::string_view name) {
  for (KeyRole role : {KeyRole::kPrefill, KeyRole::kDecode, KeyRole::kEngine}) {
    if (name == RoleName(role)) return role;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("role \"", name, "\" is not one of prefill, decode, engine"));
}

bool operator==(const KeyIdentity& a, const KeyIdentity& b) {
  return a.role == b.role && a.rank == b.rank && a.name == b.name;
}

std::string UserId(const KeyIdentity& identity) {
  return absl::StrCat(RoleName(identity.role), ":", identity.rank, ":", identity.name);
}

absl::StatusOr<KeyIdentity> ParseUserId(absl::string_view user_id) {
  const std::vector<absl::string_view> parts = absl::StrSplit(user_id, absl::MaxSplits(':', 2));
  const std::string what = absl::StrCat("User-Id \"", user_id, "\"");
  int64_t rank = 0;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &rank)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not <role>:<rank>:<name>"));
  }
  KeyIdentity identity;
  absl::StatusOr<KeyRole> role = ParseRole(parts[0]);
  if (!role.ok())
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", role.status().message()));
  identity.role = *role;
  if (absl::Status ok = RankOk(rank, what); !ok.ok()) return ok;
  identity.rank = static_cast<int>(rank);
  identity.name = std::string(parts[2]);
  if (absl::Status ok = NameOk(identity.name, what); !ok.ok()) return ok;
  return identity;
}

absl::Status CheckZ85Key(absl::string_view z85, absl::string_view what) {
  uint8_t bytes[32];
  const std::string text(z85);
  if (z85.size() != kZ85KeyChars || zmq_z85_decode(bytes, text.c_str()) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must be a 32-byte CURVE key in Z85: 40 characters of ZMQ RFC 32's alphabet, got ",
        z85.size(), " characters"));
  }
  return absl::OkStatus();
}

absl::StatusOr<KeyFile> ParseKeyFile(absl::string_view text, absl::string_view path,
                                     bool want_secret) {
  const std::string where = absl::StrCat("key file ", path);
  const json body = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": must be a JSON object"));
  }
  for (const auto& [member, value] : body.items()) {
    if (member != "role" && member != "rank" && member != "name" && member != "public" &&
        member != "secret") {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown member \"", member,
                                                     "\" (role, rank, name, public, secret)"));
    }
  }
  auto string_member = [&](const char* member) -> absl::StatusOr<std::string> {
    auto it = body.find(member);
    if (it == body.end() || !it->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"", member, "\" must be present and a string"));
    }
    return it->get<std::string>();
  };
  KeyFile key;
  absl::StatusOr<std::string> role = string_member("role");
  if (!role.ok()) return role.status();
  absl::StatusOr<KeyRole> parsed_role = ParseRole(*role);
  if (!parsed_role.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", parsed_role.status().message()));
  }
  key.identity.role = *parsed_role;
  auto rank = body.find("rank");
  if (rank == body.end() || !rank->is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"rank\" must be an integer"));
  }
  if (absl::Status ok = RankOk(rank->get<int64_t>(), where); !ok.ok()) return ok;
  key.identity.rank = rank->get<int>();
  absl::StatusOr<std::string> name = string_member("name");
  if (!name.ok()) return name.status();
  if (absl::Status ok = NameOk(*name, where); !ok.ok()) return ok;
  key.identity.name = *std::move(name);
  absl::StatusOr<std::string> public_key = string_member("public");
  if (!public_key.ok()) return public_key.status();
  if (absl::Status ok = CheckZ85Key(*public_key, absl::StrCat(where, ": \"public\"")); !ok.ok()) {
    return ok;
  }
  key.public_key = *std::move(public_key);
  const bool has_secret = body.contains("secret");
  if (!want_secret) {
    if (has_secret) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": a public key file must not hold \"secret\" (share the .pub, keep the .key)"));
    }
    return key;
  }
  absl::StatusOr<std::string> secret = string_member("secret");
  if (!secret.ok()) return secret.status();
  if (absl::Status ok = CheckZ85Key(*secret, absl::StrCat(where, ": \"secret\"")); !ok.ok()) {
    return ok;
  }
  char derived[kZ85KeyChars + 1];
  if (zmq_curve_public(derived, secret->c_str()) != 0 || key.public_key != derived) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"public\" is not the public half of \"secret\""));
  }
  key.secret_key = *std::move(secret);
  return key;
}

absl::StatusOr<KeyFile> ReadPublicKeyFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadSmallFile(path);
  if (!text.ok()) return text.status();
  return ParseKeyFile(*text, path, /*want_secret=*/false);
}

absl::StatusOr<KeyFile> ReadSecretKeyFile(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    return absl::NotFoundError(
        absl::StrCat("key file ", path, ": cannot be read: ", std::strerror(errno)));
  }
  if ((info.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "key file %s: mode %04o lets group or others reach a secret key; chmod 600 it", path,
        info.st_mode & 07777));
  }
  absl::StatusOr<std::string> text = ReadSmallFile(path);
  if (!text.ok()) return text.status();
  return ParseKeyFile(*text, path, /*want_secret=*/true);
}

absl::StatusOr<KeyFile> GenerateKeyFile(KeyIdentity identity) {
  if (identity.name.empty()) {
    identity.name = absl::StrCat(RoleName(identity.role), "-", identity.rank);
  }
  if (absl::Status ok = RankOk(identity.rank, "kvrail keygen"); !ok.ok()) return ok;
  if (absl::Status ok = NameOk(identity.name, "kvrail keygen"); !ok.ok()) return ok;
  char public_key[kZ85KeyChars + 1];
  char secret_key[kZ85KeyChars + 1];
  if (zmq_curve_keypair(public_key, secret_key) != 0) {
    return absl::UnimplementedError(absl::StrCat("kvrail keygen: zmq_curve_keypair failed (",
                                                 zmq_strerror(zmq_errno()),
                                                 "): this libzmq has no CURVE"));
  }
  return KeyFile{std::move(identity), public_key, secret_key};
}

absl::StatusOr<std::string> WriteKeyFiles(const std::string& dir, const KeyFile& key) {
  const std::string base = absl::StrCat(dir, "/", key.identity.name);
  const std::string secret_path = base + ".key";
  const std::string public_path = base + ".pub";
  for (const std::string& path : {secret_path, public_path}) {
    if (access(path.c_str(), F_OK) == 0) {
      return absl::AlreadyExistsError(
          absl::StrCat(path, " exists: kvrail keygen never overwrites a key"));
    }
  }
  if (absl::Status ok = WriteNew(secret_path, KeyJson(key, true), S_IRUSR | S_IWUSR); !ok.ok()) {
    return ok;
  }
  if (absl::Status ok = WriteNew(public_path, KeyJson(key, false), 0644); !ok.ok()) return ok;
  return secret_path;
}

}  // namespace kvrail::zmq_auth
