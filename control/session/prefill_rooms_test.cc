// PrefillRooms behaviour beyond the reference scenarios (prefill_scenarios_test.cc): copy
// work, status frames, the byte cap, timeouts, quarantine, remembered failed rooms, restarted
// decodes, malformed input, and forward-only state over random operation sequences.
#include "control/session/prefill_rooms.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "control/layout/kv_shape.h"
#include "control/layout/revision.h"
#include "control/session/test_peers.h"
#include "control/session/test_transfers.h"
#include "control/wire/fence.h"
#include "control/wire/outcome.h"
#include "control/wire/registration.h"
#include "control/wire/status.h"
#include "engine/base/error.h"

namespace kvrail::session {
namespace {

using kvrail::session::testing::DecodeManifest;
using kvrail::session::testing::DecodeManifestWire;
using kvrail::session::testing::FailAll;
using kvrail::session::testing::LandAll;
using kvrail::session::testing::Post;
using kvrail::session::testing::PreallocationFrames;
using kvrail::session::testing::PrefillContract;
using kvrail::session::testing::RegistrationFrames;
using kvrail::session::testing::RegistrationFramesInForm;
using kvrail::session::testing::ReplyEndpointOf;
using kvrail::session::testing::SessionOf;
using kvrail::session::testing::SourceManifest;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const absl::Time kT0 = absl::UnixEpoch() + absl::Hours(1);

PrefillRooms MakeRooms(PrefillOptions options = {}, int rank = 0) {
  PrefillIdentity identity;
  identity.prefill_tp_size = 2;
  identity.prefill_tp_rank = rank;
  identity.contract = PrefillContract();
  absl::StatusOr<PrefillRooms> rooms = PrefillRooms::Create(identity, options);
  EXPECT_TRUE(rooms.ok()) << rooms.status();
  return *std::move(rooms);
}

// Registers decode ranks 0 and 1, the two that prefill rank 0 serves.
void RegisterBoth(PrefillRooms& rooms) {
  for (int d : {0, 1}) {
    PrefillOutput out = rooms.OnMessage(RegistrationFrames(d), kT0);
    ASSERT_TRUE(out.rejected.ok()) << out.rejected;
  }
}

PrefillOutput Preallocate(PrefillRooms& rooms, uint64_t room, int d, absl::Time now = kT0) {
  return rooms.OnMessage(PreallocationFrames(room, SessionOf(d), DecodeManifestWire()), now);
}

RoomReady ReadyWith(int64_t token, std::optional<std::vector<int32_t>> spec = {}) {
  RoomReady ready;
  ready.source_manifest = SourceManifest();
  ready.bootstrap_token = token;
  ready.spec_candidate_ids = std::move(spec);
  return ready;
}

// A room with both pre-allocations and the engine ready: its transfers (one per destination)
// are prepared and submitted, in flight.
TransferWork StartTransfer(PrefillRooms& rooms, uint64_t room) {
  EXPECT_TRUE(rooms.BeginRoom(room, kT0).ok());
  Preallocate(rooms, room, 0);
  Preallocate(rooms, room, 1);
  absl::StatusOr<PrefillOutput> out = rooms.Ready(room, ReadyWith(7, {{1, 2}}), kT0);
  EXPECT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->transfers.size(), 1u);
  if (out->transfers.empty()) return TransferWork{};
  PrefillOutput posted;
  EXPECT_EQ(Post(rooms, out->transfers.front(), kT0, posted).size(), 2u);
  EXPECT_TRUE(posted.events.empty());
  return out->transfers.front();
}

std::string Wire(const layout::Manifest& manifest) {
  absl::StatusOr<std::string> wire = layout::SerializeManifest(manifest);
  EXPECT_TRUE(wire.ok()) << wire.status();
  return wire.ok() ? *wire : std::string();
}

wire::StatusMessage ParsedStatus(const OutboundMessage& message) {
  absl::StatusOr<wire::StatusMessage> parsed = wire::ParseStatus(message.frames);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return parsed.ok() ? *parsed : wire::StatusMessage{};
}

// Registers decode ranks 0 and 1 with their contracts written in `forms[0]` and `forms[1]`.
void RegisterInForms(PrefillRooms& rooms, layout::Revision form0, layout::Revision form1) {
  for (auto [d, form] : {std::pair{0, form0}, std::pair{1, form1}}) {
    PrefillOutput out = rooms.OnMessage(RegistrationFramesInForm(d, form), kT0);
    ASSERT_TRUE(out.rejected.ok()) << out.rejected;
  }
}

std::vector<TransferPoll> States(const PrefillOutput& out) {
  std::vector<TransferPoll> states;
  for (const RoomEvent& e : out.events) states.push_back(e.state);
  return states;
}

TEST(PrefillRoomsTest, CreateChecksTheRank) {
  PrefillIdentity identity;
  identity.contract = PrefillContract();
  identity.prefill_tp_size = 2;
  identity.prefill_tp_rank = 2;
  EXPECT_EQ(PrefillRooms::Create(identity).status().code(), absl::StatusCode::kInvalidArgument);
  identity.prefill_tp_size = 0;
  identity.prefill_tp_rank = 0;
  EXPECT_EQ(PrefillRooms::Create(identity).status().code(), absl::StatusCode::kInvalidArgument);
  // A pipeline's global rank (stage-major, CACHEPD §10.1) past what a status can carry.
  identity.prefill_tp_size = 2;
  identity.prefill_tp_rank = 1;
  identity.status_rank = 1024;
  absl::Status refused = PrefillRooms::Create(identity).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.message(), "status rank 1024 is outside 0..1023"))
      << refused;
  identity.status_rank = 1023;
  EXPECT_TRUE(PrefillRooms::Create(identity).ok());
}

TEST(PrefillRoomsTest, CompletedPreallocationsMakeTheRoomBootstrapped) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  absl::StatusOr<PrefillOutput> begun = rooms.BeginRoom(42, kT0);
  ASSERT_TRUE(begun.ok());
  EXPECT_THAT(States(*begun), ElementsAre(TransferPoll::kBootstrapping));
  EXPECT_TRUE(States(Preallocate(rooms, 42, 0)).empty());
  PrefillOutput second = Preallocate(rooms, 42, 1);
  EXPECT_THAT(States(second), ElementsAre(TransferPoll::kBootstrapped));
  EXPECT_TRUE(second.messages.empty());
  EXPECT_TRUE(second.transfers.empty());  // the engine is not ready yet
}

TEST(PrefillRoomsTest, ReadyHandsBackOneDestinationPerPreallocationInArrivalOrder) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  ASSERT_TRUE(rooms.BeginRoom(42, kT0).ok());
  Preallocate(rooms, 42, 1);
  Preallocate(rooms, 42, 0);
  absl::StatusOr<PrefillOutput> out = rooms.Ready(42, ReadyWith(151643, {{5, 6}}), kT0);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->transfers.size(), 1u);
  const TransferWork& work = out->transfers[0];
  EXPECT_EQ(work.room, 42u);
  ASSERT_EQ(work.destinations.size(), 2u);
  EXPECT_EQ(work.destinations[0].peer->registration.session_id, SessionOf(1));
  EXPECT_EQ(work.destinations[1].peer->registration.session_id, SessionOf(0));
  for (const TransferDestination& d : work.destinations) {
    EXPECT_EQ(d.peer->registration.arena_base, 0x7e0000000000u);
    ASSERT_NE(d.peer->copy_plan, nullptr);
    ASSERT_NE(d.manifest, nullptr);
    EXPECT_EQ(Wire(*d.manifest), Wire(DecodeManifest()));
    EXPECT_EQ(d.bytes, 114u);  // prefill_scenarios.json happy_path_fanout engine_calls
  }
  EXPECT_EQ(work.total_bytes, 228u);
  EXPECT_EQ(Wire(*work.source_manifest), Wire(SourceManifest()));
  EXPECT_TRUE(out->messages.empty());  // nothing is sent before the data landed
  EXPECT_EQ(rooms.Find(42)->transfer, TransferPhase::kPreparing);
}

TEST(PrefillRoomsTest, TransferDoneSendsSuccessWithRankTokenAndSpecIdsToEachDestination) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  StartTransfer(rooms, 42);
  absl::StatusOr<PrefillOutput> done = LandAll(rooms, 42, kT0);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->messages.size(), 2u);
  EXPECT_EQ(done->messages[0].endpoint, ReplyEndpointOf(0));
  EXPECT_EQ(done->messages[1].endpoint, ReplyEndpointOf(1));
  for (const OutboundMessage& m : done->messages) {
    wire::StatusMessage status = ParsedStatus(m);
    EXPECT_EQ(status.room, 42u);
    EXPECT_EQ(status.status, 5);
    EXPECT_EQ(status.prefill_rank, 0u);
    EXPECT_EQ(status.bootstrap_token, 7);
    EXPECT_EQ(status.spec_candidate_ids, (std::vector<int32_t>{1, 2}));
  }
  EXPECT_THAT(States(*done), ElementsAre(TransferPoll::kSuccess));
  EXPECT_TRUE(rooms.Find(42)->preallocated_sessions.empty());
  EXPECT_FALSE(LandAll(rooms, 42, kT0).ok());  // once only
}

// The engine's Begin is owed the room's Bootstrapped (with the decodes' windows) once, whether
// the pre-allocations complete after the Begin or came before it; a room begun by its Ready
// announces nothing. The mark lives in the room's entry, not in a table beside it.
TEST(PrefillRoomsTest, ABegunRoomAnnouncesItsBootstrappedOnceWhicheverComesFirst) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  auto announced = [](const PrefillOutput& out) {
    int count = 0;
    for (const RoomEvent& e : out.events) {
      if (e.announce) {
        EXPECT_EQ(e.state, TransferPoll::kBootstrapped);
        EXPECT_EQ(e.windows.size(), 2u) << "announced without the decodes' windows";
        ++count;
      }
    }
    return count;
  };
  // Begin first, pre-allocations later.
  absl::StatusOr<PrefillOutput> begun = rooms.BeginRoom(1, kT0, /*announce=*/true);
  ASSERT_TRUE(begun.ok()) << begun.status();
  EXPECT_EQ(announced(*begun), 0);
  EXPECT_EQ(announced(Preallocate(rooms, 1, 0)), 0);
  EXPECT_EQ(announced(Preallocate(rooms, 1, 1)), 1);
  EXPECT_EQ(announced(*rooms.BeginRoom(1, kT0, /*announce=*/true)), 0) << "announced twice";
  // Pre-allocations first, Begin later.
  Preallocate(rooms, 2, 0);
  Preallocate(rooms, 2, 1);
  EXPECT_EQ(announced(*rooms.BeginRoom(2, kT0, /*announce=*/true)), 1);
  EXPECT_EQ(announced(*rooms.BeginRoom(2, kT0, /*announce=*/true)), 0) << "announced twice";
  // Begun by its Ready (no announce), and a later Begin does not re-arm it.
  ASSERT_TRUE(rooms.BeginRoom(3, kT0).ok());
  EXPECT_EQ(announced(*rooms.BeginRoom(3, kT0, /*announce=*/true)), 0);
  Preallocate(rooms, 3, 0);
  EXPECT_EQ(announced(Preallocate(rooms, 3, 1)), 0);
}

