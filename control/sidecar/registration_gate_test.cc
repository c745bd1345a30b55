#include "control/sidecar/registration_gate.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "control/sidecar/session_key.h"
#include "control/wire/fence.h"
#include "control/wire/preallocation.h"
#include "control/wire/proof.h"
#include "control/wire/registration.h"
#include "proto/kvrail/v1/handshake.pb.h"

namespace kvrail::sidecar {
namespace {

wire::Registration Victim() {
  wire::Registration r;
  r.endpoint = "10.0.0.2";
  r.port = 7000;
  r.session_id = "10.0.0.2:9000";
  r.arena_base = 0x10000;
  r.contract_wire = "{}";
  r.decode_tp_size = 1;
  r.decode_tp_rank = 0;
  return r;
}

transport::RemoteRegions Regions(uint64_t base, uint64_t length) {
  v1::HandshakeDescriptor descriptor;
  v1::Region* region = descriptor.add_regions();
  region->set_base(base);
  region->set_length(length);
  return transport::RemoteRegions::FromDescriptor(descriptor).value();
}

RegistrationGate::Message Frames(const wire::Registration& r) {
  return wire::BuildRegistration(r).value();
}

RegistrationGate::Message Prealloc(uint64_t room, const std::string& session) {
  return wire::BuildPreallocation({room, session, ""}).value();
}

TEST(CheckOwnerTest, TheSessionsOwnEndpointAndBaseAreAccepted) {
  EXPECT_TRUE(CheckOwner(Victim(), 4096, "tcp://10.0.0.2:7000", Regions(0x10000, 8192)).ok());
}

// The attacks of the issue: another endpoint claiming the session, a base two pages into the
// victim's region, an arena larger than the region.
TEST(CheckOwnerTest, AnotherEndpointOrABaseInsideTheRegionIsRefusedNamingTheClaim) {
  wire::Registration forged = Victim();
  forged.endpoint = "10.0.0.66";
  absl::Status refused = CheckOwner(forged, 4096, "tcp://10.0.0.2:7000", Regions(0x10000, 8192));
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(refused.message(), "names CachePD endpoint tcp://10.0.0.66:7000"))
      << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "descriptor names tcp://10.0.0.2:7000"));

  forged = Victim();
  forged.arena_base = 0x10000 + 2 * 4096;
  refused = CheckOwner(forged, 4096, "tcp://10.0.0.2:7000", Regions(0x10000, 16384));
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(refused.message(), "begins inside a region")) << refused;

  refused = CheckOwner(Victim(), 16384, "tcp://10.0.0.2:7000", Regions(0x10000, 8192));
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(refused.message(), "refused")) << refused;
}

TEST(RegistrationGateTest, ARegistrationIsHeldWithItsSessionsMessagesUntilVerified) {
  RegistrationGate gate;
  RegistrationGate::Admission first = gate.Admit(Frames(Victim()));
  ASSERT_TRUE(first.check.has_value());
  EXPECT_FALSE(first.pass.has_value());
  EXPECT_EQ(first.check->session_id, "10.0.0.2:9000");
  // Its pre-allocations and fence requests wait behind it; another session's pass.
  EXPECT_FALSE(gate.Admit(Prealloc(1, "10.0.0.2:9000")).pass.has_value());
  EXPECT_FALSE(gate.Admit(wire::BuildFenceRequest({1, "10.0.0.2:9000"}).value()).pass.has_value());
  EXPECT_TRUE(gate.Admit(Prealloc(2, "10.0.0.3:9000")).pass.has_value());
  EXPECT_EQ(gate.held(), 2u);
  RegistrationGate::Release released = gate.Verified(first.check->ticket, true);
  ASSERT_EQ(released.pass.size(), 3u);
  EXPECT_EQ(released.pass[0], Frames(Victim()));
  EXPECT_EQ(released.pass[1], Prealloc(1, "10.0.0.2:9000"));
  EXPECT_FALSE(released.next.has_value());
  EXPECT_EQ(gate.held(), 0u);
  // The same registration again passes; a changed one is checked again.
  EXPECT_TRUE(gate.Admit(Frames(Victim())).pass.has_value());
  wire::Registration moved = Victim();
  moved.arena_base = 0x20000;
  EXPECT_TRUE(gate.Admit(Frames(moved)).check.has_value());
}

TEST(RegistrationGateTest, ARefusedRegistrationIsDroppedAndWhatWaitedGoesOnAlone) {
  RegistrationGate gate;
  RegistrationGate::Admission first = gate.Admit(Frames(Victim()));
  ASSERT_TRUE(first.check.has_value());
  (void)gate.Admit(Prealloc(1, "10.0.0.2:9000"));
  RegistrationGate::Release released = gate.Verified(first.check->ticket, false);
  ASSERT_EQ(released.pass.size(), 1u);
  EXPECT_EQ(released.pass[0], Prealloc(1, "10.0.0.2:9000"));
  EXPECT_EQ(gate.admitted(), 0u);
  // Nothing was admitted: the same registration is checked again.
  EXPECT_TRUE(gate.Admit(Frames(Victim())).check.has_value());
}

