// Fuzz harness: the data-plane handshake descriptor (proto/kvrail/v1/handshake.proto) that a
// prefill fetches from a decode named only by a registration, and every check the prefill runs
// on it before a byte is written into the decode's memory (docs/ARCHITECTURE.md, "Handshake
// beside CachePD", "Bounds before bytes").
//
// The input is the descriptor's serialised bytes, as the reply's third frame carries them. In
// order, as the prefill sidecar goes:
//   * FetchDescriptor (engine/transport/handshake): the reply must parse and name the session
//     asked for; the session id's own syntax is ParseSessionId's (the socket exchange around
//     them is not reachable without one, and is covered by handshake_test);
//   * PeerDirectory::Dial (engine/transfer): RemoteRegions::FromDescriptor, then the backend's
//     Connect: the loopback backend's, in process (UCX's unpacks worker addresses and remote
//     keys with UCX's own code and needs a live worker: not fuzzed here);
//   * prefill_transfers.cc: the registration's arena must lie in one region
//     (RemoteRegions::Find), and every batch passes CheckWrites before it is posted.
// Properties: no crash, leak or undefined behaviour; FromDescriptor accepts exactly the
// descriptors whose regions are non-empty, end by 2^64 and are disjoint; Find and CheckWrites
// agree with a brute-force model over 128-bit arithmetic for ranges at and around every
// region's ends; a Connect that succeeds can be disconnected.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/transport/bounds.h"
#include "engine/transport/handshake/handshake.h"
#include "engine/transport/loopback/loopback_transport.h"
#include "proto/kvrail/v1/handshake.pb.h"
#include "tests/fuzz/check.h"
#include "tests/fuzz/quiet_protobuf.h"