// --verify-digest: the digest of what the room wrote to a destination lives in the room's
// entry: kept only for a destination it has, taken once by the Success to it, and gone with the
// room.
TEST(PrefillRoomsTest, ASentDigestIsKeptWithItsRoomForItsDestinationAndGoesWithIt) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  EXPECT_EQ(rooms.KeepSentDigest(42, ReplyEndpointOf(0), 0x1).code(), absl::StatusCode::kNotFound);
  StartTransfer(rooms, 42);
  absl::Status stranger = rooms.KeepSentDigest(42, "tcp://10.9.9.9:1", 0x1);
  EXPECT_EQ(stranger.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(stranger.message().find("room 42 has no destination at tcp://10.9.9.9:1"),
            std::string::npos)
      << stranger;
  ASSERT_TRUE(rooms.KeepSentDigest(42, ReplyEndpointOf(0), 0xa0).ok());
  ASSERT_TRUE(rooms.KeepSentDigest(42, ReplyEndpointOf(1), 0xa1).ok());
  EXPECT_EQ(rooms.TakeSentDigest(42, ReplyEndpointOf(0)), 0xa0u);
  EXPECT_EQ(rooms.TakeSentDigest(42, ReplyEndpointOf(0)), std::nullopt) << "taken twice";
  ASSERT_TRUE(LandAll(rooms, 42, kT0).ok());
  rooms.Free(42, kT0);
  EXPECT_EQ(rooms.TakeSentDigest(42, ReplyEndpointOf(1)), std::nullopt)
      << "a digest outlived its room";
}

// Row staging: the answer to a destination's staging offer lives in the room's entry as the
// digest does, kept per destination, taken once by the Success to it, and gone with the room.
TEST(PrefillRoomsTest, AStagingAnswerIsKeptWithItsRoomForItsDestinationAndGoesWithIt) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  EXPECT_EQ(rooms.KeepStagingAnswer(42, ReplyEndpointOf(0), true).code(),
            absl::StatusCode::kNotFound);
  StartTransfer(rooms, 42);
  EXPECT_EQ(rooms.KeepStagingAnswer(42, "tcp://10.9.9.9:1", true).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(rooms.KeepStagingAnswer(42, ReplyEndpointOf(0), true).ok());
  ASSERT_TRUE(rooms.KeepStagingAnswer(42, ReplyEndpointOf(1), false).ok());
  EXPECT_EQ(rooms.TakeStagingAnswer(42, ReplyEndpointOf(0)), true);
  EXPECT_EQ(rooms.TakeStagingAnswer(42, ReplyEndpointOf(0)), std::nullopt) << "taken twice";
  ASSERT_TRUE(LandAll(rooms, 42, kT0).ok());
  rooms.Free(42, kT0);
  EXPECT_EQ(rooms.TakeStagingAnswer(42, ReplyEndpointOf(1)), std::nullopt)
      << "an answer outlived its room";
}

// kvrail peers (PrefillOptions::send_outcomes): right before each Success, a room outcome
// (wire/outcome.h) with what this rank wrote to that destination.
TEST(PrefillRoomsTest, ASuccessIsPrecededByTheBytesAndCopiesWrittenToThatDestination) {
  PrefillOptions options;
  options.send_outcomes = true;
  PrefillRooms rooms = MakeRooms(options);
  RegisterBoth(rooms);
  TransferWork work = StartTransfer(rooms, 42);
  absl::StatusOr<PrefillOutput> done =
      LandAll(rooms, 42, kT0, {{SessionOf(0), 3}, {SessionOf(1), 4}});
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->messages.size(), 4u);
  for (int d : {0, 1}) {
    const OutboundMessage& told = done->messages[2 * d];
    EXPECT_EQ(told.endpoint, ReplyEndpointOf(d));
    absl::StatusOr<wire::RoomOutcomeMessage> outcome = wire::ParseRoomOutcome(told.frames);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    EXPECT_EQ(outcome->room, 42u);
    EXPECT_EQ(outcome->bytes, work.destinations[d].bytes);
    EXPECT_EQ(outcome->copies, d == 0 ? 3u : 4u);
    EXPECT_EQ(outcome->cause, "");
    EXPECT_EQ(ParsedStatus(done->messages[2 * d + 1]).status, 5);
  }
}

// The newcomer's finding: the decode was told "it might be dead" when the prefill's engine
// aborted. Between kvrail peers the Failed is preceded by the prefill's own cause and reason.
TEST(PrefillRoomsTest, AFailedIsPrecededByThePrefillsOwnCauseAndReason) {
  PrefillOptions options;
  options.send_outcomes = true;
  PrefillRooms rooms = MakeRooms(options);
  RegisterBoth(rooms);
  ASSERT_TRUE(rooms.BeginRoom(42, kT0).ok());
  Preallocate(rooms, 42, 0);
  PrefillOutput aborted = rooms.Abort(42, "aborted by its engine: preempted", kT0);
  ASSERT_EQ(aborted.messages.size(), 2u);
  absl::StatusOr<wire::RoomOutcomeMessage> outcome =
      wire::ParseRoomOutcome(aborted.messages[0].frames);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->cause, "aborted");
  EXPECT_EQ(outcome->reason, "aborted by its engine: preempted");
  EXPECT_EQ(ParsedStatus(aborted.messages[1]).status, 0);
}

// CACHEPD §12.9, §12.11: each decode peer is answered in the form its registration contract came
// in: 7 frames (cached tokens, logprob) for a 2026-09 contract, 5 for a snapshot one.
TEST(PrefillRoomsTest, ASuccessIsSentInEachPeersFormWithTheReadysCachedTokensAndLogprob) {
  PrefillRooms rooms = MakeRooms();
  RegisterInForms(rooms, layout::Revision::k2026_09, layout::Revision::kSnapshot);
  ASSERT_TRUE(rooms.BeginRoom(42, kT0).ok());
  Preallocate(rooms, 42, 0);
  Preallocate(rooms, 42, 1);
  RoomReady ready = ReadyWith(7);
  ready.cached_tokens = 5;
  ready.first_token_logprob = -0.25;
  ASSERT_TRUE(rooms.Ready(42, ready, kT0).ok());
  absl::StatusOr<PrefillOutput> done = LandAll(rooms, 42, kT0);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->messages.size(), 2u);
  EXPECT_EQ(done->messages[0].endpoint, ReplyEndpointOf(0));
  EXPECT_THAT(done->messages[0].frames,
              ElementsAre("42", "5", "0", "7", "", "5", std::string("\0\0\0\0\0\0\xd0\xbf", 8)));
  EXPECT_EQ(done->messages[1].endpoint, ReplyEndpointOf(1));
  EXPECT_THAT(done->messages[1].frames, ElementsAre("42", "5", "0", "7", ""));
}

// CACHEPD §12.9: a Failed carries 0 cached tokens and no logprob, whatever the Ready said.
TEST(PrefillRoomsTest, AFailedIsSentInEachPeersFormWithZeroCachedTokensAndNoLogprob) {
  PrefillRooms rooms = MakeRooms();
  RegisterInForms(rooms, layout::Revision::k2026_09, layout::Revision::kSnapshot);
  ASSERT_TRUE(rooms.BeginRoom(43, kT0).ok());
  Preallocate(rooms, 43, 0);
  Preallocate(rooms, 43, 1);
  PrefillOutput aborted = rooms.Abort(43, "scheduler abort", kT0);
  ASSERT_EQ(aborted.messages.size(), 2u);
  EXPECT_THAT(aborted.messages[0].frames, ElementsAre("43", "0", "0", "-1", "", "0", ""));
  EXPECT_THAT(aborted.messages[1].frames, ElementsAre("43", "0", "0", "-1", ""));
}

TEST(PrefillRoomsTest, ReadyRefusesCachedTokensOutsideThePromptAndANonLogprob) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  ASSERT_TRUE(rooms.BeginRoom(44, kT0).ok());
  const int64_t prompt_len = SourceManifest().prompt_len;
  RoomReady too_many = ReadyWith(7);
  too_many.cached_tokens = prompt_len + 1;
  absl::Status refused = rooms.Ready(44, too_many, kT0).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr(absl::StrCat("cached_tokens ", prompt_len + 1, " must lie in [0, ",
                                     prompt_len, "], the prompt length")));
  RoomReady negative = ReadyWith(7);
  negative.cached_tokens = -1;
  EXPECT_THAT(std::string(rooms.Ready(44, negative, kT0).status().message()),
              HasSubstr("cached_tokens -1 must lie in"));
  RoomReady nan = ReadyWith(7);
  nan.first_token_logprob = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(std::string(rooms.Ready(44, nan, kT0).status().message()),
              HasSubstr("first_token_logprob nan is not a log-probability"));
  RoomReady plus_inf = ReadyWith(7);
  plus_inf.first_token_logprob = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(rooms.Ready(44, plus_inf, kT0).ok());
  // Nothing was stored: a valid Ready is still the room's first.
  RoomReady all = ReadyWith(7);
  all.cached_tokens = prompt_len;
  all.first_token_logprob = -std::numeric_limits<double>::infinity();
  EXPECT_TRUE(rooms.Ready(44, all, kT0).ok());
}

TEST(PrefillRoomsTest, NoTokenAndNoSpecIdsAreSentAsMinusOneAndAnEmptyFrame) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);  // the scenario's contract: the snapshot's form, so 5 frames
  ASSERT_TRUE(rooms.BeginRoom(3, kT0).ok());
  Preallocate(rooms, 3, 0);
  Preallocate(rooms, 3, 1);
  ASSERT_TRUE(rooms.Ready(3, ReadyWith(-1, std::vector<int32_t>{}), kT0).ok());
  absl::StatusOr<PrefillOutput> done = LandAll(rooms, 3, kT0);
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(done->messages.size(), 2u);
  EXPECT_THAT(done->messages[0].frames, ElementsAre("3", "5", "0", "-1", ""));
}

TEST(PrefillRoomsTest, ReadyBeforeThePreallocationsStartsTheTransferWhenTheyComplete) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  ASSERT_TRUE(rooms.BeginRoom(8, kT0).ok());
  absl::StatusOr<PrefillOutput> ready = rooms.Ready(8, ReadyWith(1), kT0);
  ASSERT_TRUE(ready.ok());
  EXPECT_TRUE(ready->transfers.empty());
  EXPECT_TRUE(Preallocate(rooms, 8, 0).transfers.empty());
  PrefillOutput last = Preallocate(rooms, 8, 1);
  EXPECT_THAT(States(last), ElementsAre(TransferPoll::kBootstrapped));
  ASSERT_EQ(last.transfers.size(), 1u);
  EXPECT_EQ(last.transfers[0].destinations.size(), 2u);
}

