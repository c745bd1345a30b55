// Test support: a prefill node and a decode rank in this process, for the sidecar's in-process
// tests of room paths that need both roles: a bootstrap server (control/bootstrap), a prefill
// sidecar per rank of the node's TP and a decode sidecar over the loopback backend
// (engine/transport/loopback: each write a memcpy in this process), their engine APIs on loopback
// TCP. No child process, no UCX: what a test over these proves is the sidecars' room logic, not a
// transport or a process boundary (those stay in tests/e2e, tests/chaos, tests/transfer).
#ifndef KVRAIL_CONTROL_SIDECAR_SIDECAR_PAIR_H_
#define KVRAIL_CONTROL_SIDECAR_SIDECAR_PAIR_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "control/bootstrap/server.h"
#include "control/sidecar/sidecar.h"

namespace kvrail::sidecar::testing {

class SidecarPair {
 public:
  // `adjust` may change each sidecar's options before it starts (its role, TP size and rank are
  // set already). The node has `prefill_tp` ranks; the decode is TP 1.
  static absl::StatusOr<std::unique_ptr<SidecarPair>> Start(
      const std::function<void(SidecarOptions&)>& adjust = {}, int prefill_tp = 1);
  ~SidecarPair();  // the sidecars stop first, then the bootstrap server

  // "127.0.0.1:<port>" of the bootstrap server the prefill registered with.
  const std::string& bootstrap() const { return bootstrap_address_; }
  Sidecar& prefill(int rank = 0) { return *prefills_.at(rank); }
  Sidecar& decode() { return *decode_; }

 private:
  SidecarPair() = default;
  bootstrap::BootstrapServer bootstrap_;
  std::string bootstrap_address_;
  std::vector<std::unique_ptr<Sidecar>> prefills_;
  std::unique_ptr<Sidecar> decode_;
};

}  // namespace kvrail::sidecar::testing

#endif  // KVRAIL_CONTROL_SIDECAR_SIDECAR_PAIR_H_
