// DecodeRooms behaviour beyond the reference scenarios (decode_scenarios_test.cc): the
// registration cache per peer set, pre-allocation frames, the waiting timeout, heartbeats,
// malformed input, and forward-only state over random status sequences.
#include "control/session/decode_rooms.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "control/session/test_peers.h"
#include "control/wire/fence.h"
#include "control/wire/outcome.h"
#include "control/wire/preallocation.h"
#include "control/wire/registration.h"
#include "engine/base/error.h"

namespace kvrail::session {
namespace {

using kvrail::session::testing::DecodeContract;
using kvrail::session::testing::DecodeContractWire;
using kvrail::session::testing::DecodeManifest;
using kvrail::session::testing::DecodeManifestWire;
using kvrail::session::testing::StatusFrames;
using kvrail::session::testing::StatusFrames2026_09;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const absl::Time kT0 = absl::UnixEpoch() + absl::Hours(1);
constexpr char kPrefillA[] = "10.1.0.100:8998";
constexpr char kPrefillB[] = "10.1.0.200:8998";

DecodeIdentity Identity(int rank = 0) {
  DecodeIdentity identity;
  identity.endpoint = "10.2.0.1";
  identity.port = 18000;
  identity.session_id = "10.2.0.1:16000";
  identity.arena_base = 0x7e0000000000;
  identity.contract = DecodeContract();
  identity.decode_tp_size = 4;
  identity.decode_tp_rank = rank;
  return identity;
}

DecodeRooms MakeRooms(DecodeOptions options = {}, int rank = 0) {
  absl::StatusOr<DecodeRooms> rooms = DecodeRooms::Create(Identity(rank), options);
  EXPECT_TRUE(rooms.ok()) << rooms.status();
  return *std::move(rooms);
}

std::string PrefillEndpoint(int rank) { return absl::StrCat("tcp://10.1.0.100:", 17500 + rank); }

// E_d = expected, Z_d = dummies, T_d their union, with one endpoint per target.
RoomRoute Route(std::vector<int> expected, std::vector<int> dummies = {}, int dp_group = 0) {
  RoomRoute route;
  route.dp_group = dp_group;
  route.targets.expected_prefill_ranks = expected;
  route.targets.dummy_tp_ranks = dummies;
  std::set<int> all(expected.begin(), expected.end());
  all.insert(dummies.begin(), dummies.end());
  route.targets.target_tp_ranks.assign(all.begin(), all.end());
  for (int rank : route.targets.target_tp_ranks) {
    route.endpoints.push_back({rank, PrefillEndpoint(rank)});
  }
  return route;
}

// A room waiting for the Success of `expected`.
void Waiting(DecodeRooms& rooms, uint64_t room, const std::vector<int>& expected,
             const char* bootstrap = kPrefillA, absl::Time now = kT0) {
  ASSERT_TRUE(rooms.BeginRoom(room, bootstrap, now).ok());
  ASSERT_TRUE(rooms.OnRoute(room, Route(expected), now).ok());
  absl::StatusOr<DecodeOutput> allocated = rooms.OnAllocated(room, DecodeManifest(), now);
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  ASSERT_EQ(rooms.State(room), TransferPoll::kWaitingForInput);
}

std::vector<TransferPoll> States(const DecodeOutput& out) {
  std::vector<TransferPoll> states;
  for (const RoomEvent& e : out.events) states.push_back(e.state);
  return states;
}

TEST(DecodeRoomsTest, CreateChecksTheIdentity) {
  DecodeIdentity identity = Identity();
  identity.arena_base = 0;
  EXPECT_FALSE(DecodeRooms::Create(identity).ok());
  identity = Identity();
  identity.decode_tp_rank = 4;
  EXPECT_EQ(DecodeRooms::Create(identity).status().code(), absl::StatusCode::kInvalidArgument);
  identity = Identity();
  identity.session_id = "";
  EXPECT_FALSE(DecodeRooms::Create(identity).ok());
}

wire::Registration ParsedRegistration(const std::vector<std::string>& frames) {
  absl::StatusOr<wire::Registration> parsed =
      wire::ParseRegistration(frames, [](absl::string_view) { return absl::OkStatus(); });
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return parsed.ok() ? *parsed : wire::Registration{};
}

TEST(DecodeRoomsTest, RegistrationFramesCarryTheIdentityAndTheCanonicalContract) {
  DecodeRooms rooms = MakeRooms({}, 1);
  // The scenario's contract came in the snapshot's form; written in it, it is byte for byte.
  absl::StatusOr<std::vector<std::string>> frames =
      rooms.registration_frames(layout::Revision::kSnapshot);
  ASSERT_TRUE(frames.ok()) << frames.status();
  absl::StatusOr<wire::Registration> parsed =
      wire::ParseRegistration(*frames, [](absl::string_view) { return absl::OkStatus(); });
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->endpoint, "10.2.0.1");
  EXPECT_EQ(parsed->port, 18000);
  EXPECT_EQ(parsed->session_id, "10.2.0.1:16000");
  EXPECT_EQ(parsed->arena_base, 0x7e0000000000u);
  EXPECT_EQ(parsed->contract_wire, DecodeContractWire());
  EXPECT_EQ(parsed->decode_tp_size, 4u);
  EXPECT_EQ(parsed->decode_tp_rank, 1u);
}

// CACHEPD §12.12: a decode registers with a prefill node in the form of that node's layout, so
// a snapshot-era prefill (which refuses a 2026-09 contract) and a 2026-09 one (which refuses the
// snapshot's) both read it.
TEST(DecodeRoomsTest, ARouteRegistersInTheFormOfThePrefillNodesLayout) {
  DecodeRooms rooms = MakeRooms();
  for (layout::Revision form : {layout::Revision::kSnapshot, layout::Revision::k2026_09}) {
    const uint64_t room = form == layout::Revision::kSnapshot ? 1 : 2;
    ASSERT_TRUE(
        rooms.BeginRoom(room, form == layout::Revision::kSnapshot ? kPrefillA : kPrefillB, kT0)
            .ok());
    RoomRoute route = Route({0});
    route.revision = form;
    absl::StatusOr<DecodeOutput> out = rooms.OnRoute(room, route, kT0);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->messages.size(), 1u);
    absl::StatusOr<layout::Contract> sent =
        layout::ParseContract(ParsedRegistration(out->messages[0].frames).contract_wire);
    ASSERT_TRUE(sent.ok()) << sent.status();
    EXPECT_EQ(sent->revision, form);
  }
}

// A decode pinned to a revision (--cachepd-revision) writes only its form, whatever the node's.
TEST(DecodeRoomsTest, APinnedDecodeRegistersInItsOwnFormOnly) {
  DecodeOptions options;
  options.revision = layout::Revision::kSnapshot;
  DecodeRooms rooms = MakeRooms(options);
  ASSERT_TRUE(rooms.BeginRoom(1, kPrefillA, kT0).ok());
  RoomRoute route = Route({0});
  route.revision = layout::Revision::k2026_09;
  absl::StatusOr<DecodeOutput> out = rooms.OnRoute(1, route, kT0);
  ASSERT_TRUE(out.ok()) << out.status();
  absl::StatusOr<layout::Contract> sent =
      layout::ParseContract(ParsedRegistration(out->messages.at(0).frames).contract_wire);
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_EQ(sent->revision, layout::Revision::kSnapshot);
}