TEST(PrefillRoomsTest, ReadyRefusesUnknownRoomsRepeatsAndBadTokens) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  EXPECT_EQ(rooms.Ready(5, ReadyWith(1), kT0).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(rooms.BeginRoom(5, kT0).ok());
  EXPECT_EQ(rooms.Ready(5, ReadyWith(-2), kT0).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(rooms.Ready(5, ReadyWith(1), kT0).ok());
  EXPECT_EQ(rooms.Ready(5, ReadyWith(1), kT0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(PrefillRoomsTest, RoomOverTheByteCapFailsNamingCapAndSizeAndCopiesNothing) {
  PrefillOptions options;
  options.max_room_bytes = 200;
  PrefillRooms rooms = MakeRooms(options);
  RegisterBoth(rooms);
  ASSERT_TRUE(rooms.BeginRoom(42, kT0).ok());
  Preallocate(rooms, 42, 0);
  Preallocate(rooms, 42, 1);
  absl::StatusOr<PrefillOutput> out = rooms.Ready(42, ReadyWith(1), kT0);
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(out->transfers.empty());
  ASSERT_THAT(States(*out), ElementsAre(TransferPoll::kFailed));
  EXPECT_THAT(out->events[0].reason, HasSubstr("228 bytes"));
  EXPECT_THAT(out->events[0].reason, HasSubstr("cap of 200 bytes"));
  ASSERT_EQ(out->messages.size(), 2u);  // the decode ranks learn at once
  EXPECT_EQ(ParsedStatus(out->messages[0]).status, 0);
  EXPECT_FALSE(rooms.Find(42)->transfer.has_value());
}

TEST(PrefillRoomsTest, RoomExactlyAtTheByteCapIsSent) {
  PrefillOptions options;
  options.max_room_bytes = 228;
  PrefillRooms rooms = MakeRooms(options);
  RegisterBoth(rooms);
  EXPECT_EQ(StartTransfer(rooms, 42).total_bytes, 228u);
}

// The decodes' windows are known once the room is Bootstrapped (its Bootstrapped event carried
// them): a Ready that contradicts them is refused in its reply and changes nothing.
TEST(PrefillRoomsTest, AReadyWhoseWindowDiffersFromTheDecodesIsRefusedAndLeavesTheRoomAsItWas) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  ASSERT_TRUE(rooms.BeginRoom(42, kT0).ok());
  Preallocate(rooms, 42, 0);
  Preallocate(rooms, 42, 1);
  RoomReady ready = ReadyWith(1);
  ready.source_manifest->prefix_len = 4;
  ready.source_manifest->groups[0].block_ids = {2, 3};
  absl::StatusOr<PrefillOutput> out = rooms.Ready(42, ready, kT0);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("covers the window [4, 7)"));
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("pre-allocated [2, 7)"));
  EXPECT_THAT(out.status().message(), HasSubstr(SessionOf(0)));
  EXPECT_EQ(rooms.State(42), TransferPoll::kBootstrapped);
  EXPECT_FALSE(rooms.Find(42)->ready);
  absl::StatusOr<PrefillOutput> right = rooms.Ready(42, ReadyWith(1), kT0);
  ASSERT_TRUE(right.ok()) << right.status();
  EXPECT_EQ(right->transfers.size(), 1u);
}

// Before the decodes pre-allocated, their window is not known: the room fails when the work is
// built (CACHEPD §6.9).
TEST(PrefillRoomsTest, AWindowOnlyKnownAfterTheReadyFailsTheRoomWhenItIsKnown) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  ASSERT_TRUE(rooms.BeginRoom(42, kT0).ok());
  RoomReady ready = ReadyWith(1);
  ready.source_manifest->prefix_len = 4;
  ready.source_manifest->groups[0].block_ids = {2, 3};
  ASSERT_TRUE(rooms.Ready(42, ready, kT0).ok());
  Preallocate(rooms, 42, 0);
  PrefillOutput out = Preallocate(rooms, 42, 1);
  EXPECT_TRUE(out.transfers.empty());
  ASSERT_THAT(States(out), ElementsAre(TransferPoll::kBootstrapped, TransferPoll::kFailed));
  EXPECT_THAT(out.events[1].reason, HasSubstr("prompt window"));
}

// Failed means fenced: an abort while the transfer is in flight asks for the fence, and the
// Failed (frames and event) goes out only once the transfer layer reports it.
TEST(PrefillRoomsTest, AbortDuringTheTransferWaitsForTheFenceBeforeSendingFailed) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  StartTransfer(rooms, 42);
  PrefillOutput aborted = rooms.Abort(42, "the engine aborted", kT0);
  EXPECT_THAT(aborted.fences, ElementsAre(42u));
  EXPECT_TRUE(aborted.messages.empty());
  EXPECT_TRUE(aborted.events.empty());
  EXPECT_EQ(rooms.Find(42)->transfer, TransferPhase::kFencing);
  EXPECT_NE(rooms.State(42), TransferPoll::kFailed);
  // A second abort asks nothing more.
  EXPECT_TRUE(rooms.Abort(42, "again", kT0).fences.empty());

  PrefillOutput fenced = FailAll(rooms, 42, SessionOf(0), "cancelled", kT0,
                                 /*fence_proven=*/true, FailureCause::kBounds);
  ASSERT_EQ(fenced.messages.size(), 2u);
  EXPECT_EQ(ParsedStatus(fenced.messages[0]).status, 0);
  EXPECT_EQ(ParsedStatus(fenced.messages[0]).bootstrap_token, -1);
  ASSERT_THAT(States(fenced), ElementsAre(TransferPoll::kFailed));
  EXPECT_EQ(fenced.events[0].reason, "the engine aborted");
  // The fence's own failure (a cancel, here said as a bounds one) does not replace the cause.
  EXPECT_EQ(fenced.events[0].cause, FailureCause::kAborted);
  // The engine's abort is nobody's fault: no quarantine.
  EXPECT_TRUE(rooms.QuarantinedSessions(kT0).empty());
  EXPECT_FALSE(rooms.Find(42)->transfer.has_value());
}

TEST(PrefillRoomsTest, AnAbortedRoomWhoseTransferLandedAnywayFailsAtItsFence) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  StartTransfer(rooms, 42);
  EXPECT_THAT(rooms.Abort(42, "scheduler gave up", kT0).fences, ElementsAre(42u));
  absl::StatusOr<PrefillOutput> done = LandAll(rooms, 42, kT0);
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(done->messages.size(), 2u);
  EXPECT_EQ(ParsedStatus(done->messages[0]).status, 0) << "Success after an abort";
  EXPECT_EQ(rooms.State(42), TransferPoll::kFailed);
  EXPECT_EQ(rooms.Find(42)->failure_reason, "scheduler gave up");
}

TEST(PrefillRoomsTest, ARestartedDecodeFencesItsRoomsInFlight) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  StartTransfer(rooms, 1);
  PrefillOutput restarted =
      rooms.OnMessage(RegistrationFrames(0, uint16_t{17100}, uint64_t{0x7f0000000000}), kT0);
  EXPECT_THAT(restarted.fences, ElementsAre(1u));
  EXPECT_TRUE(restarted.events.empty());
  PrefillOutput fenced = FailAll(rooms, 1, "", "cancelled", kT0);
  ASSERT_THAT(States(fenced), ElementsAre(TransferPoll::kFailed));
  EXPECT_THAT(fenced.events[0].reason, HasSubstr("restarted"));
  EXPECT_EQ(fenced.messages[0].endpoint, ReplyEndpointOf(0));  // the room's old route
}

std::vector<std::string> FenceRequestFrames(uint64_t room, int d) {
  return wire::BuildFenceRequest({room, SessionOf(d)}).value();
}

bool IsFencedAnswerFor(const OutboundMessage& message, uint64_t room, int d) {
  absl::StatusOr<wire::FencedAnswer> answer = wire::ParseFencedAnswer(message.frames);
  return answer.ok() && answer->room == room && answer->prefill_rank == 0 &&
         message.endpoint == ReplyEndpointOf(d);
}

TEST(PrefillRoomsTest, AFenceRequestForARoomInFlightIsAnsweredAfterItsFence) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  StartTransfer(rooms, 5);
  PrefillOutput asked = rooms.OnMessage(FenceRequestFrames(5, 1), kT0);
  EXPECT_TRUE(asked.rejected.ok()) << asked.rejected;
  EXPECT_THAT(asked.fences, ElementsAre(5u));
  EXPECT_TRUE(asked.messages.empty()) << "answered before the fence";
  PrefillOutput fenced = FailAll(rooms, 5, "", "cancelled", kT0);
  ASSERT_EQ(fenced.messages.size(), 3u);  // Failed to both destinations, then the answer
  EXPECT_TRUE(IsFencedAnswerFor(fenced.messages[2], 5, 1));
  EXPECT_THAT(fenced.events[0].reason, HasSubstr("gave the room up"));
  EXPECT_TRUE(rooms.QuarantinedSessions(kT0).empty());
}

TEST(PrefillRoomsTest, AFenceRequestForARoomNotMovingFailsItAndIsAnsweredAtOnce) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  ASSERT_TRUE(rooms.BeginRoom(6, kT0).ok());
  Preallocate(rooms, 6, 0);
  PrefillOutput asked = rooms.OnMessage(FenceRequestFrames(6, 0), kT0);
  ASSERT_THAT(States(asked), ElementsAre(TransferPoll::kFailed));
  ASSERT_EQ(asked.messages.size(), 2u);  // Failed to the pre-allocated destination, the answer
  EXPECT_TRUE(IsFencedAnswerFor(asked.messages[1], 6, 0));
  // The engine's Ready later is refused, naming the failure, and starts nothing.
  absl::StatusOr<PrefillOutput> ready = rooms.Ready(6, ReadyWith(1), kT0);
  EXPECT_THAT(ready.status().message(), HasSubstr("room 6 already failed: aborted by the decode"));
}

// The newcomer's finding: the decode gave the room up while the engine was in its forward
// pass. The room failed once (one event); the sidecar freed it at that event; the engine's
// later Ready is refused naming what happened, and nothing reports the room again.
TEST(PrefillRoomsTest, AReadyAfterTheDecodeGaveTheRoomUpIsRefusedNamingItAndReportsNothing) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  ASSERT_TRUE(rooms.BeginRoom(7, kT0).ok());
  Preallocate(rooms, 7, 0);
  Preallocate(rooms, 7, 1);
  PrefillOutput gave_up = rooms.OnMessage(FenceRequestFrames(7, 0), kT0);
  ASSERT_THAT(States(gave_up), ElementsAre(TransferPoll::kFailed));
  rooms.Free(7, kT0);  // the sidecar frees a room at its terminal event
  absl::StatusOr<PrefillOutput> ready = rooms.Ready(7, ReadyWith(1), kT0);
  EXPECT_EQ(ready.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(ready.status().message(), HasSubstr("room 7 already failed: aborted by the decode"));
  EXPECT_THAT(ready.status().message(), HasSubstr(SessionOf(0)));
  EXPECT_THAT(ready.status().message(), ::testing::Not(HasSubstr("never begun")));
  absl::StatusOr<PrefillOutput> layers = rooms.LayersReady(7, SourceManifest(), 1, kT0);
  EXPECT_THAT(layers.status().message(), HasSubstr("room 7 already failed: "));
  absl::StatusOr<PrefillOutput> begun = rooms.BeginRoom(7, kT0);
  EXPECT_THAT(begun.status().message(), HasSubstr("room 7 already failed: "));
}

