// What the fake peers of tests/e2e share when they face a real sidecar process: the kvrail
// binary, the small contract both sides attach, a room's manifest, and one multipart receive.
#ifndef KVRAIL_TESTS_E2E_SIDECAR_PEER_H_
#define KVRAIL_TESTS_E2E_SIDECAR_PEER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "cluster/process/subprocess.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/layout/small_room.h"
#include "tests/support/kvrail_binary.h"

namespace kvrail::e2e {

// The small contract (two layers of k and v, 16 pages, TP 1) and a room's manifest, as the
// sidecar's own tests use them (control/layout/small_room.h).
using layout::testing::RoomManifest;
using layout::testing::SmallContract;

// `kvrail bootstrap` on a port of its choosing (--port 0, read from its ready line), for the
// test's life.
struct Bootstrap {
  Bootstrap();
  int port;
  std::string address;  // 127.0.0.1:port
  std::unique_ptr<process::Subprocess> server;
};

// A fake prefill rank's PULL socket: bound on loopback (20 s receive timeout) and registered
// with `bootstrap` as the node's only rank, with `contract`. False when the registration failed.
bool RegisterFakePrefillRank(const Bootstrap& bootstrap, zmq::socket_t& pull,
                             const layout::Contract& contract);
// The same, with a bootstrap server on this host's `bootstrap_port` (one in this process).
bool RegisterFakePrefillRank(int bootstrap_port, zmq::socket_t& pull,
                             const layout::Contract& contract);

// One multipart message from `pull`, or nothing once its receive timeout passes.
std::vector<std::string> Receive(zmq::socket_t& pull);

}  // namespace kvrail::e2e

#endif  // KVRAIL_TESTS_E2E_SIDECAR_PEER_H_