// A decode pinned to the snapshot reads status as the snapshot's reader: exactly 5 frames.
TEST(DecodeRoomsTest, ADecodePinnedToTheSnapshotDropsASevenFrameStatus) {
  DecodeOptions options;
  options.revision = layout::Revision::kSnapshot;
  DecodeRooms rooms = MakeRooms(options);
  Waiting(rooms, 9, {0});
  DecodeOutput seven = rooms.OnMessage(StatusFrames2026_09(9, 5, 0, 3, -0.5), kT0);
  EXPECT_THAT(seven.rejected.message(), HasSubstr("pinned to CachePD snapshot"));
  EXPECT_EQ(rooms.State(9), TransferPoll::kWaitingForInput);
  rooms.OnMessage(StatusFrames(9, 5, 0, 4), kT0);
  EXPECT_EQ(rooms.State(9), TransferPoll::kSuccess);
}

// A contract that only one form can carry fails the rooms routed to a node of the other
// revision at once, naming it, instead of registering a contract that node would refuse.
TEST(DecodeRoomsTest, AContractTheNodesFormCannotCarryFailsTheRoomAtOnceNamingTheRevision) {
  DecodeIdentity identity = Identity();
  identity.contract.plan.resident_block_bytes = identity.contract.plan.lcm_block_bytes;
  identity.contract.revision = layout::Revision::k2026_09;
  absl::StatusOr<DecodeRooms> rooms = DecodeRooms::Create(identity);
  ASSERT_TRUE(rooms.ok()) << rooms.status();
  EXPECT_FALSE(rooms->registration_frames(layout::Revision::kSnapshot).ok());
  ASSERT_TRUE(rooms->BeginRoom(1, kPrefillA, kT0).ok());
  RoomRoute route = Route({0});
  route.revision = layout::Revision::kSnapshot;
  absl::StatusOr<DecodeOutput> out = rooms->OnRoute(1, route, kT0);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(), HasSubstr("speaks CachePD snapshot"));
}

TEST(DecodeRoomsTest, RouteRegistersWithEveryTargetOncePerPeerSet) {
  DecodeRooms rooms = MakeRooms();
  ASSERT_TRUE(rooms.BeginRoom(1, kPrefillA, kT0).ok());
  absl::StatusOr<DecodeOutput> first = rooms.OnRoute(1, Route({0}, {1}), kT0);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->messages.size(), 2u);
  EXPECT_EQ(first->messages[0].endpoint, PrefillEndpoint(0));
  EXPECT_EQ(first->messages[1].endpoint, PrefillEndpoint(1));
  EXPECT_EQ(first->messages[0].frames, *rooms.registration_frames());
  EXPECT_THAT(States(*first), ElementsAre(TransferPoll::kBootstrapped));
  EXPECT_TRUE(rooms.IsRegistered(kPrefillA, 0, {0, 1}));

  // Same bootstrap address, DP group and targets: no second registration.
  ASSERT_TRUE(rooms.BeginRoom(2, kPrefillA, kT0).ok());
  absl::StatusOr<DecodeOutput> second = rooms.OnRoute(2, Route({0}, {1}), kT0);
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(second->messages.empty());
  EXPECT_EQ(rooms.State(2), TransferPoll::kBootstrapped);

  // Another DP group, another prefill node: registered again.
  ASSERT_TRUE(rooms.BeginRoom(3, kPrefillA, kT0).ok());
  EXPECT_EQ(rooms.OnRoute(3, Route({0}, {1}, /*dp_group=*/1), kT0)->messages.size(), 2u);
  ASSERT_TRUE(rooms.BeginRoom(4, kPrefillB, kT0).ok());
  EXPECT_EQ(rooms.OnRoute(4, Route({0}, {1}), kT0)->messages.size(), 2u);

  // After forgetting a node's peer sets, its next room registers again.
  rooms.ForgetPeerSets(kPrefillA);
  EXPECT_FALSE(rooms.IsRegistered(kPrefillA, 0, {0, 1}));
  EXPECT_TRUE(rooms.IsRegistered(kPrefillB, 0, {0, 1}));
  ASSERT_TRUE(rooms.BeginRoom(5, kPrefillA, kT0).ok());
  EXPECT_EQ(rooms.OnRoute(5, Route({0}, {1}), kT0)->messages.size(), 2u);
}