// Exactly one terminal event per room, whatever follows its end: an engine's Begin, Ready,
// LayersReady and Abort, a late fence request or pre-allocation, a dropped session, ticks.
TEST(PrefillRoomsTest, ARoomReportsExactlyOneTerminalEventWhateverFollows) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  std::vector<RoomEvent> events;
  const auto keep = [&events](const PrefillOutput& out) {
    events.insert(events.end(), out.events.begin(), out.events.end());
  };
  const auto keep_or = [&keep](const absl::StatusOr<PrefillOutput>& out) {
    if (out.ok()) keep(*out);
  };
  keep_or(rooms.BeginRoom(7, kT0));
  keep(Preallocate(rooms, 7, 0));
  keep(rooms.Abort(7, "aborted by the engine", kT0));
  keep(rooms.Abort(7, "again", kT0));
  keep(rooms.OnMessage(FenceRequestFrames(7, 0), kT0));
  keep(Preallocate(rooms, 7, 1));
  keep_or(rooms.BeginRoom(7, kT0));
  keep_or(rooms.Ready(7, ReadyWith(1), kT0));
  keep_or(rooms.LayersReady(7, SourceManifest(), 1, kT0));
  keep(rooms.Tick(kT0 + absl::Seconds(1)));
  rooms.Free(7, kT0);
  keep_or(rooms.Ready(7, ReadyWith(1), kT0));
  keep(rooms.Abort(7, "after free", kT0));
  PrefillOutput dropped;
  rooms.DropSession(SessionOf(0), "gone", kT0, dropped);
  keep(dropped);
  keep(rooms.AbortBegunRooms("engine restarted", kT0));
  int terminal = 0;
  for (const RoomEvent& e : events) {
    if (e.state == TransferPoll::kFailed || e.state == TransferPoll::kSuccess) ++terminal;
  }
  EXPECT_EQ(terminal, 1);
}

TEST(PrefillRoomsTest, AFenceRequestForAnUnknownOrEndedRoomIsAnsweredAtOnceAndMakesNoState) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  PrefillOutput unknown = rooms.OnMessage(FenceRequestFrames(77, 0), kT0);
  ASSERT_EQ(unknown.messages.size(), 1u);
  EXPECT_TRUE(IsFencedAnswerFor(unknown.messages[0], 77, 0));
  EXPECT_FALSE(rooms.Find(77).has_value());
  StartTransfer(rooms, 8);
  ASSERT_TRUE(LandAll(rooms, 8, kT0).ok());
  PrefillOutput ended = rooms.OnMessage(FenceRequestFrames(8, 1), kT0);
  ASSERT_EQ(ended.messages.size(), 1u);
  EXPECT_TRUE(IsFencedAnswerFor(ended.messages[0], 8, 1));
  EXPECT_EQ(rooms.State(8), TransferPoll::kSuccess);
}

TEST(PrefillRoomsTest, AFenceRequestFromAnUnregisteredSessionOrMalformedIsOnlyRefused) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  StartTransfer(rooms, 9);
  PrefillOutput stranger =
      rooms.OnMessage(wire::BuildFenceRequest({9, "203.0.113.9:1"}).value(), kT0);
  EXPECT_THAT(stranger.rejected.message(), HasSubstr("unregistered"));
  EXPECT_TRUE(stranger.fences.empty());
  EXPECT_TRUE(stranger.messages.empty());
  std::vector<std::string> bad = FenceRequestFrames(9, 0);
  bad[1] = "09";
  EXPECT_THAT(rooms.OnMessage(bad, kT0).rejected.message(), HasSubstr("frame 1 (room)"));
  EXPECT_FALSE(rooms.Find(9)->transfer == TransferPhase::kFencing);
}

TEST(PrefillRoomsTest, AFailedRoomKeepsItsFirstReason) {
  PrefillRooms rooms = MakeRooms();
  ASSERT_TRUE(rooms.BeginRoom(9, kT0).ok());
  rooms.Abort(9, "first", kT0);
  PrefillOutput again = rooms.Abort(9, "second", kT0);
  EXPECT_TRUE(again.events.empty());
  EXPECT_EQ(rooms.Find(9)->failure_reason, "first");
}

// 20,000 engine Aborts of rooms nobody named (the issue) make no state.
TEST(PrefillRoomsTest, AnAbortOfAnUnknownRoomMakesNoState) {
  PrefillRooms rooms = MakeRooms();
  for (uint64_t room = 1; room <= 20000; ++room) {
    PrefillOutput out = rooms.Abort(room, "the client went away", kT0);
    EXPECT_TRUE(out.events.empty());
    EXPECT_EQ(out.rejected.code(), absl::StatusCode::kNotFound);
  }
  EXPECT_EQ(rooms.room_count(), 0u);
}

// The issue: 20,000 pre-allocations for rooms never made ready doubled the prefill's RSS.
TEST(PrefillRoomsTest, PreallocationsPastTheRoomBoundAreAnsweredFailedAndStoreNothing) {
  PrefillOptions options;
  options.max_rooms = 100;
  PrefillRooms rooms = MakeRooms(options);
  RegisterBoth(rooms);
  // Ten times the bound: every one past it is refused the same way (20,000 proved no more and
  // took 17 s under ASan).
  for (uint64_t room = 1; room <= 1000; ++room) {
    (void)rooms.OnMessage(PreallocationFrames(room, SessionOf(0), DecodeManifestWire()), kT0);
  }
  EXPECT_EQ(rooms.room_count(), 100u);
  PrefillOutput refused =
      rooms.OnMessage(PreallocationFrames(1001, SessionOf(0), DecodeManifestWire()), kT0);
  EXPECT_EQ(refused.rejected.code(), absl::StatusCode::kResourceExhausted) << refused.rejected;
  ASSERT_EQ(refused.messages.size(), 1u);  // Failed, to the decode
  EXPECT_EQ(rooms.room_count(), 100u);
}

// kvrail (unknown_sessions_change_nothing): a pre-allocation naming a session nobody registered
// cannot abort a room the engine began, nor leave a Failed room behind for each room id named.
TEST(PrefillRoomsTest, PreallocationsOfUnknownSessionsChangeNoRoom) {
  PrefillOptions options;
  options.unknown_sessions_change_nothing = true;
  PrefillRooms rooms = MakeRooms(options);
  RegisterBoth(rooms);
  ASSERT_TRUE(rooms.BeginRoom(3, kT0).ok());
  for (uint64_t room = 3; room < 2003; ++room) {
    PrefillOutput out =
        rooms.OnMessage(PreallocationFrames(room, "10.66.0.1:1", DecodeManifestWire()), kT0);
    EXPECT_EQ(out.rejected.code(), absl::StatusCode::kFailedPrecondition) << out.rejected;
    EXPECT_TRUE(out.events.empty());
  }
  EXPECT_EQ(rooms.room_count(), 1u);
  EXPECT_NE(rooms.State(3), TransferPoll::kFailed);
  Preallocate(rooms, 3, 0);
  Preallocate(rooms, 3, 1);
  EXPECT_EQ(rooms.State(3), TransferPoll::kBootstrapped);
}

// Sessions are bounded too (max_registrations): registrations of new sessions past it are
// rejected and store nothing; a registered session registering again is not refused.
TEST(PrefillRoomsTest, RegistrationsOfNewSessionsPastTheBoundAreRejected) {
  PrefillOptions options;
  options.max_registrations = 2;
  PrefillRooms rooms = MakeRooms(options);
  RegisterBoth(rooms);
  for (int i = 0; i < 100; ++i) {
    std::vector<std::string> frames = RegistrationFrames(0);
    frames[3] = absl::StrCat("10.9.", i / 250, ".", i % 250, ":15000");  // a new session id
    PrefillOutput out = rooms.OnMessage(frames, kT0);
    EXPECT_EQ(out.rejected.code(), absl::StatusCode::kResourceExhausted) << out.rejected;
    if (i == 0) {
      EXPECT_THAT(std::string(out.rejected.message()), HasSubstr("--max-registrations"));
    }
  }
  EXPECT_EQ(rooms.registration_count(), 2u);
  EXPECT_TRUE(rooms.OnMessage(RegistrationFrames(1), kT0).rejected.ok());
  EXPECT_TRUE(Preallocate(rooms, 5, 0).rejected.ok());
}

// One decode session filling the room table cannot lock out another (max_rooms_per_session),
// and a session that reached its bound gets rooms again once its rooms end.
TEST(PrefillRoomsTest, OneSessionsPreallocationsCannotLockOutAnother) {
  PrefillOptions options;
  options.max_rooms = 100;
  options.max_rooms_per_session = 10;
  PrefillRooms rooms = MakeRooms(options);
  RegisterBoth(rooms);
  for (uint64_t room = 1; room <= 1000; ++room) (void)Preallocate(rooms, room, 0);
  EXPECT_EQ(rooms.room_count(), 10u);
  PrefillOutput refused = Preallocate(rooms, 1001, 0);
  EXPECT_EQ(refused.rejected.code(), absl::StatusCode::kResourceExhausted) << refused.rejected;
  EXPECT_THAT(std::string(refused.rejected.message()), HasSubstr("--max-rooms-per-session"));
  ASSERT_EQ(refused.messages.size(), 1u);  // Failed, to that decode
  EXPECT_EQ(ParsedStatus(refused.messages[0]).status, static_cast<int>(TransferPoll::kFailed));
  // The other session is served: its pre-allocation completes room 1.
  PrefillOutput other = Preallocate(rooms, 1, 1);
  EXPECT_TRUE(other.rejected.ok()) << other.rejected;
  EXPECT_EQ(rooms.State(1), TransferPoll::kBootstrapped);
  // Room 2 ends (the engine aborts it): session 0 may pre-allocate one more room.
  EXPECT_TRUE(rooms.BeginRoom(2, kT0).ok());
  (void)rooms.Abort(2, "the engine gave up", kT0);
  rooms.Free(2, kT0);
  EXPECT_TRUE(Preallocate(rooms, 30000, 0).rejected.ok());
  EXPECT_EQ(Preallocate(rooms, 30001, 0).rejected.code(), absl::StatusCode::kResourceExhausted);
}

// kvrail (PrefillOptions::ignore_repeated_preallocations): the same session pre-allocating the
// same blocks again is ignored; the room goes on.
TEST(PrefillRoomsTest, ARepeatedPreallocationIsIgnoredWhenAskedTo) {
  PrefillOptions options;
  options.ignore_repeated_preallocations = true;
  PrefillRooms rooms = MakeRooms(options);
  RegisterBoth(rooms);
  const std::vector<std::string> frames =
      PreallocationFrames(12, SessionOf(0), DecodeManifestWire());
  rooms.OnMessage(frames, kT0);
  PrefillOutput again = rooms.OnMessage(frames, kT0);
  EXPECT_EQ(again.rejected.code(), absl::StatusCode::kAlreadyExists) << again.rejected;
  EXPECT_TRUE(again.messages.empty());
  EXPECT_NE(rooms.State(12), TransferPoll::kFailed);
}

