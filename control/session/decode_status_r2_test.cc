// Replays the `apply` sequences of tests/data/cachepd/r2/status_r2.json (the newer reference's
// _handle_prefill_status and pop_prefill_metadata, CACHEPD §12.9) against DecodeRooms: after
// each step the room state and the cached-token table, and at the end the published token,
// ids, cached tokens and logprob, in the room's view and in its Success event.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"
#include "control/session/decode_rooms.h"
#include "control/session/test_peers.h"
#include "control/session/transfer_poll.h"
#include "control/wire/byte_order.h"
#include "tests/support/vectors.h"

namespace kvrail::session {
namespace {

using kvrail::session::testing::DecodeContract;
using kvrail::session::testing::DecodeManifest;
using kvrail::testing::FromHex;
using nlohmann::json;
using ::testing::HasSubstr;

const json& StatusFile() {
  static const json* file = new json(kvrail::testing::LoadVectors("r2/status_r2.json"));
  return *file;
}

DecodeRooms MakeRooms(bool lenient) {
  DecodeIdentity identity;
  identity.endpoint = "10.2.0.1";
  identity.port = 18000;
  identity.session_id = "10.2.0.1:16000";
  identity.arena_base = 0x7e0000000000;
  identity.contract = DecodeContract();
  identity.decode_tp_size = 4;
  identity.decode_tp_rank = 0;
  DecodeOptions options;
  options.lenient_status = lenient;
  absl::StatusOr<DecodeRooms> rooms = DecodeRooms::Create(identity, options);
  EXPECT_TRUE(rooms.ok()) << rooms.status();
  return *std::move(rooms);
}

// The room waits for the Success of the case's expected ranks (WaitingForInput).
void Prepare(DecodeRooms& rooms, const json& sequence, absl::Time now) {
  const uint64_t room = sequence.at("room").get<uint64_t>();
  ASSERT_TRUE(rooms.BeginRoom(room, "10.1.0.9:8998", now).ok());
  RoomRoute route;
  route.targets.expected_prefill_ranks =
      sequence.at("expected_prefill_ranks").get<std::vector<int>>();
  route.targets.target_tp_ranks = route.targets.expected_prefill_ranks;
  for (int rank : route.targets.target_tp_ranks) {
    route.endpoints.push_back({rank, absl::StrCat("tcp://10.1.0.", rank + 1, ":", 17000 + rank)});
  }
  ASSERT_TRUE(rooms.OnRoute(room, route, now).ok());
  ASSERT_TRUE(rooms.OnAllocated(room, DecodeManifest(), now).ok());
  ASSERT_EQ(TransferPollCode(*rooms.State(room)), sequence.at("initial_status").get<int>());
}

std::optional<double> Logprob(const json& value) {
  if (value.is_null()) return std::nullopt;
  return absl::bit_cast<double>(
      wire::DecodeLittleEndian64(FromHex(value.at("hex_le").get<std::string>())));
}

void Replay(const json& sequence, bool lenient) {
  DecodeRooms rooms = MakeRooms(lenient);
  const uint64_t room = sequence.at("room").get<uint64_t>();
  absl::Time now = absl::UnixEpoch();
  Prepare(rooms, sequence, now);
  std::optional<RoomEvent> success;
  for (const json& step : sequence.at("steps")) {
    now += absl::Seconds(1);
    std::vector<std::string> frames;
    for (const json& hex : step.at("frames_hex")) frames.push_back(FromHex(hex.get<std::string>()));
    DecodeOutput out = rooms.OnMessage(frames, now);
    EXPECT_EQ(out.rejected.ok(), step.at("handled").get<bool>()) << out.rejected;
    for (const RoomEvent& event : out.events) {
      if (event.state == TransferPoll::kSuccess) success = event;
    }
    std::optional<DecodeRoomView> view = rooms.Find(room);
    ASSERT_TRUE(view.has_value());
    EXPECT_EQ(TransferPollCode(view->state), step.at("status_after").get<int>());
    // null: the reference has no entry for the room, which reads as 0 (pop_prefill_metadata).
    EXPECT_EQ(view->cached_tokens, step.at("cached_tokens_table").is_null()
                                       ? 0
                                       : step.at("cached_tokens_table").get<int64_t>());
  }
  std::optional<DecodeRoomView> view = rooms.Find(room);
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(TransferPollCode(view->state), sequence.at("final_status").get<int>());
  const json& failure = sequence.at("failure");
  if (!failure.is_null()) {
    EXPECT_THAT(view->failure_reason, HasSubstr(failure.get<std::string>()));
  }

  const json& popped = sequence.at("pop_prefill_metadata");
  const int64_t token = popped.at("bootstrap_token").get<int64_t>();
  const std::optional<double> logprob = Logprob(popped.at("bootstrap_logprob"));
  const int64_t cached = popped.at("cached_tokens").get<int64_t>();
  if (view->state != TransferPoll::kSuccess) {
    EXPECT_FALSE(success.has_value());
    return;
  }
  EXPECT_EQ(view->bootstrap_token.value_or(-1), token);
  EXPECT_EQ(view->bootstrap_logprob, logprob);
  EXPECT_EQ(view->cached_tokens, cached);
  ASSERT_TRUE(success.has_value());
  EXPECT_EQ(success->bootstrap_token, token);
  EXPECT_EQ(success->spec_candidate_ids, std::nullopt);
  EXPECT_EQ(success->cached_tokens, cached);
  EXPECT_EQ(success->bootstrap_logprob, logprob);
}

TEST(DecodeStatusR2Test, FileHasApplySequences) {
  EXPECT_EQ(StatusFile().value("format", ""), "cachepd-status-r2");
  EXPECT_FALSE(StatusFile().at("apply").empty());
}

TEST(DecodeStatusR2Test, EveryApplySequenceMatchesTheNewerReferenceWithTheStrictReader) {
  for (const json& sequence : StatusFile().at("apply")) {
    SCOPED_TRACE(sequence.at("name").get<std::string>());
    Replay(sequence, /*lenient=*/false);
  }
}

TEST(DecodeStatusR2Test, EveryApplySequenceMatchesTheNewerReferenceWithTheLenientReader) {
  for (const json& sequence : StatusFile().at("apply")) {
    SCOPED_TRACE(sequence.at("name").get<std::string>());
    Replay(sequence, /*lenient=*/true);
  }
}

}  // namespace
}  // namespace kvrail::session