TEST(DecodeRoomsTest, RouteRefusesInconsistentTargetsAndChangesNothing) {
  DecodeRooms rooms = MakeRooms({}, 1);
  ASSERT_TRUE(rooms.BeginRoom(1, kPrefillA, kT0).ok());
  RoomRoute no_expected = Route({});
  EXPECT_EQ(rooms.OnRoute(1, no_expected, kT0).status().code(), absl::StatusCode::kInvalidArgument);
  RoomRoute dummies_off_rank_zero = Route({0}, {1});
  EXPECT_EQ(rooms.OnRoute(1, dummies_off_rank_zero, kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
  RoomRoute wrong_union = Route({0, 1});
  wrong_union.targets.target_tp_ranks = {0};
  EXPECT_EQ(rooms.OnRoute(1, wrong_union, kT0).status().code(), absl::StatusCode::kInvalidArgument);
  RoomRoute missing_endpoint = Route({0, 1});
  missing_endpoint.endpoints.pop_back();
  EXPECT_EQ(rooms.OnRoute(1, missing_endpoint, kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rooms.State(1), TransferPoll::kBootstrapping);
  EXPECT_EQ(rooms.OnRoute(9, Route({0}), kT0).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(rooms.OnRoute(1, Route({0, 1}), kT0).ok());
  EXPECT_EQ(rooms.OnRoute(1, Route({0, 1}), kT0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(DecodeRoomsTest, PreallocationsSendTheManifestToDataTargetsAndNothingToDummies) {
  DecodeRooms rooms = MakeRooms();
  ASSERT_TRUE(rooms.BeginRoom(42, kPrefillA, kT0).ok());
  ASSERT_TRUE(rooms.OnRoute(42, Route({0}, {1}), kT0).ok());
  absl::StatusOr<DecodeOutput> out = rooms.OnAllocated(42, DecodeManifest(), kT0);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->messages.size(), 2u);
  EXPECT_EQ(out->messages[0].endpoint, PrefillEndpoint(0));
  EXPECT_THAT(out->messages[0].frames, ElementsAre("42", "10.2.0.1:16000", DecodeManifestWire()));
  EXPECT_EQ(out->messages[1].endpoint, PrefillEndpoint(1));
  EXPECT_THAT(out->messages[1].frames, ElementsAre("42", "10.2.0.1:16000", ""));
  EXPECT_THAT(States(*out), ElementsAre(TransferPoll::kWaitingForInput));
}

TEST(DecodeRoomsTest, AllocationNeedsARouteAndAValidManifest) {
  DecodeRooms rooms = MakeRooms();
  ASSERT_TRUE(rooms.BeginRoom(42, kPrefillA, kT0).ok());
  EXPECT_EQ(rooms.OnAllocated(42, DecodeManifest(), kT0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(rooms.OnRoute(42, Route({0}), kT0).ok());
  layout::Manifest broken = DecodeManifest();
  broken.groups[0].block_ids.push_back(6);  // one block too many for full_suffix
  EXPECT_FALSE(rooms.OnAllocated(42, broken, kT0).ok());
  EXPECT_EQ(rooms.State(42), TransferPoll::kBootstrapped);
  ASSERT_TRUE(rooms.OnAllocated(42, DecodeManifest(), kT0).ok());
  EXPECT_EQ(rooms.OnAllocated(42, DecodeManifest(), kT0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(DecodeRoomsTest, APeersIntermediateStatusDoesNotSkipTheRoomsOwnSteps) {
  DecodeRooms rooms = MakeRooms();
  ASSERT_TRUE(rooms.BeginRoom(42, kPrefillA, kT0).ok());
  // Merged by the update rule as the reference does (§3.4 item 4)...
  EXPECT_THAT(States(rooms.OnMessage(StatusFrames(42, 3, 0), kT0)),
              ElementsAre(TransferPoll::kWaitingForInput));
  // ...but the room still registers, pre-allocates, and times out from its own pre-allocation.
  EXPECT_EQ(rooms.OnRoute(42, Route({0}), kT0)->messages.size(), 1u);
  EXPECT_EQ(rooms.OnAllocated(42, DecodeManifest(), kT0 + absl::Seconds(100))->messages.size(), 1u);
  EXPECT_TRUE(rooms.Tick(kT0 + absl::Seconds(399)).events.empty());
  EXPECT_THAT(States(rooms.Tick(kT0 + absl::Seconds(400))), ElementsAre(TransferPoll::kFailed));
}

// Exactly one terminal event per room: a route or allocation that comes after the room failed
// (the engine aborted while the bootstrap lookup ran) sends nothing and reports nothing again.
TEST(DecodeRoomsTest, CallsOnAFailedRoomSendNothingAndReportNothingAgain) {
  DecodeRooms rooms = MakeRooms();
  ASSERT_TRUE(rooms.BeginRoom(42, kPrefillA, kT0).ok());
  ASSERT_THAT(States(rooms.Fail(42, "bootstrap GET failed", kT0)),
              ElementsAre(TransferPoll::kFailed));
  absl::StatusOr<DecodeOutput> routed = rooms.OnRoute(42, Route({0}), kT0);
  ASSERT_TRUE(routed.ok());
  EXPECT_TRUE(routed->messages.empty());
  EXPECT_TRUE(routed->events.empty());
  absl::StatusOr<DecodeOutput> allocated = rooms.OnAllocated(42, DecodeManifest(), kT0);
  ASSERT_TRUE(allocated.ok());
  EXPECT_TRUE(allocated->messages.empty());
  EXPECT_TRUE(allocated->events.empty());
  EXPECT_EQ(rooms.Find(42)->failure_reason, "bootstrap GET failed");
}

TEST(DecodeRoomsTest, SuccessNeedsExactlyTheExpectedRanks) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 7, {0, 1});
  EXPECT_TRUE(States(rooms.OnMessage(StatusFrames(7, 5, 1, 99, {{4}}), kT0)).empty());
  DecodeOutput done = rooms.OnMessage(StatusFrames(7, 5, 0, 12), kT0);
  ASSERT_THAT(States(done), ElementsAre(TransferPoll::kSuccess));
  EXPECT_EQ(done.events[0].bootstrap_token, 99);  // the first Success carrying one
  EXPECT_EQ(done.events[0].spec_candidate_ids, (std::vector<int32_t>{4}));
}

// CACHEPD §12.9: TP ranks report overlapping prefixes; every Success of an expected rank,
// repeated ones included, raises the count.
TEST(DecodeRoomsTest, CachedTokensAreTheMaximumOverEverySuccessOfAnExpectedRank) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 7, {0, 1});
  rooms.OnMessage(StatusFrames2026_09(7, 5, 0, 40, std::nullopt), kT0);
  rooms.OnMessage(StatusFrames2026_09(7, 5, 0, 90, std::nullopt), kT0);  // repeated: counts
  EXPECT_EQ(rooms.Find(7)->cached_tokens, 90);
  DecodeOutput done = rooms.OnMessage(StatusFrames2026_09(7, 5, 1, 64, std::nullopt), kT0);
  ASSERT_THAT(States(done), ElementsAre(TransferPoll::kSuccess));
  EXPECT_EQ(done.events[0].cached_tokens, 90);
}

TEST(DecodeRoomsTest, TheFirstLogprobThatIsNotNoneIsKept) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 7, {0, 1, 2});
  rooms.OnMessage(StatusFrames2026_09(7, 5, 2, 0, std::nullopt), kT0);
  rooms.OnMessage(StatusFrames2026_09(7, 5, 0, 0, -0.5), kT0);
  DecodeOutput done = rooms.OnMessage(StatusFrames2026_09(7, 5, 1, 0, -3.0), kT0);
  ASSERT_THAT(States(done), ElementsAre(TransferPoll::kSuccess));
  EXPECT_EQ(done.events[0].bootstrap_logprob, -0.5);
  EXPECT_EQ(rooms.Find(7)->bootstrap_logprob, -0.5);
}

TEST(DecodeRoomsTest, FiveFrameSendersMeanZeroCachedTokensAndNoLogprob) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 7, {0});
  DecodeOutput done = rooms.OnMessage(StatusFrames(7, 5, 0, 12), kT0);
  ASSERT_THAT(States(done), ElementsAre(TransferPoll::kSuccess));
  EXPECT_EQ(done.events[0].cached_tokens, 0);
  EXPECT_EQ(done.events[0].bootstrap_logprob, std::nullopt);
}

TEST(DecodeRoomsTest, OnlySuccessesOfExpectedRanksCountTheirCachedTokensAndLogprob) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 7, {0, 1});
  rooms.OnMessage(StatusFrames2026_09(7, 0, 0, 500, -1.0), kT0);  // Failed: values ignored
  EXPECT_EQ(rooms.Find(7)->cached_tokens, 0);
  Waiting(rooms, 8, {0, 1});
  rooms.OnMessage(StatusFrames2026_09(8, 5, 3, 500, -1.0), kT0);  // unexpected rank
  EXPECT_EQ(rooms.Find(8)->cached_tokens, 0);
  EXPECT_EQ(rooms.Find(8)->bootstrap_logprob, std::nullopt);
}

TEST(DecodeRoomsTest, SuccessFromAnUnexpectedRankFailsTheRoomForGood) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 7, {0, 1});
  DecodeOutput wrong = rooms.OnMessage(StatusFrames(7, 5, 2), kT0);
  ASSERT_THAT(States(wrong), ElementsAre(TransferPoll::kFailed));
  EXPECT_THAT(wrong.events[0].reason, HasSubstr("unexpected Prefill TP rank 2"));
  EXPECT_TRUE(States(rooms.OnMessage(StatusFrames(7, 5, 0), kT0)).empty());
  EXPECT_TRUE(States(rooms.OnMessage(StatusFrames(7, 5, 1), kT0)).empty());
  EXPECT_EQ(rooms.State(7), TransferPoll::kFailed);
}

TEST(DecodeRoomsTest, WaitingTimeoutFailsRoomsStillWaiting) {
  DecodeOptions options;
  options.timeouts.waiting_timeout = absl::Seconds(300);
  DecodeRooms rooms = MakeRooms(options);
  Waiting(rooms, 1, {0, 1});
  rooms.OnMessage(StatusFrames(1, 5, 0), kT0);
  ASSERT_TRUE(rooms.BeginRoom(2, kPrefillA, kT0).ok());  // not waiting: no timeout
  EXPECT_TRUE(rooms.Tick(kT0 + absl::Seconds(299)).events.empty());
  DecodeOutput expired = rooms.Tick(kT0 + absl::Seconds(300));
  ASSERT_THAT(States(expired), ElementsAre(TransferPoll::kFailed));
  EXPECT_EQ(expired.events[0].room, 1u);
  EXPECT_EQ(expired.events[0].cause, FailureCause::kTimeout);
  EXPECT_THAT(expired.events[0].reason, HasSubstr("waiting timeout"));
  EXPECT_THAT(expired.events[0].reason, HasSubstr("{0} of {0,1}"));
  EXPECT_EQ(rooms.State(2), TransferPoll::kBootstrapping);
  EXPECT_TRUE(rooms.Tick(kT0 + absl::Seconds(900)).events.empty());
}