// Exactly one terminal event per room: a Begin or Ready of a room that failed before the
// engine began it is refused, naming the failure, and reports nothing again.
TEST(PrefillRoomsTest, BeginAndReadyOfARoomThatAlreadyFailedAreRefusedNamingTheFailure) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  // A pre-allocation from an unknown session fails the room before the engine has it.
  PrefillOutput failed =
      rooms.OnMessage(PreallocationFrames(30, "10.9.9.9:1", DecodeManifestWire()), kT0);
  ASSERT_THAT(States(failed), ElementsAre(TransferPoll::kFailed));
  absl::StatusOr<PrefillOutput> begun = rooms.BeginRoom(30, kT0);
  EXPECT_EQ(begun.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(begun.status().message(), HasSubstr("room 30 already failed: "));
  EXPECT_THAT(begun.status().message(), HasSubstr("unregistered Decode session"));
  absl::StatusOr<PrefillOutput> ready = rooms.Ready(30, ReadyWith(1), kT0);
  EXPECT_EQ(ready.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(ready.status().message(), HasSubstr("room 30 already failed: "));
  EXPECT_EQ(rooms.State(30), TransferPoll::kFailed);
}

TEST(PrefillRoomsTest, BootstrapTimeoutFailsABegunRoomStillBootstrapping) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  ASSERT_TRUE(rooms.BeginRoom(42, kT0).ok());
  Preallocate(rooms, 42, 0);
  EXPECT_TRUE(rooms.Tick(kT0 + absl::Seconds(119)).events.empty());
  PrefillOutput expired = rooms.Tick(kT0 + absl::Seconds(120));
  ASSERT_THAT(States(expired), ElementsAre(TransferPoll::kFailed));
  EXPECT_EQ(expired.events[0].cause, FailureCause::kTimeout);
  EXPECT_THAT(expired.events[0].reason, HasSubstr("bootstrap timeout"));
  ASSERT_EQ(expired.messages.size(), 1u);  // the rank that did pre-allocate is told
  EXPECT_EQ(expired.messages[0].endpoint, ReplyEndpointOf(0));
}

TEST(PrefillRoomsTest, BootstrapTimeoutIsConfigurableAndSparesBootstrappedRooms) {
  PrefillOptions options;
  options.timeouts.bootstrap_timeout = absl::Seconds(5);
  PrefillRooms rooms = MakeRooms(options);
  RegisterBoth(rooms);
  ASSERT_TRUE(rooms.BeginRoom(1, kT0).ok());
  ASSERT_TRUE(rooms.BeginRoom(2, kT0).ok());
  Preallocate(rooms, 2, 0);
  Preallocate(rooms, 2, 1);
  PrefillOutput expired = rooms.Tick(kT0 + absl::Seconds(5));
  ASSERT_EQ(expired.events.size(), 1u);
  EXPECT_EQ(expired.events[0].room, 1u);
  EXPECT_EQ(rooms.State(2), TransferPoll::kBootstrapped);
}

TEST(PrefillRoomsTest, PreallocationsNeverMatchedByARequestExpire) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  Preallocate(rooms, 77, 0, kT0);
  Preallocate(rooms, 77, 1, kT0 + absl::Seconds(10));
  EXPECT_TRUE(rooms.Tick(kT0 + absl::Seconds(119)).events.empty());
  PrefillOutput expired = rooms.Tick(kT0 + absl::Seconds(120));
  ASSERT_THAT(States(expired), ElementsAre(TransferPoll::kFailed));
  EXPECT_THAT(expired.events[0].reason, HasSubstr("unmatched"));
  EXPECT_EQ(expired.messages.size(), 2u);
}

// A failed room is remembered (PrefillRooms::Ended) from its Failed on, at least for
// failed_room_ttl; here no count keeps it longer (remembered_rooms 0).
TEST(PrefillRoomsTest, AFailedRoomAnswersLatePreallocationsUntilItsTtl) {
  PrefillOptions options;
  options.remembered_rooms = 0;
  PrefillRooms rooms = MakeRooms(options);
  RegisterBoth(rooms);
  ASSERT_TRUE(rooms.BeginRoom(50, kT0).ok());
  rooms.Abort(50, "engine error", kT0);
  EXPECT_EQ(rooms.room_count(), 1u);
  EXPECT_EQ(rooms.RememberedFailedCount(), 1u);
  rooms.Free(50, kT0);
  // Remembered, not in play: the room table is empty (the soak's "rooms left" were these).
  EXPECT_EQ(rooms.room_count(), 0u);
  EXPECT_FALSE(rooms.Find(50).has_value());
  ASSERT_NE(rooms.Ended(50), nullptr);
  EXPECT_EQ(rooms.Ended(50)->reason, "engine error");
  PrefillOutput late = Preallocate(rooms, 50, 0, kT0 + absl::Seconds(1));
  ASSERT_EQ(late.messages.size(), 1u);
  EXPECT_EQ(late.messages[0].endpoint, ReplyEndpointOf(0));
  EXPECT_EQ(ParsedStatus(late.messages[0]).status, 0);
  EXPECT_FALSE(late.rejected.ok());
  EXPECT_FALSE(rooms.Find(50).has_value());  // not stored
  EXPECT_EQ(rooms.BeginRoom(50, kT0 + absl::Seconds(1)).status().message(),
            "room 50 already failed: engine error");

  rooms.Tick(kT0 + absl::Seconds(120));  // failed_room_ttl
  EXPECT_EQ(rooms.Ended(50), nullptr);
  EXPECT_EQ(rooms.RememberedFailedCount(), 0u);
  PrefillOutput fresh = Preallocate(rooms, 50, 0, kT0 + absl::Seconds(121));
  EXPECT_TRUE(fresh.messages.empty());
  EXPECT_THAT(rooms.Find(50)->preallocated_sessions, ElementsAre(SessionOf(0)));
}

// With the default bound, the newest 65,536 ended rooms are remembered, succeeded ones too: a
// late pre-allocation of a room that succeeded and was freed is answered Failed, not made anew.
TEST(PrefillRoomsTest, TheNewestEndedRoomsAreRememberedPastTheirTtl) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  StartTransfer(rooms, 42);
  ASSERT_TRUE(LandAll(rooms, 42, kT0).ok());
  rooms.Free(42, kT0);
  rooms.Tick(kT0 + absl::Seconds(600));
  ASSERT_NE(rooms.Ended(42), nullptr);
  EXPECT_EQ(rooms.Ended(42)->state, TransferPoll::kSuccess);
  PrefillOutput late = Preallocate(rooms, 42, 0, kT0 + absl::Seconds(600));
  ASSERT_EQ(late.messages.size(), 1u);
  EXPECT_EQ(ParsedStatus(late.messages[0]).status, 0);
  EXPECT_FALSE(rooms.Find(42).has_value());
  EXPECT_EQ(rooms.EndedCount(), 1u);
}

TEST(PrefillRoomsTest, FreedSucceededRoomIsForgotten) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  StartTransfer(rooms, 42);
  ASSERT_TRUE(LandAll(rooms, 42, kT0).ok());
  EXPECT_EQ(rooms.room_count(), 1u);
  rooms.Free(42, kT0);
  EXPECT_EQ(rooms.room_count(), 0u);
}

TEST(PrefillRoomsTest, PreallocationForACompletedRoomIsAnsweredWithFailed) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  StartTransfer(rooms, 42);
  ASSERT_TRUE(LandAll(rooms, 42, kT0).ok());
  PrefillOutput late = Preallocate(rooms, 42, 0);
  ASSERT_EQ(late.messages.size(), 1u);
  EXPECT_EQ(ParsedStatus(late.messages[0]).status, 0);
  EXPECT_EQ(rooms.State(42), TransferPoll::kSuccess);
}

TEST(PrefillRoomsTest, FailedTransferQuarantinesTheSessionUntilItsTtlOrANewRegistration) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  StartTransfer(rooms, 1);
  PrefillOutput failed = FailAll(rooms, 1, SessionOf(0), "write returned -1", kT0,
                                 /*fence_proven=*/true, FailureCause::kBounds);
  ASSERT_THAT(States(failed), ElementsAre(TransferPoll::kFailed));
  EXPECT_EQ(failed.events[0].cause, FailureCause::kBounds);
  EXPECT_THAT(failed.events[0].reason, HasSubstr("CachePD transfer failed: "));
  EXPECT_THAT(failed.events[0].reason, HasSubstr("write returned -1"));
  EXPECT_EQ(failed.messages.size(), 2u);  // every destination, the written one included
  EXPECT_THAT(rooms.QuarantinedSessions(kT0), ElementsAre(SessionOf(0)));

  // A room to the quarantined session fails before copying.
  ASSERT_TRUE(rooms.BeginRoom(2, kT0).ok());
  Preallocate(rooms, 2, 0);
  Preallocate(rooms, 2, 1);
  absl::StatusOr<PrefillOutput> ready = rooms.Ready(2, ReadyWith(1), kT0 + absl::Seconds(1));
  ASSERT_TRUE(ready.ok());
  EXPECT_TRUE(ready->transfers.empty());
  ASSERT_THAT(States(*ready), ElementsAre(TransferPoll::kFailed));
  EXPECT_THAT(ready->events[0].reason, HasSubstr("quarantined"));

  // The TTL (30 s) ends it...
  rooms.Tick(kT0 + absl::Seconds(30));
  EXPECT_TRUE(rooms.QuarantinedSessions(kT0 + absl::Seconds(30)).empty());
  // ...and so does a registration.
  StartTransfer(rooms, 3);
  FailAll(rooms, 3, SessionOf(1), "again", kT0 + absl::Seconds(31));
  EXPECT_THAT(rooms.QuarantinedSessions(kT0 + absl::Seconds(31)), ElementsAre(SessionOf(1)));
  rooms.OnMessage(RegistrationFrames(1), kT0 + absl::Seconds(32));
  EXPECT_TRUE(rooms.QuarantinedSessions(kT0 + absl::Seconds(32)).empty());
}

TEST(PrefillRoomsTest, RestartedDecodeReplacesItsRegistrationAndGetsAnswersOnItsNewRoute) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  ASSERT_TRUE(rooms.BeginRoom(1, kT0).ok());
  Preallocate(rooms, 1, 0);
  // Same session, contract and ranks; new reply port and arena: a restarted process.
  PrefillOutput restarted =
      rooms.OnMessage(RegistrationFrames(0, uint16_t{17100}, uint64_t{0x7f0000000000}), kT0);
  EXPECT_TRUE(restarted.rejected.ok()) << restarted.rejected;
  ASSERT_THAT(States(restarted), ElementsAre(TransferPoll::kFailed));
  EXPECT_THAT(restarted.events[0].reason, HasSubstr("restarted"));
  ASSERT_EQ(restarted.replaced.size(), 1u);
  EXPECT_EQ(restarted.replaced[0].first, SessionOf(0));
  EXPECT_EQ(restarted.replaced[0].second, ReplyEndpointOf(0));
  ASSERT_EQ(restarted.messages.size(), 1u);
  EXPECT_EQ(restarted.messages[0].endpoint, ReplyEndpointOf(0));  // the room's old route

  ASSERT_NE(rooms.Registration(SessionOf(0)), nullptr);
  EXPECT_EQ(rooms.Registration(SessionOf(0))->registration.arena_base, 0x7f0000000000u);
  StartTransfer(rooms, 2);
  absl::StatusOr<PrefillOutput> done = LandAll(rooms, 2, kT0);
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(done->messages.size(), 2u);
  EXPECT_EQ(done->messages[0].endpoint, "tcp://10.1.0.1:17100");
}