TEST(RegistrationGateTest, ASecondRegistrationBehindTheFirstIsCheckedInItsTurn) {
  RegistrationGate gate;
  RegistrationGate::Admission first = gate.Admit(Frames(Victim()));
  wire::Registration other = Victim();
  other.arena_base = 0x30000;
  (void)gate.Admit(Frames(other));
  (void)gate.Admit(Prealloc(5, "10.0.0.2:9000"));
  RegistrationGate::Release released = gate.Verified(first.check->ticket, true);
  ASSERT_EQ(released.pass.size(), 1u);  // the first registration only
  ASSERT_TRUE(released.next.has_value());
  EXPECT_EQ(released.next->registration, Frames(other));
  EXPECT_EQ(gate.held(), 1u);
  RegistrationGate::Release second = gate.Verified(released.next->ticket, false);
  ASSERT_EQ(second.pass.size(), 1u);
  EXPECT_EQ(second.pass[0], Prealloc(5, "10.0.0.2:9000"));
}

TEST(RegistrationGateTest, HeldMessagesAreBounded) {
  RegistrationGate gate(2);
  ASSERT_TRUE(gate.Admit(Frames(Victim())).check.has_value());
  EXPECT_TRUE(gate.Admit(Prealloc(1, "10.0.0.2:9000")).refused.ok());
  EXPECT_TRUE(gate.Admit(Prealloc(2, "10.0.0.2:9000")).refused.ok());
  const absl::Status refused = gate.Admit(Prealloc(3, "10.0.0.2:9000")).refused;
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(refused.message(), "10.0.0.2:9000")) << refused;
  EXPECT_EQ(gate.held(), 2u);
}

RegistrationGate::Message Proof(uint64_t room, const std::string& key) {
  return wire::BuildOwnerProof({room, "10.0.0.2:9000", key}).value();
}

// A kvrail decode's session: its descriptor carries its key's digest, so its pre-allocations
// and fence requests pass only right behind an owner proof of the same room.
TEST(RegistrationGateTest, AKeyedSessionsPreallocationsNeedAnOwnerProofOfTheirRoom) {
  const SessionKey key = SessionKey::Generate();
  const SessionKey other = SessionKey::Generate();
  RegistrationGate gate;
  RegistrationGate::Admission first = gate.Admit(Frames(Victim()));
  (void)gate.Admit(Proof(1, key.bytes()));
  (void)gate.Admit(Prealloc(1, "10.0.0.2:9000"));
  RegistrationGate::Release released = gate.Verified(first.check->ticket, true, key.Digest());
  ASSERT_EQ(released.pass.size(), 2u);  // the registration and the proven pre-allocation
  EXPECT_EQ(released.pass[1], Prealloc(1, "10.0.0.2:9000"));
  EXPECT_TRUE(released.refused.empty());

  // A forger who knows the session id but not the key.
  RegistrationGate::Admission bare = gate.Admit(Prealloc(2, "10.0.0.2:9000"));
  EXPECT_FALSE(bare.pass.has_value());
  EXPECT_EQ(bare.refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(bare.refused.message(), "no owner proof of that room"))
      << bare.refused;
  RegistrationGate::Admission wrong = gate.Admit(Proof(2, other.bytes()));
  EXPECT_TRUE(absl::StrContains(wrong.refused.message(), "its key is not the one"));
  EXPECT_FALSE(gate.Admit(Prealloc(2, "10.0.0.2:9000")).pass.has_value());
  // A proof of another room proves nothing for this one; a fence request needs one too.
  EXPECT_FALSE(gate.Admit(Proof(3, key.bytes())).pass.has_value());  // consumed
  EXPECT_FALSE(gate.Admit(Prealloc(4, "10.0.0.2:9000")).pass.has_value());
  const RegistrationGate::Message fence = wire::BuildFenceRequest({5, "10.0.0.2:9000"}).value();
  EXPECT_FALSE(gate.Admit(fence).pass.has_value());
  (void)gate.Admit(Proof(5, key.bytes()));
  EXPECT_TRUE(gate.Admit(fence).pass.has_value());
  // One proof, one message.
  EXPECT_FALSE(gate.Admit(fence).pass.has_value());
}

TEST(RegistrationGateTest, WhatNamesNoSessionPassesToTheStateMachine) {
  RegistrationGate gate;
  EXPECT_TRUE(gate.Admit({"\x01garbage"}).pass.has_value());
  EXPECT_TRUE(gate.Admit({}).pass.has_value());
}

}  // namespace
}  // namespace kvrail::sidecar