TEST(DecodeRoomsTest, ConsecutiveFailedHealthProbesDeclareThePrefillDead) {
  DecodeOptions options;
  options.timeouts.heartbeat_max_failures = 3;
  DecodeRooms rooms = MakeRooms(options);
  Waiting(rooms, 1, {0}, kPrefillA);
  Waiting(rooms, 2, {0}, kPrefillA);
  rooms.OnMessage(StatusFrames(2, 5, 0), kT0);  // already Success: spared
  Waiting(rooms, 3, {0}, kPrefillB);

  EXPECT_TRUE(rooms.OnHealth(kPrefillA, false, kT0).events.empty());
  EXPECT_TRUE(rooms.OnHealth(kPrefillA, true, kT0).events.empty());  // resets the count
  EXPECT_TRUE(rooms.OnHealth(kPrefillA, false, kT0).events.empty());
  EXPECT_TRUE(rooms.OnHealth(kPrefillA, false, kT0).events.empty());
  DecodeOutput dead = rooms.OnHealth(kPrefillA, false, kT0);
  ASSERT_THAT(States(dead), ElementsAre(TransferPoll::kFailed));
  EXPECT_EQ(dead.events[0].room, 1u);
  EXPECT_EQ(dead.events[0].cause, FailureCause::kPeerFailed);
  EXPECT_THAT(dead.events[0].reason, HasSubstr("declared dead after 3"));
  EXPECT_THAT(dead.dead_prefills, ElementsAre(kPrefillA));
  EXPECT_EQ(rooms.State(2), TransferPoll::kSuccess);
  EXPECT_EQ(rooms.State(3), TransferPoll::kWaitingForInput);
  EXPECT_FALSE(rooms.IsRegistered(kPrefillA, 0, {0}));
  EXPECT_TRUE(rooms.IsRegistered(kPrefillB, 0, {0}));
}

TEST(DecodeRoomsTest, HealthFailureLimitIsAtLeastOne) {
  DecodeOptions options;
  options.timeouts.heartbeat_max_failures = 0;
  DecodeRooms rooms = MakeRooms(options);
  Waiting(rooms, 1, {0});
  EXPECT_THAT(States(rooms.OnHealth(kPrefillA, false, kT0)), ElementsAre(TransferPoll::kFailed));
}

// A room's one terminal event is remembered with the room's end (Poll's answer) until the
// room id is used again; the ledger never makes a second one.
TEST(DecodeRoomsTest, ARoomsEndIsRememberedUntilItsIdIsUsedAgain) {
  DecodeRooms rooms = MakeRooms();
  ASSERT_TRUE(rooms.BeginRoom(3, kPrefillA, kT0).ok());
  ASSERT_THAT(States(rooms.Fail(3, "the engine gave it up", kT0)),
              ElementsAre(TransferPoll::kFailed));
  rooms.Free(3);
  ASSERT_NE(rooms.Ended(3), nullptr);
  EXPECT_EQ(rooms.Ended(3)->state, TransferPoll::kFailed);
  EXPECT_EQ(rooms.Ended(3)->reason, "the engine gave it up");
  EXPECT_EQ(rooms.EndedCount(), 1u);
  ASSERT_TRUE(rooms.BeginRoom(3, kPrefillA, kT0).ok());  // a new room, with its own end
  EXPECT_EQ(rooms.Ended(3), nullptr);
  ASSERT_THAT(States(rooms.Fail(3, "again", kT0)), ElementsAre(TransferPoll::kFailed));
  EXPECT_EQ(rooms.Ended(3)->reason, "again");
}

TEST(DecodeRoomsTest, BootstrapAddressesListWhatToProbe) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 1, {0}, kPrefillB);
  ASSERT_TRUE(rooms.BeginRoom(2, kPrefillA, kT0).ok());
  EXPECT_THAT(rooms.BootstrapAddresses(), ElementsAre(kPrefillA, kPrefillB));
  rooms.Free(1);
  rooms.Free(2);
  EXPECT_THAT(rooms.BootstrapAddresses(), ElementsAre(kPrefillB));  // its peer set remains
}

TEST(DecodeRoomsTest, LenientParsingAcceptsWhatTheReferenceAccepts) {
  const std::vector<std::string> loose = {"+7", " 5", "0_0", "0012"};  // 4 frames
  DecodeRooms strict = MakeRooms();
  Waiting(strict, 7, {0});
  DecodeOutput dropped = strict.OnMessage(loose, kT0);
  EXPECT_EQ(CategoryOf(dropped.rejected), ErrorCategory::kInvalidFrame);
  EXPECT_EQ(strict.State(7), TransferPoll::kWaitingForInput);

  DecodeOptions options;
  options.lenient_status = true;
  DecodeRooms lenient = MakeRooms(options);
  Waiting(lenient, 7, {0});
  DecodeOutput done = lenient.OnMessage(loose, kT0);
  EXPECT_TRUE(done.rejected.ok()) << done.rejected;
  ASSERT_THAT(States(done), ElementsAre(TransferPoll::kSuccess));
  EXPECT_EQ(done.events[0].bootstrap_token, 12);
}

TEST(DecodeRoomsTest, MalformedStatusMessagesAreDroppedWithAReasonAndTouchNoRoom) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 7, {0, 1});
  rooms.OnMessage(StatusFrames(7, 5, 0, 3), kT0);
  const std::vector<std::vector<std::string>> garbage = {
      {},
      {"7"},
      {"7", "5", "1"},               // strict: exactly 5 frames
      {"7", "9", "1", "-1", ""},     // not a TransferPoll code
      {"7", "5", "1", "-1", "abc"},  // speculative ids not int32s
      {"7", "5", "x", "-1", ""},
      {"99999999999999999999", "5", "1", "-1", ""},
      {"7", "5", "1", "-1", "", "extra"},
  };
  for (const std::vector<std::string>& frames : garbage) {
    DecodeOutput out = rooms.OnMessage(frames, kT0);
    EXPECT_FALSE(out.rejected.ok());
    EXPECT_FALSE(out.rejected.message().empty());
    EXPECT_TRUE(out.events.empty());
  }
  std::optional<DecodeRoomView> view = rooms.Find(7);
  EXPECT_EQ(view->state, TransferPoll::kWaitingForInput);
  EXPECT_THAT(view->responders, ElementsAre(0));
  DecodeOutput done = rooms.OnMessage(StatusFrames(7, 5, 1), kT0);
  ASSERT_THAT(States(done), ElementsAre(TransferPoll::kSuccess));
  EXPECT_EQ(done.events[0].bootstrap_token, 3);
}

TEST(DecodeRoomsTest, FailIgnoresUnknownRoomsAndKeepsTheFirstReason) {
  DecodeRooms rooms = MakeRooms();
  EXPECT_TRUE(rooms.Fail(5, "x", kT0).events.empty());
  ASSERT_TRUE(rooms.BeginRoom(5, kPrefillA, kT0).ok());
  EXPECT_THAT(States(rooms.Fail(5, "first", kT0)), ElementsAre(TransferPoll::kFailed));
  EXPECT_TRUE(rooms.Fail(5, "second", kT0).events.empty());
  EXPECT_EQ(rooms.Find(5)->failure_reason, "first");
}

