// A decode's peers (decode_sidecar.h): the CachePD messages prefill ranks send it (sender
// proofs, room digests, statuses), and the ticker's turn: timeouts, probes of prefill ranks,
// the health of their bootstrap servers, and registering again after this process was held.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <iterator>
#include <set>

#include "absl/strings/str_cat.h"
#include "control/bootstrap/client.h"
#include "control/sidecar/decode_sidecar.h"
#include "control/sidecar/key_binding.h"
#include "control/sidecar/liveness.h"
#include "control/wire/digest.h"
#include "control/wire/proof.h"
#include "control/wire/row_staging.h"
#include "engine/base/error.h"

namespace kvrail::sidecar {
namespace {

// One quick /health probe (CACHEPD §1.6): the caller counts failures.
bool Healthy(const std::string& address) {
  absl::StatusOr<std::pair<std::string, int>> server = SplitHostPort(address, "bootstrap");
  if (!server.ok()) return false;
  bootstrap::BootstrapClientOptions quick;
  quick.retries = 0;
  quick.connect_timeout = std::chrono::milliseconds(500);
  quick.read_timeout = std::chrono::milliseconds(1000);
  quick.deadline = std::chrono::milliseconds(1500);
  return bootstrap::BootstrapClient(server->first, server->second, quick).Health().ok();
}

}  // namespace

absl::Status DecodeSidecar::CheckKeyLocked(const std::string& user_id,
                                           const std::vector<std::string>& message) {
  return KeyBinding::CheckAtDecode(user_id, message);
}

void DecodeSidecar::OnPeerMessageLocked(InboxMessage& in) {
  const std::string& host = in.host;
  const std::vector<std::string>& message = in.frames;
  if (wire::IsSenderProof(message)) {
    if (absl::Status kept = senders->OnProof(message); !kept.ok()) {
      RefuseLocked(host, "sender proof dropped: " + DescribeError(kept));
    }
    return;
  }
  if (SenderProofRequiredLocked(message)) {
    if (absl::Status proven = senders->Check(message); !proven.ok()) {
      RefuseLocked(host, "peer message refused: " + DescribeError(proven));
      return;
    }
  }
  if (wire::IsRoomDigest(message)) {
    KeepDigestLocked(message, host);
    return;
  }
  if (wire::IsStagingAnswer(message)) {
    KeepStagingAnswerLocked(message, host);
    return;
  }
  // Row staging first: a Success whose rows wait in a slot is scattered before its digest
  // is checked (the digest is of the pages) and before it counts.
  if (!offered_slots.empty() && TakeForRowStagingLocked(message)) return;
  ContinueSuccessLocked(message, host);
}

bool DecodeSidecar::SenderProofRequiredLocked(const std::vector<std::string>& message) const {
  switch (options.sender_proofs) {
    case SenderProofs::kOff:
      return false;
    case SenderProofs::kRequired:
      return true;
    case SenderProofs::kAuto:
      break;
  }
  const std::optional<std::pair<uint64_t, uint32_t>> id = RoomAndRank(message);
  if (!id) return false;  // the state machine refuses it and says why
  const std::optional<session::DecodeRoomView> room = rooms->Find(id->first);
  if (!room) return false;
  auto node = nodes.find(room->bootstrap_address);
  return node != nodes.end() && node->second->kvrail;
}

void DecodeSidecar::HandleMessageLocked(const std::vector<std::string>& message, absl::Time now,
                                        const std::string& host) {
  AssertOnOwner("HandleMessageLocked");
  session::DecodeOutput out = rooms->OnMessage(message, now);
  const absl::Status rejected = out.rejected;
  ApplyLocked(std::move(out));
  if (!rejected.ok()) RefuseLocked(host, "peer message refused: " + DescribeError(rejected));
}

bool DecodeSidecar::Turn(absl::Duration held, bool beat) {
  std::vector<std::string> probe;  // bootstrap servers whose /health to ask
  std::vector<std::string> peers;  // prefill ranks' PULL endpoints to probe
  const bool attached_now = Owned([&] {
    if (!attached) return false;
    const absl::Time now = RoomNow();
    // A turn that came far later than asked: this process was stopped (SIGSTOP, a debugger, a
    // frozen container) or starved. Its prefill peers may have dropped its sessions meanwhile
    // (silent for --registration-ttl), so it registers again with the next room to each (an
    // identical registration changes nothing, CACHEPD §2.1).
    if (held > absl::ZeroDuration()) {
      const std::vector<std::string> nodes = rooms->BootstrapAddresses();
      for (const std::string& node : nodes) rooms->ForgetPeerSets(node);
      spdlog::warn(
          "decode: this sidecar was held for {} (stopped or starved): registering again with "
          "the prefill ranks of {} node(s) at their next room",
          absl::FormatDuration(held), nodes.size());
    }
    ApplyLocked(rooms->Tick(now));
    if (beat) {
      probe = rooms->BootstrapAddresses();
      peers = rooms->PrefillEndpoints();
      // Gone ranks too, until they listen again (a new room is not routed to them).
      const size_t live = peers.size();
      for (std::string& gone : rooms->GonePrefills()) {
        if (!std::binary_search(peers.begin(), peers.begin() + live, gone)) {
          peers.push_back(std::move(gone));
        }
      }
    }
    return true;
  });
  if (!attached_now) return false;
  ProbePeers(peers);
  if (beat) PublishDescriptor();              // --registry: a descriptor that changed
  for (const std::string& address : probe) {  // HTTP, off the owner
    const bool ok = Healthy(address);
    Owned([&] {
      if (rooms) ApplyLocked(rooms->OnHealth(address, ok, RoomNow()));
    });
  }
  return true;
}

// A decode fails the rooms a gone prefill rank owes, and answers its fences. Every rank is
// probed at once: a hundred silent ones cost one probe timeout.
void DecodeSidecar::ProbePeers(const std::vector<std::string>& peers) {
  if (peers.empty()) return;
  const std::vector<Reach> reach = ProbeEndpoints(peers, absl::Milliseconds(500));
  // A rank newly gone (its socket refuses connections) wrote its last: what it sent before it
  // went and this host has not read yet (a socket's buffered bytes, its host's kernel still
  // sending) must land in no room once the verdict gives the room's pages back, so its
  // connections are refused first, here, off the owner. (Only this thread marks ranks gone.)
  const std::vector<std::string> newly_gone = Owned([&] {
    std::vector<std::string> found;
    if (!rooms) return found;
    const std::vector<std::string> known_gone = rooms->GonePrefills();
    for (size_t i = 0; i < peers.size(); ++i) {
      if (reach[i] == Reach::kRefused &&
          !std::binary_search(known_gone.begin(), known_gone.end(), peers[i])) {
        found.push_back(peers[i]);
      }
    }
    return found;
  });
  for (const std::string& gone : newly_gone) (void)RefuseWriter(gone, "is gone");
  Owned([&] {
    if (!rooms) return;
    const absl::Time now = RoomNow();
    for (size_t i = 0; i < peers.size(); ++i) {
      const std::string& peer = peers[i];
      const std::vector<std::string> known_gone = rooms->GonePrefills();
      const bool was_gone = std::binary_search(known_gone.begin(), known_gone.end(), peer);
      if (reach[i] == Reach::kListening && was_gone) {
        spdlog::info("decode: prefill rank at {} listens again", peer);
        rooms->OnPrefillListening(peer);
      }
      if (reach[i] != Reach::kRefused || was_gone) continue;
      spdlog::warn("decode: prefill rank at {} is gone (connection refused)", peer);
      ApplyLocked(rooms->OnPrefillGone(peer, now));
      // The next room looks the rank up again: one restarted on another port is found there,
      // and one the bootstrap server still lists here fails at once (DecodeRooms::OnRoute).
      for (auto& [address, node] : nodes) {
        for (auto it = node->endpoints.begin(); it != node->endpoints.end();) {
          it = it->second == peer ? node->endpoints.erase(it) : std::next(it);
        }
      }
    }
  });
}

bool DecodeSidecar::RefuseWriter(const std::string& endpoint, const char* why) {
  if (!transport->capabilities().refuses_writers) return false;
  const absl::StatusOr<size_t> settled = transport->RefuseWriter(endpoint);
  if (!settled.ok()) {
    spdlog::warn("decode: prefill rank at {} {}: refusing its connections: {}", endpoint, why,
                 settled.status().ToString());
    return false;
  }
  if (*settled == 0) {
    // An unnamed writer of an earlier build: nothing proves its bytes stopped.
    spdlog::info("decode: prefill rank at {} {}: none of its connections known here", endpoint,
                 why);
    return false;
  }
  spdlog::info("decode: prefill rank at {} {}: its {} connection(s) refused or closed", endpoint,
               why, *settled);
  return true;
}

void DecodeSidecar::LiveRoutesLocked(std::set<std::string>& live) const {
  for (const auto& [address, node] : nodes) {
    for (const auto& [rank, endpoint] : node->endpoints) live.insert(endpoint);
  }
}

}  // namespace kvrail::sidecar
