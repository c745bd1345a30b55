#include "control/sidecar/sender_check.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "control/sidecar/session_key.h"
#include "control/wire/digest.h"
#include "control/wire/fence.h"
#include "control/wire/proof.h"
#include "control/wire/status.h"

namespace kvrail::sidecar {
namespace {

std::vector<std::string> Success(uint64_t room, uint32_t rank) {
  return wire::BuildStatus({room, 5, rank, 42, std::nullopt}, wire::StatusForm::kSnapshot).value();
}

std::vector<std::string> ProofOf(const std::string& key, const std::vector<std::string>& message,
                                 uint64_t room, uint32_t rank) {
  return wire::BuildSenderProof({room, rank, SessionKey::Tag(key, message)}).value();
}

TEST(SenderCheckTest, AStatusRightAfterItsProofIsTakenOnce) {
  const SessionKey key = SessionKey::Generate();
  SenderCheck check(key.bytes());
  const auto status = Success(7, 1);
  ASSERT_TRUE(check.OnProof(ProofOf(key.bytes(), status, 7, 1)).ok());
  EXPECT_TRUE(check.Check(status).ok());
  const absl::Status again = check.Check(status);  // a replay: the proof was used up
  EXPECT_EQ(again.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(again.message(), "status of room 7 from prefill rank 1"));
}

// The forged Success: anyone who reaches the decode's PULL socket sends one.
TEST(SenderCheckTest, AForgedSuccessOrAProofForAnotherMessageIsRefused) {
  const SessionKey key = SessionKey::Generate();
  const SessionKey forger = SessionKey::Generate();
  SenderCheck check(key.bytes());
  EXPECT_TRUE(absl::StrContains(check.Check(Success(7, 0)).message(), "no sender proof"));
  // A proof made with another key, or for another token, does not match.
  ASSERT_TRUE(check.OnProof(ProofOf(forger.bytes(), Success(7, 0), 7, 0)).ok());
  EXPECT_TRUE(absl::StrContains(check.Check(Success(7, 0)).message(), "does not match"));
  const auto other =
      wire::BuildStatus({7, 5, 0, 43, std::nullopt}, wire::StatusForm::kSnapshot).value();
  ASSERT_TRUE(check.OnProof(ProofOf(key.bytes(), other, 7, 0)).ok());
  EXPECT_FALSE(check.Check(Success(7, 0)).ok());
  // Fence answers are proven the same way.
  const auto fenced = wire::BuildFencedAnswer({9, 0, true}).value();
  EXPECT_FALSE(check.Check(fenced).ok());
  ASSERT_TRUE(check.OnProof(ProofOf(key.bytes(), fenced, 9, 0)).ok());
  EXPECT_TRUE(check.Check(fenced).ok());
}

// --verify-digest: a prefill sends proof, digest, proof, Success. Each proof vouches for the
// message right after it, so the sequence passes and a forged digest (which would fail a room
// it does not own) does not.
TEST(SenderCheckTest, ADigestAndItsSuccessEachPassRightAfterTheirOwnProof) {
  const SessionKey key = SessionKey::Generate();
  SenderCheck check(key.bytes());
  const auto digest = wire::BuildRoomDigest({7, 1, 0xfeedULL}).value();
  const auto status = Success(7, 1);
  ASSERT_TRUE(check.OnProof(ProofOf(key.bytes(), digest, 7, 1)).ok());
  EXPECT_TRUE(check.Check(digest).ok());
  ASSERT_TRUE(check.OnProof(ProofOf(key.bytes(), status, 7, 1)).ok());
  EXPECT_TRUE(check.Check(status).ok());
  EXPECT_EQ(check.kept(), 0u);
}

TEST(SenderCheckTest, AForgedDigestIsRefusedNamingIt) {
  const SessionKey key = SessionKey::Generate();
  SenderCheck check(key.bytes());
  const auto digest = wire::BuildRoomDigest({7, 1, 0xfeedULL}).value();
  const absl::Status refused = check.Check(digest);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(refused.message(),
                                "room digest of room 7 from prefill rank 1 refused: no sender "
                                "proof came right before it"))
      << refused;
  // A proof of the real Success does not vouch for a digest put in front of it.
  ASSERT_TRUE(check.OnProof(ProofOf(key.bytes(), Success(7, 1), 7, 1)).ok());
  EXPECT_TRUE(absl::StrContains(check.Check(digest).message(), "does not match"));
}

TEST(SenderCheckTest, KeptProofsAreBounded) {
  const SessionKey key = SessionKey::Generate();
  SenderCheck check(key.bytes(), 2);
  for (uint64_t room = 0; room < 5; ++room) {
    ASSERT_TRUE(check.OnProof(ProofOf(key.bytes(), Success(room, 0), room, 0)).ok());
  }
  EXPECT_EQ(check.kept(), 2u);
  EXPECT_FALSE(check.Check(Success(0, 0)).ok());  // forgotten
  EXPECT_TRUE(check.Check(Success(4, 0)).ok());
}

}  // namespace
}  // namespace kvrail::sidecar