TEST(DecodeRoomsTest, BeginRoomRefusesDuplicatesAndRoomsOutOfRange) {
  DecodeRooms rooms = MakeRooms();
  ASSERT_TRUE(rooms.BeginRoom(5, kPrefillA, kT0).ok());
  EXPECT_EQ(rooms.BeginRoom(5, kPrefillA, kT0).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(rooms.BeginRoom(uint64_t{1} << 63, kPrefillA, kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Property: whatever status messages arrive, in whatever order, a room's state never moves
// backwards, Failed never changes, and Success happens exactly when every expected rank has
// sent Success before any Failed or any Success from outside the set.
TEST(DecodeRoomsTest, RandomStatusSequencesAreForwardOnlyAndExact) {
  std::mt19937 random(11);
  for (int trial = 0; trial < 500; ++trial) {
    DecodeRooms rooms = MakeRooms();
    std::vector<int> expected;
    for (int rank = 0; rank < 4; ++rank) {
      if (random() % 2 == 0) expected.push_back(rank);
    }
    if (expected.empty()) expected.push_back(static_cast<int>(random() % 4));
    Waiting(rooms, 1, expected);
    std::set<int> counted;
    bool broken = false;  // a Failed or an unexpected Success came first
    TransferPoll previous = TransferPoll::kWaitingForInput;
    bool ever_succeeded = false;  // after Success, later messages follow the update rule only
    std::string history = absl::StrCat("expected ", expected.size(), ":");
    for (int step = 0; step < 10; ++step) {
      const int rank = static_cast<int>(random() % 5);
      const int status = static_cast<int>(random() % 6);
      const bool in_set = std::binary_search(expected.begin(), expected.end(), rank);
      const bool succeeded_before = ever_succeeded;
      rooms.OnMessage(StatusFrames(1, status, rank, rank), kT0);
      history += absl::StrCat(" ", status, "@", rank, "->", TransferPollCode(*rooms.State(1)));
      SCOPED_TRACE(history);
      if (!succeeded_before && !broken) {
        if (status == 0 || (status == 5 && !in_set)) broken = true;
        if (status == 5 && in_set) counted.insert(rank);
      }
      const TransferPoll state = *rooms.State(1);
      if (previous == TransferPoll::kFailed) {
        EXPECT_EQ(state, TransferPoll::kFailed);
      } else if (state != TransferPoll::kFailed) {
        EXPECT_GE(state, previous);
      }
      if (!succeeded_before) {
        const bool complete = !broken && counted.size() == expected.size();
        EXPECT_EQ(state == TransferPoll::kSuccess, complete);
        EXPECT_EQ(state == TransferPoll::kFailed, broken);
      }
      ever_succeeded = ever_succeeded || state == TransferPoll::kSuccess;
      previous = state;
    }
  }
}

// --- Failed means fenced, on the decode side -------------------------------------------------

std::vector<std::string> FenceTargets(const DecodeOutput& out, uint64_t room) {
  std::vector<std::string> endpoints;
  for (const OutboundMessage& m : out.messages) {
    absl::StatusOr<wire::FenceRequest> request = wire::ParseFenceRequest(m.frames);
    if (request.ok() && request->room == room) {
      EXPECT_EQ(request->session_id, "10.2.0.1:16000");
      endpoints.push_back(m.endpoint);
    }
  }
  return endpoints;
}

DecodeOutput Fenced(DecodeRooms& rooms, uint64_t room, int rank, absl::Time now = kT0) {
  return rooms.OnMessage(wire::BuildFencedAnswer({room, static_cast<uint32_t>(rank)}).value(), now);
}

TEST(DecodeRoomsTest, ARoomThatFailsBeforeItsPreallocationsHasReusablePages) {
  DecodeRooms rooms = MakeRooms();
  ASSERT_TRUE(rooms.BeginRoom(1, kPrefillA, kT0).ok());
  DecodeOutput failed = rooms.Fail(1, "the engine aborted", kT0);
  ASSERT_THAT(States(failed), ElementsAre(TransferPoll::kFailed));
  EXPECT_EQ(failed.events[0].pages, Pages::kReusable);
  EXPECT_TRUE(failed.messages.empty());
  EXPECT_EQ(rooms.fence_count(), 0u);
}

TEST(DecodeRoomsTest, AnAbortAfterThePreallocationsHoldsThePagesUntilEveryWriterFenced) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 2, {0, 1});
  DecodeOutput failed = rooms.Fail(2, "the engine aborted", kT0);
  ASSERT_THAT(States(failed), ElementsAre(TransferPoll::kFailed));
  EXPECT_EQ(failed.events[0].pages, Pages::kHeld);
  EXPECT_THAT(FenceTargets(failed, 2), ElementsAre(PrefillEndpoint(0), PrefillEndpoint(1)));
  rooms.Free(2);  // the engine saw Failed; the fence stays
  EXPECT_TRUE(Fenced(rooms, 2, 0).releases.empty());
  EXPECT_TRUE(Fenced(rooms, 2, 0).releases.empty()) << "a repeated answer counts once";
  DecodeOutput last = Fenced(rooms, 2, 1, kT0 + absl::Milliseconds(40));
  ASSERT_EQ(last.releases.size(), 1u);
  EXPECT_EQ(last.releases[0].room, 2u);
  EXPECT_TRUE(last.releases[0].proven);
  EXPECT_EQ(last.releases[0].waited, absl::Milliseconds(40));
  EXPECT_EQ(rooms.fence_count(), 0u);
  EXPECT_FALSE(Fenced(rooms, 2, 1).rejected.ok()) << "an answer for pages not held";
}

TEST(DecodeRoomsTest, RanksThatSentSuccessNeedNoFence) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 3, {0, 1});
  ASSERT_TRUE(rooms.OnMessage(StatusFrames(3, 5, 0), kT0).rejected.ok());
  DecodeOutput failed = rooms.OnMessage(StatusFrames(3, 0, 1), kT0);  // rank 1 reports Failed
  ASSERT_THAT(States(failed), ElementsAre(TransferPoll::kFailed));
  EXPECT_THAT(FenceTargets(failed, 3), ElementsAre(PrefillEndpoint(1)));
  EXPECT_TRUE(Fenced(rooms, 3, 1).releases.at(0).proven);
}

TEST(DecodeRoomsTest, UnansweredFencesReleaseThePagesAsUnprovenAfterTheWait) {
  DecodeOptions options;
  options.fence_wait = absl::Seconds(2);
  DecodeRooms rooms = MakeRooms(options);
  Waiting(rooms, 4, {0, 1});
  ASSERT_EQ(rooms.Fail(4, "client went away", kT0).events.at(0).pages, Pages::kHeld);
  Fenced(rooms, 4, 0);
  EXPECT_TRUE(rooms.Tick(kT0 + absl::Seconds(1)).releases.empty());
  DecodeOutput late = rooms.Tick(kT0 + absl::Seconds(2));
  ASSERT_EQ(late.releases.size(), 1u);
  EXPECT_FALSE(late.releases[0].proven);
  EXPECT_THAT(late.releases[0].reason, HasSubstr("prefill rank 1 at " + PrefillEndpoint(1)));
  EXPECT_THAT(late.releases[0].reason, HasSubstr("not provably safe"));
  EXPECT_EQ(late.releases[0].waited, absl::Seconds(2));
  EXPECT_EQ(rooms.fence_count(), 0u);
}

