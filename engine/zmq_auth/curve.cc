#include "engine/zmq_auth/curve.h"

#include <zmq.h>

#include "absl/strings/str_cat.h"

namespace kvrail::zmq_auth {
namespace {

// A Z85 key goes with its terminating NUL (41 bytes), as libzmq reads one; other text without.
absl::Status Set(void* socket, int option, const char* name, const std::string& value) {
  const size_t size = value.size() == kZ85KeyChars ? value.size() + 1 : value.size();
  if (zmq_setsockopt(socket, option, value.c_str(), size) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CURVE: setting ", name, " failed: ", zmq_strerror(zmq_errno())));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MakeCurveServer(void* socket, const KeyFile& own) {
  const int on = 1;
  if (zmq_setsockopt(socket, ZMQ_CURVE_SERVER, &on, sizeof(on)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CURVE: setting ZMQ_CURVE_SERVER failed: ", zmq_strerror(zmq_errno())));
  }
  if (absl::Status ok = Set(socket, ZMQ_CURVE_SECRETKEY, "ZMQ_CURVE_SECRETKEY", own.secret_key);
      !ok.ok()) {
    return ok;
  }
  return Set(socket, ZMQ_ZAP_DOMAIN, "ZMQ_ZAP_DOMAIN", "kvrail");
}

absl::Status MakeCurveClient(void* socket, const KeyFile& own, absl::string_view server_public) {
  if (absl::Status ok = CheckZ85Key(server_public, "CURVE: the server's public key"); !ok.ok()) {
    return ok;
  }
  if (absl::Status ok =
          Set(socket, ZMQ_CURVE_SERVERKEY, "ZMQ_CURVE_SERVERKEY", std::string(server_public));
      !ok.ok()) {
    return ok;
  }
  if (absl::Status ok = Set(socket, ZMQ_CURVE_PUBLICKEY, "ZMQ_CURVE_PUBLICKEY", own.public_key);
      !ok.ok()) {
    return ok;
  }
  return Set(socket, ZMQ_CURVE_SECRETKEY, "ZMQ_CURVE_SECRETKEY", own.secret_key);
}

std::optional<std::string> UserIdOf(void* message) {
  const char* user_id = zmq_msg_gets(static_cast<zmq_msg_t*>(message), "User-Id");
  if (user_id == nullptr || *user_id == '\0') return std::nullopt;
  return std::string(user_id);
}

}  // namespace kvrail::zmq_auth
