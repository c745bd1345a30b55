// Replays every scenario of tests/data/cachepd/prefill_scenarios.json (the reference's Prefill
// handlers driven step by step, VECTORS.md) against PrefillRooms, and compares after each step
// the status frames pushed, the copy work, and the room, registration, rejection and
// quarantine tables.
//
// Where kvrail deliberately differs from the reference, the expectation is patched in
// KvrailDeviations below, each with its reason.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/session/prefill_rooms.h"
#include "control/session/test_transfers.h"
#include "control/session/transfer_poll.h"
#include "tests/support/vectors.h"

namespace kvrail::session {
namespace {

using kvrail::testing::FromHex;
using kvrail::testing::ToHex;
using nlohmann::json;
using ::testing::HasSubstr;

const json& ScenarioFile() {
  static const json* file = new json(kvrail::testing::LoadVectors("prefill_scenarios.json"));
  return *file;
}

absl::Time StepTime(size_t step) { return absl::UnixEpoch() + absl::Seconds(step); }

PrefillRooms MakeRooms(const json& scenario, bool accept_restarted_peer) {
  absl::StatusOr<layout::Contract> contract =
      layout::ParseContract(scenario.at("prefill_contract").get<std::string>());
  EXPECT_TRUE(contract.ok()) << contract.status();
  PrefillIdentity identity;
  identity.prefill_tp_size = scenario.at("prefill_tp_size").get<int>();
  identity.prefill_tp_rank = scenario.at("prefill_tp_rank").get<int>();
  identity.contract = *contract;
  PrefillOptions options;
  options.accept_restarted_peer = accept_restarted_peer;
  absl::StatusOr<PrefillRooms> rooms = PrefillRooms::Create(identity, options);
  EXPECT_TRUE(rooms.ok()) << rooms.status();
  return *std::move(rooms);
}

// Every room any step mentions.
std::set<uint64_t> RoomsOf(const json& scenario) {
  std::set<uint64_t> rooms;
  auto add_key = [&rooms](const std::string& key) {
    uint64_t room = 0;
    if (absl::SimpleAtoi(key, &room)) rooms.insert(room);
  };
  for (const json& step : scenario.at("steps")) {
    if (step.contains("room")) rooms.insert(step.at("room").get<uint64_t>());
    const json& after = step.at("state_after");
    for (const char* table : {"request_status", "failure_records", "transfer_infos"}) {
      for (const auto& [key, value] : after.at(table).items()) add_key(key);
    }
  }
  return rooms;
}

// kvrail's deliberate differences from the reference, applied to the recorded expectation.
void KvrailDeviations(const std::string& scenario, size_t step, bool accept_restarted_peer,
                      const json& steps, json& expected) {
  if (scenario == "manifest_key_error_escapes" && step == 3) {
    // docs/cachepd-strictness.md: a manifest missing a key is answered like any rejected
    // pre-allocation (CACHEPD §9.6) instead of escaping the handler and hanging the room.
    expected["notifications"] = json::array(
        {{{"zmq_endpoint", "tcp://10.1.0.1:17000"},
          {"frames_hex", json::array({ToHex("14"), ToHex("0"), ToHex("0"), ToHex("-1"), ""})}}});
    expected["state_after"]["request_status"]["14"] = 0;
    expected["state_after"]["failure_records"]["14"] = "invalid pre-allocation metadata";
  }
  if (scenario == "conflicting_reregistration" && accept_restarted_peer && step >= 4) {
    // CACHEPD §11.1: only the arena base changed, so this is a restarted decode. Its rooms fail
    // as in the reference (same Failed message), but the new registration is accepted instead
    // of being rejected, and the session's next room is collected normally.
    json& after = expected["state_after"];
    after["registered_sessions"] = steps.at(3).at("state_after").at("registered_sessions");
    after["rejected_sessions"] = json::object();
    after["failure_records"] = {{"15", "re-registered"}};
    if (step == 5) {
      expected["notifications"] = json::array();
      after["request_status"] = {{"15", 0}};
      after["transfer_infos"] = {{"16", json::array({"10.1.0.1:15000"})}};
    }
  }
}

std::vector<std::string> ReferenceFrames(const json& notification) {
  std::vector<std::string> frames;
  for (const json& hex : notification.at("frames_hex")) frames.push_back(hex.get<std::string>());
  // The scenarios' contracts are in the snapshot's form, so every peer is answered in 5 frames,
  // byte for byte the reference's (CACHEPD §12.9, §12.11).
  return frames;
}

std::vector<std::string> HexFrames(const std::vector<std::string>& frames) {
  std::vector<std::string> hex;
  hex.reserve(frames.size());
  for (const std::string& frame : frames) hex.push_back(ToHex(frame));
  return hex;
}

// The phrases kvrail keeps from the reference's failure records, so a reason still says why.
void ExpectSameKindOfReason(const std::string& reference, const std::string& ours) {
  EXPECT_FALSE(ours.empty()) << "reference: " << reference;
  for (const char* phrase :
       {"invalid pre-allocation metadata", "unregistered Decode session",
        "duplicate CachePD pre-allocation", "destination ranks disagree with the typed route plan",
        "kind disagrees with its registration", "registration rejected", "conflicting registration",
        "CachePD transfer failed", "re-registered"}) {
    if (reference.find(phrase) != std::string::npos) {
      EXPECT_THAT(ours, HasSubstr(phrase)) << "reference: " << reference;
    }
  }
}

void ExpectState(const PrefillRooms& rooms, const std::set<uint64_t>& all_rooms, const json& after,
                 absl::Time now) {
  const json& status = after.at("request_status");
  const json& failures = after.at("failure_records");
  const json& infos = after.at("transfer_infos");
  for (uint64_t room : all_rooms) {
    const std::string key = absl::StrCat(room);
    SCOPED_TRACE(absl::StrCat("room ", room));
    std::optional<PrefillRoomView> view = rooms.Find(room);
    std::optional<TransferPoll> state = view.has_value() ? view->state : std::nullopt;
    if (status.contains(key)) {
      ASSERT_TRUE(state.has_value());
      EXPECT_EQ(TransferPollCode(*state), status.at(key).get<int>());
    } else {
      EXPECT_FALSE(state.has_value()) << TransferPollName(*state);
    }
    if (failures.contains(key)) {
      ASSERT_TRUE(view.has_value());
      ExpectSameKindOfReason(failures.at(key).get<std::string>(), view->failure_reason);
    }
    std::vector<std::string> sessions;
    if (infos.contains(key)) sessions = infos.at(key).get<std::vector<std::string>>();
    EXPECT_EQ(view.has_value() ? view->preallocated_sessions : std::vector<std::string>(),
              sessions);
  }

  json registered = json::array();
  for (const auto& peer : rooms.Registrations()) {
    registered.push_back({{"session_id", peer->registration.session_id},
                          {"decode_tp_rank", peer->registration.decode_tp_rank},
                          {"decode_tp_size", peer->registration.decode_tp_size},
                          {"is_dummy", peer->dummy},
                          {"expected_decode_ranks", peer->expected_decode_ranks},
                          {"fragment_count", peer->fragments.size()}});
  }
  json reference_registered = after.at("registered_sessions");
  std::sort(reference_registered.begin(), reference_registered.end(),
            [](const json& a, const json& b) { return a.at("session_id") < b.at("session_id"); });
  EXPECT_EQ(registered, reference_registered);

  json rejected = json::object();
  for (const auto& [session, route] : rooms.RejectedSessions()) {
    rejected[session] = json::array({route.endpoint, route.port});
  }
  EXPECT_EQ(rejected, after.at("rejected_sessions"));
  EXPECT_EQ(rooms.QuarantinedSessions(now),
            after.at("failed_sessions").get<std::vector<std::string>>());
}

// The copy work of a final chunk against the reference's Mooncake calls: the same sessions in
// the same order, the same bytes, and as many (uncoalesced) copies as descriptors.
void ExpectTransferMatchesEngineCalls(const TransferWork& work, const json& calls,
                                      bool transfer_failed) {
  std::vector<std::string> sessions;
  std::map<std::string, std::pair<int64_t, uint64_t>> totals;  // descriptors, bytes
  for (const json& call : calls) {
    const std::string session = call.at("session").get<std::string>();
    if (totals.find(session) == totals.end()) sessions.push_back(session);
    totals[session].first += call.at("descriptors").get<int64_t>();
    totals[session].second += call.at("bytes").get<uint64_t>();
  }
  ASSERT_FALSE(work.destinations.empty());
  // A failed write stops the reference after its first destination; the rest were never tried.
  const size_t compared = transfer_failed ? sessions.size() : work.destinations.size();
  ASSERT_EQ(sessions.size(), compared);
  for (size_t i = 0; i < compared; ++i) {
    const TransferDestination& d = work.destinations[i];
    EXPECT_EQ(d.peer->registration.session_id, sessions[i]);
    EXPECT_EQ(d.peer->copy_plan->CountCopies(*work.source_manifest), totals[sessions[i]].first);
    EXPECT_EQ(d.bytes, totals[sessions[i]].second);
  }
}

PrefillOutput RunStep(PrefillRooms& rooms, const json& step, absl::Time now) {
  const std::string action = step.at("action").get<std::string>();
  if (action == "zmq") {
    std::vector<std::string> frames;
    for (const json& hex : step.at("frames_hex")) frames.push_back(FromHex(hex.get<std::string>()));
    return rooms.OnMessage(frames, now);
  }
  const uint64_t room = step.at("room").get<uint64_t>();
  if (action == "begin_room") {
    absl::StatusOr<PrefillOutput> out = rooms.BeginRoom(room, now);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *std::move(out) : PrefillOutput{};
  }
  if (action == "mark_failed") return rooms.Abort(room, "marked failed by the scheduler", now);
  EXPECT_EQ(action, "final_chunk");
  RoomReady ready;
  if (step.at("source_manifest").is_string()) {
    absl::StatusOr<layout::Manifest> manifest =
        layout::ParseManifest(step.at("source_manifest").get<std::string>());
    EXPECT_TRUE(manifest.ok()) << manifest.status();
    ready.source_manifest = *manifest;
  }
  ready.bootstrap_token = step.at("bootstrap_token").get<int64_t>();
  if (step.at("spec_candidate_ids").is_array()) {
    ready.spec_candidate_ids = step.at("spec_candidate_ids").get<std::vector<int32_t>>();
  }
  absl::StatusOr<PrefillOutput> out = rooms.Ready(room, ready, now);
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return {};
  PrefillOutput merged = *std::move(out);
  const json& calls = step.at("engine_calls");
  const json& status = step.at("state_after").at("request_status");
  const bool failed = status.at(absl::StrCat(room)).get<int>() == 0;
  if (calls.empty()) {
    EXPECT_TRUE(merged.transfers.empty());
    return merged;
  }
  EXPECT_EQ(merged.transfers.size(), 1u);
  if (merged.transfers.size() != 1) return merged;
  const TransferWork work = merged.transfers.front();
  ExpectTransferMatchesEngineCalls(work, calls, failed);
  (void)testing::Post(rooms, work, now, merged);
  if (failed) {
    const std::string session = calls.at(0).at("session").get<std::string>();
    testing::Append(merged,
                    testing::FailAll(rooms, room, session,
                                     absl::StrCat("Mooncake transfer failed for ",
                                                  work.destinations.front().peer->reply_endpoint),
                                     now));
  } else {
    absl::StatusOr<PrefillOutput> done = testing::LandAll(rooms, room, now);
    EXPECT_TRUE(done.ok()) << done.status();
    if (done.ok()) testing::Append(merged, *std::move(done));
  }
  return merged;
}

void ReplayAll(bool accept_restarted_peer) {
  const json& scenarios = ScenarioFile().at("scenarios");
  ASSERT_FALSE(scenarios.empty());
  for (const json& scenario : scenarios) {
    const std::string name = scenario.at("name").get<std::string>();
    SCOPED_TRACE(name);
    PrefillRooms rooms = MakeRooms(scenario, accept_restarted_peer);
    const std::set<uint64_t> all_rooms = RoomsOf(scenario);
    const json& steps = scenario.at("steps");
    for (size_t i = 0; i < steps.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("step ", i, " (", steps[i].at("action").get<std::string>(), ")"));
      json expected = steps[i];
      KvrailDeviations(name, i, accept_restarted_peer, steps, expected);
      const absl::Time now = StepTime(i);
      PrefillOutput out = RunStep(rooms, steps[i], now);
      if (expected.at("action") != "final_chunk") {
        EXPECT_TRUE(out.transfers.empty());
      }

      std::vector<std::pair<std::string, std::vector<std::string>>> sent;
      for (const OutboundMessage& m : out.messages) {
        sent.emplace_back(m.endpoint, HexFrames(m.frames));
      }
      std::vector<std::pair<std::string, std::vector<std::string>>> reference;
      for (const json& n : expected.at("notifications")) {
        reference.emplace_back(n.at("zmq_endpoint").get<std::string>(), ReferenceFrames(n));
      }
      EXPECT_EQ(sent, reference);
      ExpectState(rooms, all_rooms, expected.at("state_after"), now);
    }
  }
}

TEST(PrefillScenariosTest, FileHasScenarios) {
  EXPECT_EQ(ScenarioFile().value("format", ""), "cachepd-prefill-scenarios-v1");
  EXPECT_GE(ScenarioFile().at("scenarios").size(), 14u);
}

// The reference's own rule for a changed registration (CACHEPD §3.2.2, §8).
TEST(PrefillScenariosTest, EveryScenarioMatchesTheReferenceRules) { ReplayAll(false); }

// kvrail's default: a restarted decode is accepted (CACHEPD §11.1).
TEST(PrefillScenariosTest, EveryScenarioMatchesWithRestartedPeersAccepted) { ReplayAll(true); }

}  // namespace
}  // namespace kvrail::session