TEST(DecodeRoomsTest, AWaitingTimeoutFencesToo) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 5, {0});
  DecodeOutput expired = rooms.Tick(kT0 + absl::Seconds(300));
  ASSERT_THAT(States(expired), ElementsAre(TransferPoll::kFailed));
  EXPECT_EQ(expired.events[0].pages, Pages::kHeld);
  EXPECT_THAT(FenceTargets(expired, 5), ElementsAre(PrefillEndpoint(0)));
}

// --- a staged arena: copies back into a room's pages hold their release ----------------------

// Two prefill ranks' Successes copied back in turn; the room fails while both copies run, and its
// fence is answered at once: the release waits for the room's last copy.
TEST(DecodeRoomsTest, APageReleaseWaitsForTheRoomsLastCopyBackIntoItsPages) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 7, {0, 1});
  Waiting(rooms, 8, {0});
  rooms.BeginStaging(7);
  rooms.BeginStaging(7);
  rooms.BeginStaging(8);
  DecodeOutput failed = rooms.Fail(7, "the engine aborted", kT0);
  ASSERT_THAT(States(failed), ElementsAre(TransferPoll::kFailed));
  EXPECT_EQ(failed.events[0].pages, Pages::kHeld);
  rooms.Free(7);
  EXPECT_TRUE(Fenced(rooms, 7, 0).releases.empty());
  EXPECT_TRUE(Fenced(rooms, 7, 1).releases.empty()) << "two copies into room 7 still run";
  EXPECT_TRUE(rooms.EndStaging(7, kT0).releases.empty()) << "one copy into room 7 still runs";
  EXPECT_EQ(rooms.fence_count(), 1u);
  DecodeOutput last = rooms.EndStaging(7, kT0 + absl::Milliseconds(30));
  ASSERT_EQ(last.releases.size(), 1u);
  EXPECT_EQ(last.releases[0].room, 7u);
  EXPECT_TRUE(last.releases[0].proven);
  EXPECT_EQ(last.releases[0].waited, absl::Milliseconds(30));
  EXPECT_EQ(rooms.fence_count(), 0u);
  EXPECT_TRUE(rooms.EndStaging(7, kT0).releases.empty()) << "room 7 has no copy running any more";
  EXPECT_TRUE(rooms.EndStaging(8, kT0).releases.empty()) << "room 8's copy is its own, and live";
  EXPECT_EQ(rooms.State(8), TransferPoll::kWaitingForInput);
}

// A fence whose wait ran out while a copy runs decides its (unproven) release once, and holds
// it; so does a fence every rank answered while a copy still fills the pages.
TEST(DecodeRoomsTest, AHeldReleaseIsDecidedOnceAndSentWhenTheCopyReturns) {
  DecodeOptions options;
  options.fence_wait = absl::Seconds(2);
  DecodeRooms rooms = MakeRooms(options);
  Waiting(rooms, 9, {0});
  rooms.BeginStaging(9);
  ASSERT_EQ(rooms.Fail(9, "aborted", kT0).events.at(0).pages, Pages::kHeld);
  EXPECT_TRUE(rooms.Tick(kT0 + absl::Seconds(2)).releases.empty());
  EXPECT_TRUE(rooms.Tick(kT0 + absl::Seconds(4)).releases.empty()) << "decided once";
  DecodeOutput released = rooms.EndStaging(9, kT0 + absl::Seconds(5));
  ASSERT_EQ(released.releases.size(), 1u);
  EXPECT_FALSE(released.releases[0].proven);
  EXPECT_THAT(released.releases[0].reason, HasSubstr("not provably safe"));

  // Rank 0 sent Success (so no fence asks it), but its copy back still runs when rank 1 fails.
  Waiting(rooms, 10, {0, 1});
  rooms.BeginStaging(10);
  ASSERT_TRUE(rooms.OnMessage(StatusFrames(10, 5, 0), kT0).rejected.ok());
  DecodeOutput failed = rooms.OnMessage(StatusFrames(10, 0, 1), kT0);
  ASSERT_THAT(States(failed), ElementsAre(TransferPoll::kFailed));
  EXPECT_EQ(failed.events[0].pages, Pages::kHeld);
  EXPECT_THAT(FenceTargets(failed, 10), ElementsAre(PrefillEndpoint(1)));
  EXPECT_TRUE(Fenced(rooms, 10, 1).releases.empty()) << "rank 0's copy still runs";
  DecodeOutput copied = rooms.EndStaging(10, kT0);
  ASSERT_EQ(copied.releases.size(), 1u);
  EXPECT_TRUE(copied.releases[0].proven);
  EXPECT_EQ(rooms.fence_count(), 0u);
}

TEST(DecodeRoomsTest, ARoomWhosePagesAreHeldCannotBeBegunAgain) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 6, {0});
  rooms.Fail(6, "aborted", kT0);
  rooms.Free(6);
  EXPECT_EQ(rooms.BeginRoom(6, kPrefillA, kT0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  Fenced(rooms, 6, 0);
  EXPECT_TRUE(rooms.BeginRoom(6, kPrefillA, kT0).ok());
}

TEST(DecodeRoomsTest, APrefillRankThatIsGoneFailsItsRoomsAndAnswersItsFences) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 7, {0, 1});
  Waiting(rooms, 8, {0});
  EXPECT_THAT(rooms.PrefillEndpoints(), ElementsAre(PrefillEndpoint(0), PrefillEndpoint(1)));
  // Room 8 fails for its own reason; its fence waits for rank 0.
  ASSERT_EQ(rooms.Fail(8, "aborted", kT0).events.at(0).pages, Pages::kHeld);
  DecodeOutput gone = rooms.OnPrefillGone(PrefillEndpoint(0), kT0 + absl::Seconds(1));
  ASSERT_THAT(States(gone), ElementsAre(TransferPoll::kFailed));
  EXPECT_EQ(gone.events[0].room, 7u);
  EXPECT_EQ(gone.events[0].cause, FailureCause::kPeerFailed);
  EXPECT_THAT(gone.events[0].reason, HasSubstr("is gone"));
  EXPECT_EQ(gone.events[0].pages, Pages::kHeld);  // rank 1 may still write room 7
  EXPECT_THAT(FenceTargets(gone, 7), ElementsAre(PrefillEndpoint(1)));
  ASSERT_EQ(gone.releases.size(), 1u);
  EXPECT_EQ(gone.releases[0].room, 8u);
  EXPECT_TRUE(gone.releases[0].proven);
  EXPECT_THAT(rooms.PrefillEndpoints(), ElementsAre(PrefillEndpoint(1)));
}

// An unproven answer (the prefill disconnected a data plane that did not drain) asks the caller
// to refuse that writer first; the pages are held until it says whether it could.
DecodeOutput UnprovenAnswer(DecodeRooms& rooms, uint64_t room, int rank) {
  return rooms.OnMessage(
      wire::BuildFencedAnswer(
          {.room = room, .prefill_rank = static_cast<uint32_t>(rank), .proven = false})
          .value(),
      kT0);
}