TEST(PrefillRoomsTest, ChangedContractIsStillRejectedAsConflicting) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  ASSERT_TRUE(rooms.BeginRoom(1, kT0).ok());
  Preallocate(rooms, 1, 0);
  // The same session claiming another decode rank is not a restart.
  std::vector<std::string> other = RegistrationFrames(0);
  other[7] = "1";
  PrefillOutput out = rooms.OnMessage(other, kT0);
  EXPECT_THAT(out.rejected.message(), HasSubstr("conflicting registration"));
  EXPECT_EQ(rooms.State(1), TransferPoll::kFailed);
  EXPECT_EQ(rooms.Registration(SessionOf(0)), nullptr);
  ASSERT_EQ(rooms.RejectedSessions().size(), 1u);
  EXPECT_EQ(rooms.RejectedSessions()[0].first, SessionOf(0));
}

TEST(PrefillRoomsTest, RejectedRoutesAreBounded) {
  PrefillOptions options;
  options.max_remembered_rejections = 2;
  PrefillRooms rooms = MakeRooms(options);
  for (int d : {2, 3}) rooms.OnMessage(RegistrationFrames(d), kT0);  // served by rank 1
  EXPECT_EQ(rooms.RejectedSessions().size(), 2u);
  std::vector<std::string> third = RegistrationFrames(2);
  third[3] = "10.7.7.7:1";
  rooms.OnMessage(third, kT0);
  std::vector<std::pair<std::string, wire::ReplyRoute>> rejected = rooms.RejectedSessions();
  ASSERT_EQ(rejected.size(), 2u);
  EXPECT_EQ(rejected[0].first, SessionOf(3));  // the oldest, SessionOf(2), was forgotten
  EXPECT_EQ(rejected[1].first, "10.7.7.7:1");
}

TEST(PrefillRoomsTest, MalformedMessagesAreRefusedWithAReasonAndLeaveOtherRoomsAlone) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  ASSERT_TRUE(rooms.BeginRoom(42, kT0).ok());
  Preallocate(rooms, 42, 0);

  std::vector<std::vector<std::string>> garbage = {
      {},                                      // no frame 0
      {std::string("\xff\xfe", 2), "x", "y"},  // frame 0 not ASCII
      {"None", "10.1.0.1", "17000"},           // short registration
      {"None", "10.1.0.1", "017000", SessionOf(0), std::string(8, '\1'), "{}", "4", "0"},
      {"4x", SessionOf(1), DecodeManifestWire()},           // room not a canonical integer
      {"43", SessionOf(1)},                                 // two frames
      {"43", SessionOf(1), DecodeManifestWire(), "extra"},  // four frames
      {"43", SessionOf(1), "{\"groups\": 7}"},              // manifest of the wrong shape
      {"43", SessionOf(1), "not json"},
  };
  for (const std::vector<std::string>& frames : garbage) {
    PrefillOutput out = rooms.OnMessage(frames, kT0);
    EXPECT_FALSE(out.rejected.ok());
    EXPECT_FALSE(out.rejected.message().empty());
    EXPECT_TRUE(out.transfers.empty());
    for (const RoomEvent& e : out.events) EXPECT_EQ(e.room, 43u);
    for (const OutboundMessage& m : out.messages) EXPECT_EQ(ParsedStatus(m).room, 43u);
  }
  // Room 42 is untouched and completes normally.
  EXPECT_EQ(rooms.State(42), TransferPoll::kBootstrapping);
  EXPECT_THAT(rooms.Find(42)->preallocated_sessions, ElementsAre(SessionOf(0)));
  EXPECT_THAT(States(Preallocate(rooms, 42, 1)), ElementsAre(TransferPoll::kBootstrapped));
  EXPECT_EQ(rooms.Registrations().size(), 2u);
}

TEST(PrefillRoomsTest, RegistrationWithAnUnreadableReplyRouteIsOnlyRefused) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  ASSERT_TRUE(rooms.BeginRoom(1, kT0).ok());
  Preallocate(rooms, 1, 0);
  std::vector<std::string> frames = RegistrationFrames(0);
  frames[2] = "017000";  // a non-canonical port: no route to answer on (CACHEPD §11.6)
  PrefillOutput out = rooms.OnMessage(frames, kT0);
  EXPECT_EQ(CategoryOf(out.rejected), ErrorCategory::kInvalidFrame);
  EXPECT_TRUE(out.messages.empty());
  EXPECT_TRUE(out.events.empty());
  EXPECT_NE(rooms.Registration(SessionOf(0)), nullptr);
  EXPECT_EQ(rooms.State(1), TransferPoll::kBootstrapping);
}

TEST(PrefillRoomsTest, RegistrationsPlanOnceAndShareThePlannerAcrossRanks) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  std::shared_ptr<const DecodePeer> zero = rooms.Registration(SessionOf(0));
  ASSERT_NE(zero, nullptr);
  EXPECT_FALSE(zero->dummy);
  EXPECT_EQ(zero->fragments.size(), 5u);
  EXPECT_THAT(zero->expected_decode_ranks, ElementsAre(0, 1));
  EXPECT_EQ(zero->reply_endpoint, ReplyEndpointOf(0));
  // An identical registration keeps the stored object.
  rooms.OnMessage(RegistrationFrames(0), kT0);
  EXPECT_EQ(rooms.Registration(SessionOf(0)), zero);
}

// A registration says where this prefill rank stands among the sources of the decode rank's
// route (E_d, CACHEPD §6.5): the sidecar gives each source lanes of its own where the decode's
// lanes receive the bytes (prefill_transfers.cc, LanesFor).
TEST(PrefillRoomsTest, ARegistrationKnowsItsPlaceAmongTheRoutesSources) {
  struct Case {
    int prefill_tp, decode_tp;
    bool latent;
    int decode_rank;
    std::vector<int> sources;  // E_d: the prefill ranks that send to it, ascending
  };
  const Case cases[] = {
      {4, 2, false, 1, {2, 3}},        // head-sliced: two sources per decode rank
      {4, 1, false, 0, {0, 1, 2, 3}},  // four
      {2, 4, false, 3, {1}},           // a decode rank that reads one prefill rank
      {2, 2, false, 1, {1}},           // the whole-field copy
      {2, 1, true, 0, {0}},            // replicated (MLA): one source, the other a dummy
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.prefill_tp, ":", c.decode_tp, c.latent ? " latent" : ""));
    layout::KvShape shape;
    shape.layers = 2;
    shape.kv_heads = 4;
    shape.head_dim = 2;
    shape.dtype = layout::DType::kUint8;
    shape.latent = c.latent;
    shape.latent_dim = 8;
    const layout::Contract prefill = layout::BuildKvContract(shape, c.prefill_tp).value();
    const layout::Contract decode = layout::BuildKvContract(shape, c.decode_tp).value();
    wire::Registration registration;
    registration.endpoint = "10.1.0.9";
    registration.port = 17009;
    registration.session_id = "10.1.0.9:15009";
    registration.arena_base = 0x7e0000000000;
    registration.contract_wire = layout::SerializeContract(decode).value();
    registration.decode_tp_size = static_cast<uint32_t>(c.decode_tp);
    registration.decode_tp_rank = static_cast<uint32_t>(c.decode_rank);
    const std::vector<std::string> frames = wire::BuildRegistration(registration).value();
    for (int p = 0; p < c.prefill_tp; ++p) {
      PrefillIdentity identity;
      identity.prefill_tp_size = c.prefill_tp;
      identity.prefill_tp_rank = p;
      identity.contract = prefill;
      PrefillRooms rooms = PrefillRooms::Create(identity, {}).value();
      rooms.OnMessage(frames, kT0);
      std::shared_ptr<const DecodePeer> peer = rooms.Registration(registration.session_id);
      const auto place = std::find(c.sources.begin(), c.sources.end(), p);
      if (place == c.sources.end()) {  // a rank this decode rank does not read: never sends
        EXPECT_TRUE(peer == nullptr || peer->dummy) << "prefill rank " << p;
        continue;
      }
      ASSERT_NE(peer, nullptr) << "prefill rank " << p;
      EXPECT_FALSE(peer->dummy);
      EXPECT_EQ(peer->route_sources, static_cast<int>(c.sources.size())) << "prefill rank " << p;
      EXPECT_EQ(peer->source_index, place - c.sources.begin()) << "prefill rank " << p;
    }
  }
}

// Property: over random sequences of peer messages, engine signals, transfer results, aborts
// and ticks, a room's state never moves backwards, Failed never changes, and every state
// change is reported exactly once, in order.
TEST(PrefillRoomsTest, RandomOperationsKeepStatesForwardOnlyAndFailedSticky) {
  std::mt19937 random(7);
  for (int trial = 0; trial < 200; ++trial) {
    PrefillRooms rooms = MakeRooms();
    RegisterBoth(rooms);
    std::map<uint64_t, std::optional<TransferPoll>> last;
    absl::Time now = kT0;
    for (int op = 0; op < 40; ++op) {
      const uint64_t room = random() % 3;
      now += absl::Seconds(random() % 50);
      PrefillOutput out;
      switch (random() % 9) {
        case 0: {
          absl::StatusOr<PrefillOutput> r = rooms.BeginRoom(room, now);
          if (r.ok()) out = *std::move(r);
          break;
        }
        case 1:
        case 2:
          out = Preallocate(rooms, room, static_cast<int>(random() % 2), now);
          break;
        case 3:
          out = rooms.OnMessage(PreallocationFrames(room, SessionOf(1), ""), now);  // wrong kind
          break;
        case 4: {
          absl::StatusOr<PrefillOutput> r = rooms.Ready(room, ReadyWith(3), now);
          if (r.ok()) out = *std::move(r);
          break;
        }
        case 5: {
          absl::StatusOr<PrefillOutput> r = LandAll(rooms, room, now);
          if (r.ok()) out = *std::move(r);
          break;
        }
        case 6:
          out = FailAll(rooms, room, "", "flaky", now);
          break;
        case 7:
          out = rooms.Abort(room, "abort", now);
          break;
        default:
          out = rooms.Tick(now);
          break;
      }
      std::map<uint64_t, std::optional<TransferPoll>> seen = last;
      for (const RoomEvent& e : out.events) {
        std::optional<TransferPoll>& before = seen[e.room];
        if (before.has_value()) {
          if (*before == TransferPoll::kFailed) {
            EXPECT_EQ(e.state, TransferPoll::kFailed);
          } else if (e.state != TransferPoll::kFailed) {
            EXPECT_GE(e.state, *before);
          }
        }
        before = e.state;
      }
      for (uint64_t r = 0; r < 3; ++r) {
        const std::optional<TransferPoll> now_state = rooms.State(r);
        if (!rooms.Find(r).has_value()) {  // a remembered failed room ran out (§11.2)
          last[r] = std::nullopt;
          continue;
        }
        const std::optional<TransferPoll>& reported = seen[r];
        if (reported.has_value()) {
          EXPECT_EQ(now_state, reported) << "room " << r;
        }
        if (last[r] == TransferPoll::kFailed) {
          EXPECT_EQ(now_state, TransferPoll::kFailed);
        }
        if (last[r].has_value() && now_state.has_value() && *now_state != TransferPoll::kFailed) {
          EXPECT_GE(*now_state, *last[r]);
        }
        last[r] = now_state;
      }
    }
  }
}

