#include "control/wire/proof.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "control/wire/dispatch.h"
#include "control/wire/fence.h"
#include "control/wire/preallocation.h"

namespace kvrail::wire {
namespace {

TEST(OwnerProofTest, RoundTripsAndIsNoCachePdMessage) {
  const OwnerProof proof{42, "10.0.0.2:9000", std::string(kSessionKeyBytes, '\x07')};
  const std::vector<std::string> frames = BuildOwnerProof(proof).value();
  EXPECT_TRUE(IsOwnerProof(frames));
  EXPECT_EQ(Classify(frames), MessageKind::kDropped);  // a CachePD peer drops it (§3.2.1)
  const OwnerProof parsed = ParseOwnerProof(frames).value();
  EXPECT_EQ(parsed.room, 42u);
  EXPECT_EQ(parsed.session_id, "10.0.0.2:9000");
  EXPECT_EQ(parsed.key, proof.key);
}

TEST(OwnerProofTest, EachRuleIsRefusedNamingItsFrame) {
  std::vector<std::string> frames =
      BuildOwnerProof({1, "s:1", std::string(kSessionKeyBytes, 'k')}).value();
  struct Case {
    size_t frame;  // the frame changed (4: drop the last one)
    std::string value;
    std::string refusal;  // what the error says
  };
  const std::vector<Case> cases = {
      {4, "", "got 3 frames, requires exactly 4"},
      {1, "01", "frame 1 (room)"},
      {2, "", "frame 2 (session id) has 0 bytes"},
      {3, "short", "frame 3 (session key) has 5 bytes, requires 32"},
      {0, "\xffkvrail.fence.v1", "frame 0 is not the owner proof magic"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> f = frames;
    if (c.frame == 4) {
      f.pop_back();
    } else {
      f[c.frame] = c.value;
    }
    const absl::Status status = ParseOwnerProof(f).status();
    EXPECT_TRUE(absl::StrContains(status.message(), c.refusal)) << status;
  }
}

TEST(OwnerProofTest, ProvenRoomOfNamesThePreallocationsAndFenceRequestsRoom) {
  EXPECT_EQ(ProvenRoomOf(BuildPreallocation({7, "s:1", ""}).value()), 7u);
  EXPECT_EQ(ProvenRoomOf(BuildFenceRequest({9, "s:1"}).value()), 9u);
  EXPECT_EQ(ProvenRoomOf(BuildOwnerProof({1, "s:1", std::string(kSessionKeyBytes, 'k')}).value()),
            std::nullopt);
  EXPECT_EQ(ProvenRoomOf({"None"}), std::nullopt);  // a registration's frame 0
}

}  // namespace
}  // namespace kvrail::wire
