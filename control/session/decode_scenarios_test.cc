// Replays every scenario of tests/data/cachepd/decode_scenarios.json (status frames fed to the
// reference's parse_prefill_status_message and _handle_prefill_status, VECTORS.md) against
// DecodeRooms, comparing after each step the room state, the responders, the published token
// and speculative ids, and the failure record.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/session/decode_rooms.h"
#include "control/session/transfer_poll.h"
#include "control/wire/fence.h"
#include "engine/base/error.h"
#include "tests/support/vectors.h"

namespace kvrail::session {
namespace {

using kvrail::testing::FromHex;
using nlohmann::json;
using ::testing::HasSubstr;

const json& ScenarioFile() {
  static const json* file = new json(kvrail::testing::LoadVectors("decode_scenarios.json"));
  return *file;
}

// frames.json carries a contract and a manifest that passes against it.
const json& FramesFile() {
  static const json* file = new json(kvrail::testing::LoadVectors("frames.json"));
  return *file;
}

DecodeRooms MakeRooms() {
  absl::StatusOr<layout::Contract> contract =
      layout::ParseContract(FramesFile().at("contract_used").get<std::string>());
  EXPECT_TRUE(contract.ok()) << contract.status();
  DecodeIdentity identity;
  identity.endpoint = "10.2.0.1";
  identity.port = 18000;
  identity.session_id = "10.2.0.1:16000";
  identity.arena_base = 0x7e0000000000;
  identity.contract = *contract;
  identity.decode_tp_size = 1;
  identity.decode_tp_rank = 0;
  absl::StatusOr<DecodeRooms> rooms = DecodeRooms::Create(identity);
  EXPECT_TRUE(rooms.ok()) << rooms.status();
  return *std::move(rooms);
}

layout::Manifest UsedManifest() {
  absl::StatusOr<layout::Manifest> manifest =
      layout::ParseManifest(FramesFile().at("manifest_used").get<std::string>());
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  return *manifest;
}

// Brings a room to the scenario's initial state through the public calls: BeginRoom, then, when
// the scenario has a route, OnRoute and OnAllocated (WaitingForInput). Without a route the
// room can only be Bootstrapping: no call reaches WaitingForInput without one.
void Prepare(DecodeRooms& rooms, const json& scenario, absl::Time now) {
  const uint64_t room = scenario.at("room").get<uint64_t>();
  ASSERT_TRUE(rooms.BeginRoom(room, "10.1.0.9:8998", now).ok());
  const json& expected = scenario.at("expected_prefill_ranks");
  if (expected.is_null()) {
    EXPECT_EQ(rooms.State(room), TransferPoll::kBootstrapping);
    return;
  }
  RoomRoute route;
  route.targets.expected_prefill_ranks = expected.get<std::vector<int>>();
  route.targets.target_tp_ranks = route.targets.expected_prefill_ranks;
  for (int rank : route.targets.target_tp_ranks) {
    route.endpoints.push_back({rank, absl::StrCat("tcp://10.1.0.", rank + 1, ":", 17000 + rank)});
  }
  absl::StatusOr<DecodeOutput> routed = rooms.OnRoute(room, route, now);
  ASSERT_TRUE(routed.ok()) << routed.status();
  absl::StatusOr<DecodeOutput> allocated = rooms.OnAllocated(room, UsedManifest(), now);
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  ASSERT_EQ(TransferPollCode(*rooms.State(room)), scenario.at("initial_status").get<int>());
}

TEST(DecodeScenariosTest, FileHasScenarios) {
  EXPECT_EQ(ScenarioFile().value("format", ""), "cachepd-decode-scenarios-v1");
  EXPECT_GE(ScenarioFile().at("scenarios").size(), 9u);
}

TEST(DecodeScenariosTest, EveryScenarioMatchesTheReference) {
  for (const json& scenario : ScenarioFile().at("scenarios")) {
    SCOPED_TRACE(scenario.at("name").get<std::string>());
    DecodeRooms rooms = MakeRooms();
    const uint64_t room = scenario.at("room").get<uint64_t>();
    const std::string key = absl::StrCat(room);
    absl::Time now = absl::UnixEpoch();
    Prepare(rooms, scenario, now);
    const json& steps = scenario.at("steps");
    for (size_t i = 0; i < steps.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("step ", i));
      const json& step = steps[i];
      now += absl::Seconds(1);
      std::vector<std::string> frames;
      for (const json& hex : step.at("frames_hex")) {
        frames.push_back(FromHex(hex.get<std::string>()));
      }
      const std::optional<TransferPoll> before = rooms.State(room);
      DecodeOutput out = rooms.OnMessage(frames, now);
      // No CachePD message, as in the reference; kvrail's fence requests (wire/fence.h) go to
      // the ranks that may still write a room that failed.
      for (const OutboundMessage& m : out.messages) {
        EXPECT_TRUE(wire::IsFenceRequest(m.frames)) << "a CachePD message was sent";
      }
      if (step.contains("dropped")) {
        EXPECT_EQ(CategoryOf(out.rejected), ErrorCategory::kInvalidFrame) << out.rejected;
        EXPECT_TRUE(out.events.empty());
        EXPECT_EQ(rooms.State(room), before);
      } else {
        EXPECT_TRUE(out.rejected.ok() || absl::IsNotFound(out.rejected)) << out.rejected;
      }

      std::optional<DecodeRoomView> view = rooms.Find(room);
      ASSERT_TRUE(view.has_value());
      EXPECT_EQ(TransferPollCode(view->state), step.at("status_after").get<int>());
      EXPECT_EQ(view->responders, step.at("responders").get<std::vector<int>>());
      const json& tokens = step.at("bootstrap_token_table");
      if (tokens.contains(key)) {
        EXPECT_EQ(view->bootstrap_token, tokens.at(key).get<int64_t>());
      } else {
        EXPECT_EQ(view->bootstrap_token, std::nullopt);
      }
      const json& spec = step.at("spec_candidate_ids_table");
      if (spec.contains(key)) {
        EXPECT_EQ(view->spec_candidate_ids, spec.at(key).get<std::vector<int32_t>>());
      } else {
        EXPECT_EQ(view->spec_candidate_ids, std::nullopt);
      }
      const json& failure = step.at("failure_record");
      if (failure.is_null()) {
        EXPECT_EQ(view->failure_reason, "");
      } else {
        EXPECT_THAT(view->failure_reason, HasSubstr(failure.get<std::string>()));
      }

      // A state change is reported once, with the published token on Success.
      if (view->state != before) {
        ASSERT_EQ(out.events.size(), 1u);
        EXPECT_EQ(out.events[0].room, room);
        EXPECT_EQ(out.events[0].state, view->state);
        if (view->state == TransferPoll::kSuccess) {
          EXPECT_EQ(out.events[0].bootstrap_token, view->bootstrap_token.value_or(-1));
          EXPECT_EQ(out.events[0].spec_candidate_ids, view->spec_candidate_ids);
        }
        if (view->state == TransferPoll::kFailed) {
          EXPECT_EQ(out.events[0].reason, view->failure_reason);
        }
      } else {
        EXPECT_TRUE(out.events.empty());
      }
    }
  }
}

}  // namespace
}  // namespace kvrail::session