TEST(PrefillRoomsTest, ADroppedSessionFailsItsRoomsAndIsForgotten) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  StartTransfer(rooms, 1);
  ASSERT_TRUE(rooms.BeginRoom(2, kT0).ok());
  Preallocate(rooms, 2, 0);
  PrefillOutput out;
  EXPECT_EQ(rooms.DropSession(SessionOf(0), "decode gone", kT0, out), ReplyEndpointOf(0));
  EXPECT_THAT(out.fences, ElementsAre(1u));                      // in flight: fenced first
  ASSERT_THAT(States(out), ElementsAre(TransferPoll::kFailed));  // room 2 at once
  EXPECT_EQ(rooms.Registration(SessionOf(0)), nullptr);
  EXPECT_EQ(rooms.Registrations().size(), 1u);
  PrefillOutput again;
  EXPECT_FALSE(rooms.DropSession(SessionOf(0), "again", kT0, again).has_value());
}

TEST(PrefillRoomsTest, AnUnprovenFenceIsAnsweredUnproven) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  StartTransfer(rooms, 3);
  EXPECT_THAT(rooms.OnMessage(FenceRequestFrames(3, 0), kT0).fences, ElementsAre(3u));
  PrefillOutput fenced = FailAll(rooms, 3, "", "cancelled", kT0, /*fence_proven=*/false);
  ASSERT_EQ(fenced.messages.size(), 3u);
  absl::StatusOr<wire::FencedAnswer> answer = wire::ParseFencedAnswer(fenced.messages[2].frames);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_FALSE(answer->proven);
  // A later request for the same room gets the same answer.
  PrefillOutput again = rooms.OnMessage(FenceRequestFrames(3, 1), kT0);
  ASSERT_EQ(again.messages.size(), 1u);
  EXPECT_FALSE(wire::ParseFencedAnswer(again.messages[0].frames)->proven);
}

// A room to two decode ranks whose transfer to one could not prove its fence (its peer's data
// plane disconnected) and whose transfer to the other fenced cleanly: each rank hears its own
// answer, the sibling's proven, now and after the room ended.
TEST(PrefillRoomsTest, EachDestinationHearsItsOwnTransfersFenceProof) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  StartTransfer(rooms, 3);
  std::optional<PrefillRoomView> view = rooms.Find(3);
  ASSERT_TRUE(view.has_value());
  ASSERT_EQ(view->transfer_ids.size(), 2u);
  EXPECT_THAT(rooms.OnMessage(FenceRequestFrames(3, 1), kT0).fences, ElementsAre(3u));
  PrefillOutput out;
  for (uint64_t id : view->transfer_ids) {
    const bool dead_rank = rooms.SessionOfTransfer(id) == SessionOf(0);
    testing::Append(out, rooms.TransferOutcome(
                             id,
                             dead_rank ? absl::UnavailableError("Endpoint timeout")
                                       : absl::CancelledError("its room failed"),
                             dead_rank ? SessionOf(0) : "", kT0, /*fence_proven=*/!dead_rank));
  }
  // The waiting rank 1 is answered proven as the room ends.
  std::vector<wire::FencedAnswer> answers;
  for (const OutboundMessage& m : out.messages) {
    absl::StatusOr<wire::FencedAnswer> answer = wire::ParseFencedAnswer(m.frames);
    if (answer.ok()) answers.push_back(*answer);
  }
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_TRUE(answers[0].proven);
  // Asked later, each rank hears its own.
  PrefillOutput zero = rooms.OnMessage(FenceRequestFrames(3, 0), kT0);
  ASSERT_EQ(zero.messages.size(), 1u);
  EXPECT_FALSE(wire::ParseFencedAnswer(zero.messages[0].frames)->proven);
  PrefillOutput one = rooms.OnMessage(FenceRequestFrames(3, 1), kT0);
  ASSERT_EQ(one.messages.size(), 1u);
  EXPECT_TRUE(wire::ParseFencedAnswer(one.messages[0].frames)->proven);
}

// --- layer-wise streaming (CACHEPD §6.11) ----------------------------------------------------

// A begun room holding both pre-allocations.
void Bootstrap(PrefillRooms& rooms, uint64_t room) {
  ASSERT_TRUE(rooms.BeginRoom(room, kT0).ok());
  Preallocate(rooms, room, 0);
  Preallocate(rooms, room, 1);
  ASSERT_EQ(rooms.State(room), TransferPoll::kBootstrapped);
}

// The test contract's fields: layer.0.k and layer.0.latent (history), layer.1.conv (state).
TEST(PrefillRoomsTest, LayersStreamAsTheyBecomeFinalAndTheReadySendsTheRest) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  Bootstrap(rooms, 42);
  absl::StatusOr<PrefillOutput> first = rooms.LayersReady(42, SourceManifest(), 1, kT0);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->transfers.size(), 1u);
  const TransferWork& layer0 = first->transfers[0];
  EXPECT_FALSE(layer0.final);
  EXPECT_EQ(layer0.layers.begin, 0);
  EXPECT_EQ(layer0.layers.end, 1);
  EXPECT_EQ(layer0.destinations.size(), 2u);
  EXPECT_GT(layer0.total_bytes, 0u);
  EXPECT_LT(layer0.total_bytes, 228u);
  EXPECT_TRUE(first->messages.empty());
  EXPECT_EQ(rooms.Find(42)->transfer, TransferPhase::kPreparing);
  PrefillOutput posted;
  EXPECT_EQ(Post(rooms, layer0, kT0, posted).size(), 2u);
  EXPECT_EQ(rooms.Find(42)->transfer, TransferPhase::kPosting);
  // The same layers again: nothing new is final.
  absl::StatusOr<PrefillOutput> again = rooms.LayersReady(42, std::nullopt, 1, kT0);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->transfers.empty());
  // Not done before the final work: the layer's transfers land, and no Success goes out early.
  absl::StatusOr<PrefillOutput> layer_landed = LandAll(rooms, 42, kT0);
  ASSERT_TRUE(layer_landed.ok()) << layer_landed.status();
  EXPECT_TRUE(layer_landed->events.empty());
  EXPECT_TRUE(layer_landed->messages.empty());
  EXPECT_EQ(rooms.Find(42)->transfer, TransferPhase::kPosting);

  RoomReady ready = ReadyWith(7);
  ready.source_manifest.reset();  // the LayersReady's stands
  absl::StatusOr<PrefillOutput> rest = rooms.Ready(42, std::move(ready), kT0);
  ASSERT_TRUE(rest.ok()) << rest.status();
  ASSERT_EQ(rest->transfers.size(), 1u);
  EXPECT_TRUE(rest->transfers[0].final);
  EXPECT_EQ(rest->transfers[0].layers.begin, 1);
  EXPECT_EQ(layer0.total_bytes + rest->transfers[0].total_bytes, 228u);
  absl::StatusOr<PrefillOutput> done = LandAll(rooms, 42, kT0);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->messages.size(), 2u);
  EXPECT_EQ(ParsedStatus(done->messages[0]).status, 5);
  EXPECT_EQ(ParsedStatus(done->messages[0]).bootstrap_token, 7);
}

TEST(PrefillRoomsTest, LayersFinalBeforeThePreallocationsAreSentWhenTheyComplete) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  ASSERT_TRUE(rooms.BeginRoom(8, kT0).ok());
  absl::StatusOr<PrefillOutput> early = rooms.LayersReady(8, SourceManifest(), 1, kT0);
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_TRUE(early->transfers.empty());
  EXPECT_EQ(rooms.Find(8)->layers_final, 1);
  EXPECT_TRUE(Preallocate(rooms, 8, 0).transfers.empty());
  PrefillOutput last = Preallocate(rooms, 8, 1);
  ASSERT_EQ(last.transfers.size(), 1u);
  EXPECT_FALSE(last.transfers[0].final);
  EXPECT_EQ(last.transfers[0].layers.end, 1);
  EXPECT_EQ(rooms.Find(8)->layers_sent, 1);
}

