// Making a ZeroMQ socket a CURVE server or client (ZMQ RFC 26), and reading who sent a message.
//
// A server socket holds its own keypair; its context's ZapHandler (zap_handler.h) decides whom
// it accepts. A client socket holds its own keypair and the server's public key, so that it
// talks only to that server: a peer without the matching secret cannot finish the handshake.
#ifndef KVRAIL_ENGINE_ZMQ_AUTH_CURVE_H_
#define KVRAIL_ENGINE_ZMQ_AUTH_CURVE_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/zmq_auth/allowed_keys.h"
#include "engine/zmq_auth/key_file.h"
#include "engine/zmq_auth/zap_handler.h"

namespace kvrail::zmq_auth {

// What a peer with CURVE on holds: its own keypair (a .key file) and the keys it accepts.
struct CurveKeys {
  KeyFile own;
  std::shared_ptr<const AllowedKeys> allowed;
};

// A server endpoint with CURVE on, in a ZeroMQ context of its own (the handshake endpoint,
// the engine API): its keypair, and its context's ZAP handler's options (whom it serves).
struct CurveServerKeys {
  KeyFile own;
  ZapOptions zap;
};

// A client socket with CURVE on: its keypair, and the public key (Z85) of the one server it
// may talk to.
struct CurveClientKeys {
  KeyFile own;
  std::string server_public_key;
};

// Sets ZMQ_CURVE_SERVER with `own`'s keys (and ZAP domain "kvrail") on `socket`, before it
// binds. InvalidArgument naming the option when libzmq refuses it (no CURVE in this libzmq).
absl::Status MakeCurveServer(void* socket, const KeyFile& own);

// Sets `own`'s keys and the server's public key (Z85) on `socket`, before it connects.
absl::Status MakeCurveClient(void* socket, const KeyFile& own, absl::string_view server_public);

// The User-Id ZAP gave the connection `message` came on; nullopt when it has none (no CURVE).
std::optional<std::string> UserIdOf(void* message);

}  // namespace kvrail::zmq_auth

#endif  // KVRAIL_ENGINE_ZMQ_AUTH_CURVE_H_
