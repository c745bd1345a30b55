#include "control/sidecar/key_binding.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "control/wire/preallocation.h"
#include "control/wire/registration.h"
#include "control/wire/status.h"

namespace kvrail::sidecar {
namespace {

std::vector<std::string> Registration(uint32_t rank, const std::string& session = "10.0.0.9:7") {
  wire::Registration r;
  r.endpoint = "10.0.0.9";
  r.port = 5000;
  r.session_id = session;
  r.arena_base = 4096;
  r.contract_wire = "{}";
  r.decode_tp_size = 4;
  r.decode_tp_rank = rank;
  return *wire::BuildRegistration(r);
}

std::vector<std::string> Preallocation(const std::string& session = "10.0.0.9:7") {
  wire::Preallocation p;
  p.room = 11;
  p.session_id = session;
  return *wire::BuildPreallocation(p);
}

std::vector<std::string> Status(uint32_t rank) {
  wire::StatusMessage s;
  s.room = 11;
  s.prefill_rank = rank;
  return *wire::BuildStatus(s, wire::StatusForm::kSnapshot);
}

const zmq_auth::KeyIdentity kDecode3{zmq_auth::KeyRole::kDecode, 3, "decode-3"};
const zmq_auth::KeyIdentity kDecode3b{zmq_auth::KeyRole::kDecode, 3, "decode-3b"};

TEST(KeyBindingTest, ARegistrationMustCarryTheKeysRank) {
  KeyBinding keys;
  EXPECT_TRUE(keys.CheckAtPrefill("decode:3:decode-3", Registration(3)).ok());
  const absl::Status refused = keys.CheckAtPrefill("decode:3:decode-3", Registration(1));
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(refused.message().find("decode:3:decode-3"), absl::string_view::npos) << refused;
  EXPECT_NE(refused.message().find("frame 7"), absl::string_view::npos) << refused;
}

TEST(KeyBindingTest, OnlyDecodeKeysSpeakToAPrefillAndOnlyPrefillKeysToADecode) {
  KeyBinding keys;
  EXPECT_FALSE(keys.CheckAtPrefill("prefill:3:prefill-3", Registration(3)).ok());
  EXPECT_FALSE(keys.CheckAtPrefill("", Registration(3)).ok());
  EXPECT_FALSE(KeyBinding::CheckAtDecode("decode:1:decode-1", Status(1)).ok());
}

TEST(KeyBindingTest, AStatusMustComeFromTheKeyOfTheRankItClaims) {
  EXPECT_TRUE(KeyBinding::CheckAtDecode("prefill:1:prefill-1", Status(1)).ok());
  const absl::Status refused = KeyBinding::CheckAtDecode("prefill:3:prefill-3", Status(1));
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(refused.message().find("claiming prefill rank 1"), absl::string_view::npos) << refused;
}

TEST(KeyBindingTest, AMessageNamingASessionComesFromItsVerifiedOwnerOrAClaimant) {
  KeyBinding keys;
  keys.Claim(1, "10.0.0.9:7", kDecode3);
  EXPECT_TRUE(keys.CheckAtPrefill("decode:3:decode-3", Preallocation()).ok());
  EXPECT_FALSE(keys.CheckAtPrefill("decode:3:decode-3b", Preallocation()).ok());
  keys.Verified(1, true);
  ASSERT_NE(keys.OwnerOf("10.0.0.9:7"), nullptr);
  EXPECT_TRUE(keys.CheckAtPrefill("decode:3:decode-3", Preallocation()).ok());
  EXPECT_FALSE(keys.CheckAtPrefill("decode:3:decode-3b", Preallocation()).ok());
  // Another key's claim that fails verification changes nothing.
  keys.Claim(2, "10.0.0.9:7", kDecode3b);
  keys.Verified(2, false);
  EXPECT_EQ(*keys.OwnerOf("10.0.0.9:7"), kDecode3);
  // A session nobody registered is the state machine's to answer.
  EXPECT_TRUE(keys.CheckAtPrefill("decode:3:decode-3b", Preallocation("10.0.0.8:1")).ok());
}

}  // namespace
}  // namespace kvrail::sidecar