TEST(DecodeRoomsTest, AnUnprovenFenceAnswerWhoseWriterCannotBeRefusedReleasesUnproven) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 9, {0});
  rooms.Fail(9, "aborted", kT0);
  DecodeOutput answered = UnprovenAnswer(rooms, 9, 0);
  EXPECT_THAT(answered.refuse_writers, ElementsAre(PrefillEndpoint(0)));
  EXPECT_TRUE(answered.releases.empty());  // held until the caller says
  EXPECT_TRUE(rooms.OnWriterRefused(PrefillEndpoint(1), false, kT0).releases.empty());
  DecodeOutput released = rooms.OnWriterRefused(PrefillEndpoint(0), false, kT0);
  ASSERT_EQ(released.releases.size(), 1u);
  EXPECT_FALSE(released.releases[0].proven);
  EXPECT_THAT(released.releases[0].reason, HasSubstr("disconnecting"));
  EXPECT_EQ(rooms.fence_count(), 0u);
}

TEST(DecodeRoomsTest, AnUnprovenFenceAnswerWhoseWriterWasRefusedReleasesProven) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 9, {0, 1});
  Waiting(rooms, 10, {0});
  rooms.Fail(9, "aborted", kT0);
  rooms.Fail(10, "aborted", kT0);
  // Rank 0 answers both rooms unproven (one disconnect of its data plane): one refusal asked.
  DecodeOutput first = UnprovenAnswer(rooms, 9, 0);
  EXPECT_THAT(first.refuse_writers, ElementsAre(PrefillEndpoint(0)));
  EXPECT_TRUE(UnprovenAnswer(rooms, 10, 0).releases.empty());
  EXPECT_TRUE(Fenced(rooms, 9, 1).releases.empty());  // room 9 waits for the refusal too
  DecodeOutput refused = rooms.OnWriterRefused(PrefillEndpoint(0), true, kT0);
  ASSERT_EQ(refused.releases.size(), 2u);
  for (const PagesRelease& release : refused.releases) {
    EXPECT_TRUE(release.proven) << release.reason;
    EXPECT_THAT(release.reason, HasSubstr("whose connections this sidecar then refused"));
  }
  EXPECT_EQ(rooms.fence_count(), 0u);
}

TEST(DecodeRoomsTest, ARefusalNotDoneWithinTheFenceWaitReleasesUnproven) {
  DecodeOptions options;
  options.fence_wait = absl::Seconds(10);
  DecodeRooms rooms = MakeRooms(options);
  Waiting(rooms, 9, {0});
  rooms.Fail(9, "aborted", kT0);
  ASSERT_TRUE(UnprovenAnswer(rooms, 9, 0).releases.empty());
  DecodeOutput waited = rooms.Tick(kT0 + absl::Seconds(11));
  ASSERT_EQ(waited.releases.size(), 1u);
  EXPECT_FALSE(waited.releases[0].proven);
  EXPECT_TRUE(rooms.OnWriterRefused(PrefillEndpoint(0), true, kT0).releases.empty());
}

// A room whose other rank answered unproven and could not be refused stays unproven when a rank
// that is gone settles the rest of its fence.
TEST(DecodeRoomsTest, AGoneRankSettlingAFenceKeepsAnotherRanksUnprovenAnswer) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 9, {0, 1});
  rooms.Fail(9, "aborted", kT0);
  (void)UnprovenAnswer(rooms, 9, 0);
  ASSERT_TRUE(rooms.OnWriterRefused(PrefillEndpoint(0), false, kT0).releases.empty());
  DecodeOutput gone = rooms.OnPrefillGone(PrefillEndpoint(1), kT0);
  ASSERT_EQ(gone.releases.size(), 1u);
  EXPECT_FALSE(gone.releases[0].proven) << gone.releases[0].reason;
}

// The newcomer's finding: a new room routed to a prefill rank already known to be gone (its
// CachePD socket refused connections) fails at once, naming the rank, and sends nothing to any
// rank: the live ones are not made to copy a room that cannot succeed.
TEST(DecodeRoomsTest, ANewRoomRoutedToAPrefillRankKnownGoneFailsAtOnceNamingIt) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 7, {0, 1});
  rooms.OnPrefillGone(PrefillEndpoint(1), kT0);
  ASSERT_TRUE(rooms.BeginRoom(9, kPrefillA, kT0).ok());
  absl::StatusOr<DecodeOutput> routed = rooms.OnRoute(9, Route({0, 1}), kT0);
  ASSERT_TRUE(routed.ok()) << routed.status();
  EXPECT_TRUE(routed->messages.empty());
  ASSERT_THAT(States(*routed), ElementsAre(TransferPoll::kFailed));
  EXPECT_EQ(routed->events[0].cause, FailureCause::kPeerFailed);
  EXPECT_THAT(routed->events[0].reason, HasSubstr("prefill rank 1"));
  EXPECT_THAT(routed->events[0].reason, HasSubstr(PrefillEndpoint(1)));
  EXPECT_EQ(routed->events[0].pages, Pages::kReusable);
  absl::StatusOr<DecodeOutput> allocated = rooms.OnAllocated(9, DecodeManifest(), kT0);
  ASSERT_TRUE(allocated.ok());
  EXPECT_TRUE(allocated->messages.empty());
}

// The soak's restarted prefill sidecar (issue 29): a rank that comes back on another endpoint, or
// on its own after it was gone, is a new process that never saw this decode's registration, so
// the next room through it registers again (with every rank of the peer set: a rank that kept
// its registration takes the same one as a no-op) before its pre-allocations go out.
TEST(DecodeRoomsTest, APrefillRankOnANewEndpointOrBackFromGoneIsRegisteredWithAgain) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 1, {0, 1});
  ASSERT_TRUE(rooms.BeginRoom(2, kPrefillA, kT0).ok());
  EXPECT_TRUE(rooms.OnRoute(2, Route({0, 1}), kT0)->messages.empty());  // registered already

  RoomRoute moved = Route({0, 1});
  moved.endpoints[1].endpoint = "tcp://10.1.0.100:18501";  // rank 1 restarted on another port
  ASSERT_TRUE(rooms.BeginRoom(3, kPrefillA, kT0).ok());
  absl::StatusOr<DecodeOutput> again = rooms.OnRoute(3, moved, kT0);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->messages.size(), 2u);
  EXPECT_EQ(again->messages[0].endpoint, PrefillEndpoint(0));
  EXPECT_EQ(again->messages[1].endpoint, "tcp://10.1.0.100:18501");
  EXPECT_EQ(again->messages[1].frames, *rooms.registration_frames());
  ASSERT_TRUE(rooms.BeginRoom(4, kPrefillA, kT0).ok());
  EXPECT_TRUE(rooms.OnRoute(4, moved, kT0)->messages.empty());  // once per new endpoint

  // Gone, then listening again on the same endpoint (restarted on its port): registered again.
  rooms.OnPrefillGone("tcp://10.1.0.100:18501", kT0);
  rooms.OnPrefillListening("tcp://10.1.0.100:18501");
  ASSERT_TRUE(rooms.BeginRoom(5, kPrefillA, kT0).ok());
  absl::StatusOr<DecodeOutput> back = rooms.OnRoute(5, moved, kT0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->messages.size(), 2u);
}

// A gone rank is probed again (GonePrefills); once it listens, rooms are routed to it again.
TEST(DecodeRoomsTest, APrefillRankListeningAgainIsRoutedToAgain) {
  DecodeRooms rooms = MakeRooms();
  rooms.OnPrefillGone(PrefillEndpoint(1), kT0);
  EXPECT_THAT(rooms.GonePrefills(), ElementsAre(PrefillEndpoint(1)));
  rooms.OnPrefillListening(PrefillEndpoint(1));
  EXPECT_TRUE(rooms.GonePrefills().empty());
  Waiting(rooms, 9, {0, 1});
}