TEST(PrefillRoomsTest, LayersReadyRefusesBadCallsAndChangesNothing) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  EXPECT_EQ(rooms.LayersReady(5, SourceManifest(), 1, kT0).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(rooms.BeginRoom(5, kT0).ok());
  EXPECT_EQ(rooms.LayersReady(5, std::nullopt, 1, kT0).status().code(),
            absl::StatusCode::kInvalidArgument);  // the first call names the source blocks
  EXPECT_EQ(rooms.LayersReady(5, SourceManifest(), 0, kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(rooms.LayersReady(5, SourceManifest(), 2, kT0).ok());
  absl::StatusOr<PrefillOutput> lower = rooms.LayersReady(5, std::nullopt, 1, kT0);
  EXPECT_EQ(lower.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(lower.status().message()), HasSubstr("never below"));
  layout::Manifest other = SourceManifest();
  other.groups[0].block_ids[0] += 1;
  EXPECT_EQ(rooms.LayersReady(5, other, 2, kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
  RoomReady differs = ReadyWith(1);
  differs.source_manifest = other;
  EXPECT_EQ(rooms.Ready(5, differs, kT0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rooms.Find(5)->layers_final, 2);
  ASSERT_TRUE(rooms.Ready(5, ReadyWith(1), kT0).ok());
  EXPECT_EQ(rooms.LayersReady(5, std::nullopt, 3, kT0).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // A contract with a field that is not layer.<N>.* has no layers to stream.
  PrefillIdentity identity;
  identity.prefill_tp_size = 2;
  identity.contract = PrefillContract();
  for (layout::FieldLayout& field : identity.contract.plan.fields) {
    if (field.field_id == "layer.0.latent") field.field_id = "latent";
  }
  PrefillRooms unlayered = *PrefillRooms::Create(identity);
  ASSERT_TRUE(unlayered.BeginRoom(6, kT0).ok());
  absl::StatusOr<PrefillOutput> refused = unlayered.LayersReady(6, SourceManifest(), 1, kT0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("'latent'"));
}

// Failed means fenced between layers too: an abort while a layer's work is in flight waits for
// its fence.
TEST(PrefillRoomsTest, AnAbortBetweenLayersWaitsForTheFenceOfTheLayersInFlight) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  Bootstrap(rooms, 42);
  absl::StatusOr<PrefillOutput> layer = rooms.LayersReady(42, SourceManifest(), 1, kT0);
  ASSERT_TRUE(layer.ok()) << layer.status();
  ASSERT_EQ(layer->transfers.size(), 1u);
  PrefillOutput posted;
  ASSERT_EQ(Post(rooms, layer->transfers[0], kT0, posted).size(), 2u);
  PrefillOutput aborted = rooms.Abort(42, "the engine aborted", kT0);
  EXPECT_THAT(aborted.fences, ElementsAre(42u));
  EXPECT_EQ(aborted.cancels, rooms.Find(42)->transfer_ids);
  EXPECT_TRUE(aborted.messages.empty());
  EXPECT_NE(rooms.State(42), TransferPoll::kFailed);
  // While it is fenced, neither more layers nor the Ready start anything.
  absl::StatusOr<PrefillOutput> more = rooms.LayersReady(42, std::nullopt, 2, kT0);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_TRUE(more->transfers.empty());
  absl::StatusOr<PrefillOutput> ready = rooms.Ready(42, ReadyWith(1), kT0);
  ASSERT_TRUE(ready.ok()) << ready.status();
  EXPECT_TRUE(ready->transfers.empty());
  PrefillOutput fenced = FailAll(rooms, 42, "", "cancelled", kT0);
  ASSERT_EQ(fenced.messages.size(), 2u);
  EXPECT_EQ(ParsedStatus(fenced.messages[0]).status, 0);
  EXPECT_THAT(States(fenced), ElementsAre(TransferPoll::kFailed));
  // Later layers of a failed room start nothing and are refused, naming the failure.
  absl::StatusOr<PrefillOutput> late = rooms.LayersReady(42, std::nullopt, 2, kT0);
  EXPECT_THAT(std::string(late.status().message()),
              HasSubstr("room 42 already failed: the engine aborted"));
}

// --- the room's transfers (TransferPhase) ------------------------------------------------

// The room's one Ready work, handed out and not yet prepared.
TransferWork HandOut(PrefillRooms& rooms, uint64_t room) {
  EXPECT_TRUE(rooms.BeginRoom(room, kT0).ok());
  Preallocate(rooms, room, 0);
  Preallocate(rooms, room, 1);
  absl::StatusOr<PrefillOutput> out = rooms.Ready(room, ReadyWith(7), kT0);
  EXPECT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->transfers.size(), 1u);
  return out->transfers.empty() ? TransferWork{} : out->transfers.front();
}

TEST(PrefillRoomsTest, AFailureWhilePreparingEndsTheRoomAtOnceAndTheLatePreparationSubmitsNothing) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  const TransferWork work = HandOut(rooms, 1);
  std::shared_ptr<const std::atomic<bool>> failing = rooms.FailingFlag(1);
  ASSERT_NE(failing, nullptr);
  EXPECT_FALSE(failing->load());
  PrefillOutput aborted = rooms.Abort(1, "the engine aborted", kT0);
  EXPECT_TRUE(failing->load()) << "the strand preparing it would not see the failure";
  // Nothing of it was submitted: no write can land, so it fails now.
  EXPECT_TRUE(aborted.cancels.empty());
  ASSERT_THAT(States(aborted), ElementsAre(TransferPoll::kFailed));
  EXPECT_EQ(aborted.events[0].reason, "the engine aborted");
  EXPECT_EQ(aborted.messages.size(), 2u);
  EXPECT_FALSE(rooms.Find(1)->transfer.has_value());
  PrefillOutput late;
  EXPECT_TRUE(Post(rooms, work, kT0, late).empty());
  EXPECT_TRUE(late.events.empty()) << "a stale preparation ended the room twice";
  EXPECT_EQ(rooms.transfers_in_flight(), 0u);
  EXPECT_EQ(rooms.rooms_transferring(), 0u);
}

TEST(PrefillRoomsTest, AFailureWhilePostingCancelsAndFailsOnlyOnceEveryTransferReported) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  const TransferWork work = HandOut(rooms, 1);
  PrefillOutput posted;
  const std::vector<uint64_t> ids = Post(rooms, work, kT0, posted);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(rooms.SessionOfTransfer(ids[1]), SessionOf(1));
  EXPECT_EQ(rooms.transfers_in_flight(), 2u);
  EXPECT_TRUE(rooms.TransfersSubmitted(1).cancels.empty()) << "cancelled a live room";
  PrefillOutput aborted = rooms.Abort(1, "the engine aborted", kT0);
  EXPECT_THAT(aborted.cancels, ElementsAre(ids[0], ids[1]));
  EXPECT_TRUE(aborted.events.empty()) << "Failed before the fence";
  // Failed while being submitted: the submitter cancels again.
  EXPECT_THAT(rooms.TransfersSubmitted(1).cancels, ElementsAre(ids[0], ids[1]));
  EXPECT_TRUE(rooms.TransferOutcome(ids[0], absl::CancelledError("x"), "", kT0).events.empty());
  PrefillOutput last =
      rooms.TransferOutcome(ids[1], absl::OkStatus(), "", kT0 + absl::Seconds(1), true, 4);
  ASSERT_THAT(States(last), ElementsAre(TransferPoll::kFailed));
  EXPECT_EQ(last.events[0].reason, "the engine aborted");
  EXPECT_EQ(last.events[0].bytes, 0u) << "a failed room reports no bytes landed";
  EXPECT_EQ(last.events[0].copies, 4u);
  EXPECT_EQ(last.events[0].elapsed, absl::Seconds(1));
  EXPECT_TRUE(rooms.QuarantinedSessions(kT0).empty());
  EXPECT_EQ(rooms.transfers_in_flight(), 0u);
}

TEST(PrefillRoomsTest, AWriteFailureCancelsTheSiblingsAndQuarantinesItsSessionAtTheFence) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  PrefillOutput posted;
  const std::vector<uint64_t> ids = Post(rooms, HandOut(rooms, 1), kT0, posted);
  ASSERT_EQ(ids.size(), 2u);
  PrefillOutput failed =
      rooms.TransferOutcome(ids[0], absl::UnavailableError("peer gone"), SessionOf(0), kT0);
  EXPECT_THAT(failed.cancels, ElementsAre(ids[1]));
  EXPECT_TRUE(failed.fences.empty()) << "the room did not ask for this fence";
  EXPECT_TRUE(failed.events.empty());
  EXPECT_EQ(rooms.Find(1)->transfer, TransferPhase::kFencing);
  // An abort now changes nothing: the first failure stays.
  EXPECT_TRUE(rooms.Abort(1, "the engine aborted", kT0).events.empty());
  PrefillOutput last = rooms.TransferOutcome(ids[1], absl::CancelledError("sibling"), "", kT0);
  ASSERT_THAT(States(last), ElementsAre(TransferPoll::kFailed));
  EXPECT_THAT(last.events[0].reason, HasSubstr("CachePD transfer failed: "));
  EXPECT_THAT(last.events[0].reason, HasSubstr("peer gone"));
  EXPECT_EQ(last.events[0].cause, FailureCause::kTransport);
  EXPECT_THAT(rooms.QuarantinedSessions(kT0), ElementsAre(SessionOf(0)));
}

TEST(PrefillRoomsTest, AFailedPreparationFailsTheRoomBlamingItsSession) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  const TransferWork work = HandOut(rooms, 1);
  EXPECT_TRUE(
      rooms.PreparationFailed(1, work.generation + 1, "x", "", FailureCause::kHandshake, kT0)
          .events.empty())
      << "a generation the room is not preparing";
  PrefillOutput failed = rooms.PreparationFailed(1, work.generation, "connect refused",
                                                 SessionOf(1), FailureCause::kHandshake, kT0);
  ASSERT_THAT(States(failed), ElementsAre(TransferPoll::kFailed));
  EXPECT_EQ(failed.events[0].reason, "CachePD transfer failed: connect refused");
  EXPECT_EQ(failed.events[0].cause, FailureCause::kHandshake);
  EXPECT_THAT(rooms.QuarantinedSessions(kT0), ElementsAre(SessionOf(1)));
}

TEST(PrefillRoomsTest, UnknownTransfersAndRoomsWithoutTransfersAreIgnored) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  EXPECT_TRUE(rooms.TransferOutcome(9, absl::OkStatus(), "", kT0).events.empty());
  EXPECT_TRUE(rooms.TransfersSubmitted(9).cancels.empty());
  EXPECT_EQ(rooms.SessionOfTransfer(9), "");
  EXPECT_EQ(rooms.FailingFlag(9), nullptr);
  PrefillOutput out;
  EXPECT_TRUE(rooms.TransfersPrepared(9, 1, {"a:1"}, kT0, out).empty());
  EXPECT_TRUE(out.events.empty());
}

// A Success carries what landed: the bytes of every work handed out, the copies the transfers
// posted, and the time from the first work.
TEST(PrefillRoomsTest, ASuccessCarriesTheBytesCopiesAndSecondsThatLanded) {
  PrefillRooms rooms = MakeRooms();
  RegisterBoth(rooms);
  PrefillOutput posted;
  const std::vector<uint64_t> ids = Post(rooms, HandOut(rooms, 1), kT0, posted);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_TRUE(rooms.TransferOutcome(ids[0], absl::OkStatus(), "", kT0, true, 3).events.empty());
  PrefillOutput done =
      rooms.TransferOutcome(ids[1], absl::OkStatus(), "", kT0 + absl::Seconds(2), true, 5);
  ASSERT_THAT(States(done), ElementsAre(TransferPoll::kSuccess));
  EXPECT_EQ(done.events[0].bytes, 228u);
  EXPECT_EQ(done.events[0].copies, 8u);
  EXPECT_EQ(done.events[0].elapsed, absl::Seconds(2));
  EXPECT_EQ(rooms.rooms_transferring(), 0u);
}

// Layer-wise streaming: a room's works land one by one, and the room ends only once its final
// work and every earlier one have landed.
// A room Bootstrapped on both destinations whose layer 0 is final: its work, handed out.
TransferWork FirstLayerOf(PrefillRooms& rooms, uint64_t room) {
  RegisterBoth(rooms);
  Bootstrap(rooms, room);
  absl::StatusOr<PrefillOutput> first = rooms.LayersReady(room, SourceManifest(), 1, kT0);
  EXPECT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first.ok() ? first->transfers.size() : 0u, 1u);
  return first.ok() && !first->transfers.empty() ? first->transfers[0] : TransferWork{};
}

TEST(PrefillRoomsTest, ARoomOfSeveralWorksLandsWithItsFinalWorksLastOutcome) {
  PrefillRooms rooms = MakeRooms();
  const TransferWork layer0 = FirstLayerOf(rooms, 42);
  absl::StatusOr<PrefillOutput> rest = rooms.Ready(42, ReadyWith(7), kT0);
  ASSERT_TRUE(rest.ok()) << rest.status();
  ASSERT_EQ(rest->transfers.size(), 1u);
  PrefillOutput out;
  const std::vector<uint64_t> last = Post(rooms, rest->transfers[0], kT0, out);
  ASSERT_EQ(last.size(), 2u);
  for (uint64_t id : last) {
    EXPECT_TRUE(rooms.TransferOutcome(id, absl::OkStatus(), "", kT0).events.empty())
        << "landed while an earlier work is still being prepared";
  }
  const std::vector<uint64_t> earlier = Post(rooms, layer0, kT0, out);
  ASSERT_EQ(earlier.size(), 2u);
  EXPECT_TRUE(rooms.TransferOutcome(earlier[0], absl::OkStatus(), "", kT0).events.empty());
  PrefillOutput done = rooms.TransferOutcome(earlier[1], absl::OkStatus(), "", kT0);
  ASSERT_THAT(States(done), ElementsAre(TransferPoll::kSuccess));
  EXPECT_EQ(done.events[0].bytes, 228u);
}

// Failed means fenced between works too: with nothing in flight, at once.
TEST(PrefillRoomsTest, AFailureBetweenWorksWithNothingInFlightFailsAtOnce) {
  PrefillRooms rooms = MakeRooms();
  FirstLayerOf(rooms, 42);
  ASSERT_TRUE(LandAll(rooms, 42, kT0).ok());
  PrefillOutput aborted = rooms.Abort(42, "the engine aborted", kT0);
  EXPECT_THAT(aborted.fences, ElementsAre(42u));
  ASSERT_THAT(States(aborted), ElementsAre(TransferPoll::kFailed));
  EXPECT_FALSE(rooms.Find(42)->transfer.has_value());
}

}  // namespace
}  // namespace kvrail::session
