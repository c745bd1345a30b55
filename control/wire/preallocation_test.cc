#include "control/wire/preallocation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "control/wire/limits.h"
#include "engine/base/error.h"

namespace kvrail::wire {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kManifest[] = "{\"groups\":[],\"prefix_len\":0,\"prompt_len\":2}";

std::vector<std::string> ValidFrames() {
  return {"9223372036854775807", "10.0.0.2:15001", kManifest};
}

void ExpectFrameError(const std::vector<std::string>& frames, const std::string& substring) {
  absl::Status status = ParsePreallocation(frames).status();
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(CategoryOf(status), ErrorCategory::kInvalidFrame);
  EXPECT_THAT(std::string(status.message()), HasSubstr(substring));
}

TEST(ParsePreallocationTest, ReadsEveryMember) {
  auto preallocation = ParsePreallocation(ValidFrames());
  ASSERT_TRUE(preallocation.ok()) << preallocation.status();
  EXPECT_EQ(preallocation->room, 9223372036854775807ULL);
  EXPECT_EQ(preallocation->session_id, "10.0.0.2:15001");
  EXPECT_EQ(preallocation->manifest_wire, kManifest);
  EXPECT_FALSE(preallocation->is_dummy());
}

TEST(ParsePreallocationTest, EmptyManifestIsADummyTarget) {
  std::vector<std::string> frames = ValidFrames();
  frames[2] = "";
  auto preallocation = ParsePreallocation(frames);
  ASSERT_TRUE(preallocation.ok()) << preallocation.status();
  EXPECT_TRUE(preallocation->is_dummy());
}

TEST(ParsePreallocationTest, RequiresExactlyThreeFrames) {
  std::vector<std::string> frames = ValidFrames();
  frames.pop_back();
  ExpectFrameError(frames, "pre-allocation: got 2 frames, requires exactly 3 (CACHEPD §3.3)");
  frames = ValidFrames();
  frames.push_back("");
  ExpectFrameError(frames, "got 4 frames");
}

TEST(ParsePreallocationTest, RoomIsCanonicalBelowTwoToThe63) {
  std::vector<std::string> frames = ValidFrames();
  frames[0] = "0";
  EXPECT_EQ(ParsePreallocation(frames)->room, 0u);
  frames[0] = "9223372036854775808";
  ExpectFrameError(frames, "pre-allocation frame 0 (room): 9223372036854775808 is out of range");
  for (const char* room : {"07", "-1", "7 ", "+7", "", "11111111111111111111"}) {
    frames[0] = room;
    ExpectFrameError(frames, "pre-allocation frame 0 (room)");
    ExpectFrameError(frames, "must be canonical unsigned ASCII");
  }
}

TEST(ParsePreallocationTest, SessionIsAsciiOneTo512Bytes) {
  std::vector<std::string> frames = ValidFrames();
  frames[1] = std::string(512, 's');
  EXPECT_TRUE(ParsePreallocation(frames).ok());
  frames[1] = std::string(513, 's');
  ExpectFrameError(frames, "pre-allocation frame 1 (session id): 513 bytes, must be 1 to 512");
  frames[1] = "";
  ExpectFrameError(frames, "pre-allocation frame 1 (session id): 0 bytes");
  frames[1] = "s\x80";
  ExpectFrameError(frames, "frame 1 (session id): byte 0x80 at offset 1 is not ASCII");
}

TEST(ParsePreallocationTest, RoomIsCheckedBeforeSession) {
  std::vector<std::string> frames = ValidFrames();
  frames[0] = "x";
  frames[1] = "";
  ExpectFrameError(frames, "frame 0 (room)");
}

TEST(ParsePreallocationTest, ManifestIsAtMost2MiB) {
  std::vector<std::string> frames = ValidFrames();
  frames[2] = std::string(2097152, ' ');
  EXPECT_TRUE(ParsePreallocation(frames).ok());
  frames[2].push_back(' ');
  absl::Status status = ParsePreallocation(frames).status();
  // The size cap is the manifest's own rule (CACHEPD §5.1), so it is a manifest error.
  EXPECT_EQ(CategoryOf(status), ErrorCategory::kInvalidManifest);
  EXPECT_EQ(status.message(),
            "pre-allocation frame 2 (manifest): 2097153 bytes, must be empty (dummy target) or 1 "
            "to 2097152 (CACHEPD §3.3)");
}

TEST(ParsePreallocationTest, ManifestContentIsNotJudgedHere) {
  std::vector<std::string> frames = ValidFrames();
  frames[2] = "[]";
  EXPECT_TRUE(ParsePreallocation(frames).ok());
  frames[2] = std::string("\xff\0", 2);
  EXPECT_TRUE(ParsePreallocation(frames).ok());
}

TEST(ParsePreallocationRouteHeaderTest, IgnoresTheManifest) {
  std::vector<std::string> frames = ValidFrames();
  frames[2] = std::string(2097153, ' ');
  auto header = ParsePreallocationRouteHeader(frames);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(*header, (PreallocationRouteHeader{9223372036854775807ULL, "10.0.0.2:15001"}));
}

TEST(ParsePreallocationRouteHeaderTest, StillRequiresThreeFrames) {
  EXPECT_FALSE(ParsePreallocationRouteHeader(std::vector<std::string>{"1", "s"}).ok());
}

TEST(BuildPreallocationTest, WritesTheReferenceFrames) {
  auto frames = BuildPreallocation({9223372036854775807ULL, "10.0.0.2:15001", kManifest});
  ASSERT_TRUE(frames.ok()) << frames.status();
  EXPECT_EQ(*frames, ValidFrames());
  auto dummy = BuildPreallocation({0, "s", ""});
  ASSERT_TRUE(dummy.ok()) << dummy.status();
  EXPECT_EQ(*dummy, (std::vector<std::string>{"0", "s", ""}));
}

TEST(BuildPreallocationTest, RejectsWhatTheParserRejects) {
  const std::vector<std::pair<Preallocation, std::string>> cases = {
      {{uint64_t{1} << 63, "s", ""}, "frame 0 (room)"},
      {{1, "", ""}, "frame 1 (session id)"},
      {{1, std::string(513, 's'), ""}, "frame 1 (session id)"},
      {{1, "\xc3\xa9", ""}, "not ASCII"},
      {{1, "s", std::string(2097153, '{')}, "frame 2 (manifest)"},
  };
  for (const auto& [preallocation, message] : cases) {
    absl::Status status = BuildPreallocation(preallocation).status();
    ASSERT_FALSE(status.ok()) << message;
    EXPECT_EQ(CategoryOf(status), preallocation.manifest_wire.size() > kMaxManifestBytes
                                      ? ErrorCategory::kInvalidManifest
                                      : ErrorCategory::kInvalidFrame);
    EXPECT_THAT(std::string(status.message()), StartsWith("cannot build pre-allocation: "));
    EXPECT_THAT(std::string(status.message()), HasSubstr(message));
  }
}

}  // namespace
}  // namespace kvrail::wire