// The newcomer's finding: between kvrail peers the prefill's own cause and reason come on
// kvrail's room outcome message (wire/outcome.h) right before its Failed, and the decode's
// Failed event carries them instead of "it might be dead".
TEST(DecodeRoomsTest, AKvrailPrefillsFailureCarriesItsOwnCauseAndReason) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 7, {0, 1});
  DecodeOutput told = rooms.OnMessage(
      wire::BuildRoomOutcome({7, 1, 0, 0, "aborted", "aborted by its engine: preempted"}).value(),
      kT0);
  EXPECT_TRUE(told.rejected.ok()) << told.rejected;
  EXPECT_TRUE(told.events.empty());
  DecodeOutput failed = rooms.OnMessage(StatusFrames(7, 0, 1, -1), kT0);
  ASSERT_THAT(States(failed), ElementsAre(TransferPoll::kFailed));
  EXPECT_EQ(failed.events[0].cause, FailureCause::kAborted);
  EXPECT_EQ(failed.events[0].reason, "prefill rank 1: aborted by its engine: preempted");
}

// A tokenspeed prefill sends no outcome: its Failed says what CachePD lets the decode know.
TEST(DecodeRoomsTest, APrefillFailedWithoutAnOutcomeIsReportedAsCachePDDoes) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 7, {0});
  DecodeOutput failed = rooms.OnMessage(StatusFrames(7, 0, 0, -1), kT0);
  ASSERT_THAT(States(failed), ElementsAre(TransferPoll::kFailed));
  EXPECT_EQ(failed.events[0].cause, FailureCause::kPeerFailed);
  EXPECT_THAT(failed.events[0].reason, HasSubstr("it might be dead"));
}

// The newcomer's finding: a decode Success reported bytes=0 copies=0 seconds=0. It carries the
// bytes and copies the expected ranks said they wrote here, and the time from the
// pre-allocations to the Success.
TEST(DecodeRoomsTest, ASuccessCarriesTheBytesCopiesAndSecondsThatLanded) {
  DecodeRooms rooms = MakeRooms();
  Waiting(rooms, 7, {0, 1});
  rooms.OnMessage(wire::BuildRoomOutcome({7, 0, 4096, 2, "", ""}).value(), kT0);
  rooms.OnMessage(wire::BuildRoomOutcome({7, 1, 1024, 1, "", ""}).value(), kT0);
  rooms.OnMessage(StatusFrames(7, 5, 0, 12), kT0 + absl::Milliseconds(10));
  DecodeOutput done = rooms.OnMessage(StatusFrames(7, 5, 1, 12), kT0 + absl::Milliseconds(30));
  ASSERT_THAT(States(done), ElementsAre(TransferPoll::kSuccess));
  EXPECT_EQ(done.events[0].bytes, 5120u);
  EXPECT_EQ(done.events[0].copies, 3u);
  EXPECT_EQ(done.events[0].elapsed, absl::Milliseconds(30));
}

// The newcomer's finding: the decode showed WAITING_FOR_INPUT while bytes landed. Once its
// pre-allocations went out a byte may land, and the engine is shown TRANSFERRING until the end
// (CachePD's own state, State(), stays the reference's WaitingForInput, CACHEPD §7.1).
TEST(DecodeRoomsTest, TheEngineIsShownTransferringOnceThePreallocationsWentOut) {
  DecodeRooms rooms = MakeRooms();
  ASSERT_TRUE(rooms.BeginRoom(7, kPrefillA, kT0).ok());
  EXPECT_EQ(rooms.EngineState(7), TransferPoll::kBootstrapping);
  ASSERT_TRUE(rooms.OnRoute(7, Route({0}), kT0).ok());
  EXPECT_EQ(rooms.EngineState(7), TransferPoll::kBootstrapped);
  ASSERT_TRUE(rooms.OnAllocated(7, DecodeManifest(), kT0).ok());
  EXPECT_EQ(rooms.EngineState(7), TransferPoll::kTransferring);
  EXPECT_EQ(rooms.State(7), TransferPoll::kWaitingForInput);
  rooms.OnMessage(StatusFrames(7, 5, 0, 12), kT0);
  EXPECT_EQ(rooms.EngineState(7), TransferPoll::kSuccess);
  EXPECT_EQ(rooms.EngineState(8), std::nullopt);
}

// What the sidecar keeps with a room (its destination manifest, the digests its prefill ranks
// sent) lives in the room's entry: kept only for a tracked room and a rank of its route, taken
// once, and gone with the room.
TEST(DecodeRoomsTest, AManifestAndDigestsKeptWithARoomGoWithIt) {
  DecodeRooms rooms = MakeRooms();
  EXPECT_EQ(rooms.KeepDigest(7, 0, 0xabc).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(rooms.KeepManifest(7, nullptr).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(rooms.BeginRoom(7, kPrefillA, kT0).ok());
  absl::Status unrouted = rooms.KeepDigest(7, 0, 0xabc);
  EXPECT_EQ(unrouted.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unrouted.message().find("no route yet"), std::string::npos) << unrouted;
  auto manifest = std::make_shared<const layout::Manifest>(DecodeManifest());
  ASSERT_TRUE(rooms.KeepManifest(7, manifest).ok());
  EXPECT_EQ(rooms.RankAt(7, PrefillEndpoint(1)), std::nullopt) << "a rank before the route";
  ASSERT_TRUE(rooms.OnRoute(7, Route({0, 1}), kT0).ok());
  ASSERT_TRUE(rooms.OnAllocated(7, DecodeManifest(), kT0).ok());
  EXPECT_EQ(rooms.ManifestOf(7), manifest);
  EXPECT_EQ(rooms.RankAt(7, PrefillEndpoint(1)), 1);
  EXPECT_EQ(rooms.RankAt(7, PrefillEndpoint(5)), std::nullopt) << "not the route's endpoint";

  // A peer cannot grow the entry past the room's prefill ranks.
  absl::Status stranger = rooms.KeepDigest(7, 5, 0xdead);
  EXPECT_EQ(stranger.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(stranger.message().find("prefill rank 5 is not a rank of room 7's route"),
            std::string::npos)
      << stranger;
  EXPECT_EQ(rooms.TakeDigest(7, 5), std::nullopt);

  ASSERT_TRUE(rooms.KeepDigest(7, 0, 0x111).ok());
  ASSERT_TRUE(rooms.KeepDigest(7, 0, 0x222).ok());  // the rank's later digest replaces it
  ASSERT_TRUE(rooms.KeepDigest(7, 1, 0x333).ok());
  EXPECT_EQ(rooms.TakeDigest(7, 0), 0x222u);
  EXPECT_EQ(rooms.TakeDigest(7, 0), std::nullopt) << "a digest taken twice";
  rooms.Free(7);
  EXPECT_EQ(rooms.ManifestOf(7), nullptr);
  EXPECT_EQ(rooms.TakeDigest(7, 1), std::nullopt) << "a digest outlived its room";
  // A room id used again starts with nothing kept.
  ASSERT_TRUE(rooms.BeginRoom(7, kPrefillA, kT0).ok());
  EXPECT_EQ(rooms.ManifestOf(7), nullptr);
}

}  // namespace
}  // namespace kvrail::session