namespace {

using kvrail::fuzz::Check;
namespace transport = kvrail::transport;
namespace v1 = kvrail::v1;
using Wide = unsigned __int128;

// Regions looked at by the quadratic model and the boundary queries; the rest are only parsed.
constexpr int kModelRegions = 24;
constexpr uint64_t kMaxWriteBytes = uint64_t{1} << 30;
// A transport that takes one row a write, of up to kMaxWriteBytes.
transport::Capabilities OneRowAWrite() { return {.max_write_bytes = kMaxWriteBytes}; }
constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

bool Inside(uint64_t address, uint64_t length, const v1::Region& r) {
  return address >= r.base() && Wide{address} + length <= Wide{r.base()} + r.length();
}

// What FromDescriptor must decide: each region holds a byte and ends by 2^64; none overlap.
bool ModelValid(const v1::HandshakeDescriptor& d) {
  for (const v1::Region& r : d.regions()) {
    if (r.length() == 0 || Wide{r.base()} + r.length() > Wide{kMax} + 1) return false;
  }
  for (int i = 0; i < d.regions_size(); ++i) {
    for (int j = i + 1; j < d.regions_size(); ++j) {
      const v1::Region& a = d.regions(i);
      const v1::Region& b = d.regions(j);
      if (Wide{a.base()} < Wide{b.base()} + b.length() &&
          Wide{b.base()} < Wide{a.base()} + a.length()) {
        return false;
      }
    }
  }
  return true;
}

// The region that holds all of [address, address + length), by a linear scan.
std::optional<int> ModelFind(const v1::HandshakeDescriptor& d, uint64_t address, uint64_t length) {
  for (int i = 0; i < d.regions_size(); ++i) {
    if (Inside(address, length, d.regions(i))) return i;
  }
  return std::nullopt;
}

struct Query {
  uint64_t address;
  uint64_t length;
};

// Ranges at, just inside and just outside each region's ends, of lengths 0, 1, the region's
// and one more, and ranges that run to 2^64.
std::vector<Query> BoundaryQueries(const v1::HandshakeDescriptor& d) {
  std::vector<Query> queries = {{0, 1}, {kMax, 1}, {0, kMax}, {1, kMax}};
  for (const v1::Region& r : d.regions()) {
    const uint64_t end = r.base() + r.length();  // may wrap: a query like any other
    for (uint64_t at : {r.base() - 1, r.base(), r.base() + 1, end - 1, end}) {
      for (uint64_t length : {uint64_t{0}, uint64_t{1}, r.length(), r.length() + 1, kMax - at}) {
        queries.push_back({at, length});
      }
    }
  }
  return queries;
}

void CheckRegions(const v1::HandshakeDescriptor& d) {
  absl::StatusOr<transport::RemoteRegions> regions = transport::RemoteRegions::FromDescriptor(d);
  Check(regions.ok() == ModelValid(d), [&] {
    return absl::StrCat("FromDescriptor ", regions.ok() ? "accepts" : "refuses",
                        " a descriptor the model ", regions.ok() ? "refuses" : "accepts");
  });
  if (!regions.ok()) {
    Check(regions.status().code() == absl::StatusCode::kInvalidArgument,
          "FromDescriptor refuses with another code than InvalidArgument");
    return;
  }
  Check(regions->size() == d.regions_size(), "FromDescriptor lost regions");
  const std::vector<Query> queries = BoundaryQueries(d);
  std::vector<transport::Write> writes;
  std::vector<std::optional<int>> expected;
  for (const Query& q : queries) {
    const std::optional<int> found = regions->Find(q.address, q.length);
    const std::optional<int> model = ModelFind(d, q.address, q.length);
    // Find may name any region that holds the range; only an empty range fits two.
    Check(found.has_value() == model.has_value() &&
              (!found || Inside(q.address, q.length, d.regions(*found))),
          [&] {
            return absl::StrCat("Find(0x", absl::Hex(q.address), ", ", q.length,
                                ") disagrees with the "
                                "model");
          });
    if (q.length > 0 && q.length <= kMaxWriteBytes) {
      writes.push_back({/*local_offset=*/0, q.address, q.length});
      expected.push_back(model);
    }
  }
  // One batch per write (each must pass alone exactly when the model says so), then the batch
  // of the writes that pass, whose regions must come back in order.
  std::vector<transport::Write> passing;
  std::vector<int> passing_regions;
  for (size_t i = 0; i < writes.size(); ++i) {
    const absl::Status one =
        transport::CheckWrites({&writes[i], 1}, kMaxWriteBytes, *regions, OneRowAWrite());
    Check(one.ok() == expected[i].has_value(), "CheckWrites disagrees with the model");
    if (one.ok()) {
      passing.push_back(writes[i]);
      passing_regions.push_back(*expected[i]);
    }
  }
  if (!passing.empty()) {
    std::vector<int> region_of;
    Check(
        transport::CheckWrites(passing, kMaxWriteBytes, *regions, OneRowAWrite(), &region_of).ok(),
        "a batch of writes that each pass fails");
    for (size_t i = 0; i < passing.size(); ++i) {
      Check(Inside(passing[i].remote_address, passing[i].length, d.regions(region_of[i])),
            "CheckWrites names a region that does not hold the write");
    }
  }
}

transport::LoopbackTransport& Loopback() {
  // A prefill's own transport: it registers nothing of its own here, and is the only one alive
  // (transport 1 of the process), so that a descriptor naming it can connect.
  static transport::LoopbackTransport* const loopback =
      transport::LoopbackTransport::Create({.lanes = 2}).value().release();
  return *loopback;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvrail::fuzz::QuietProtobuf();
  v1::HandshakeDescriptor descriptor;
  if (size > static_cast<size_t>(transport::kMaxDescriptorBytes) ||
      !descriptor.ParseFromArray(data, static_cast<int>(size))) {
    return 0;
  }
  // FetchDescriptor asked for this session and got a descriptor naming it.
  absl::StatusOr<transport::SessionAddress> address =
      transport::ParseSessionId(descriptor.session_id());
  if (address.ok()) {
    Check(!address->host.empty() && address->port >= 1 && address->port <= 65535,
          "ParseSessionId accepts an empty host or a port outside 1..65535");
  } else {
    Check(address.status().code() == absl::StatusCode::kInvalidArgument,
          "ParseSessionId refuses with another code than InvalidArgument");
  }
  if (descriptor.regions_size() <= kModelRegions) CheckRegions(descriptor);

  absl::StatusOr<transport::PeerId> peer = Loopback().Connect(descriptor);
  if (peer.ok()) {
    Check(descriptor.transport() == v1::TRANSPORT_KIND_LOOPBACK && descriptor.lanes_size() > 0,
          "Connect takes a descriptor of another transport or without lanes");
    Check(transport::RemoteRegions::FromDescriptor(descriptor).ok(),
          "Connect takes regions FromDescriptor refuses");
    Check(Loopback().Disconnect(*peer).ok(), "a connected peer does not disconnect");
  }
  return 0;
}
