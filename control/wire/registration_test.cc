#include "control/wire/registration.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/base/error.h"

namespace kvrail::wire {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kContract[] = "{\"plan\":{}}";

std::vector<std::string> ValidFrames() {
  return {"None",
          "10.0.0.2",
          "17001",
          "10.0.0.2:15001",
          std::string("\x00\x70\x56\x34\x12\x7f\x00\x00", 8),
          kContract,
          "2",
          "1"};
}

absl::Status AcceptContract(absl::string_view) { return absl::OkStatus(); }

absl::Status RejectContract(absl::string_view) {
  return MakeError(ErrorCategory::kInvalidContract, "plan.lcm_block_bytes must be positive");
}

absl::Status ParseError(const std::vector<std::string>& frames) {
  return ParseRegistration(frames, AcceptContract).status();
}

void ExpectFrameError(const std::vector<std::string>& frames, const std::string& substring) {
  absl::Status status = ParseError(frames);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(CategoryOf(status), ErrorCategory::kInvalidFrame);
  EXPECT_THAT(std::string(status.message()), HasSubstr(substring));
}

TEST(ParseRegistrationTest, ReadsEveryMember) {
  auto registration = ParseRegistration(ValidFrames(), AcceptContract);
  ASSERT_TRUE(registration.ok()) << registration.status();
  EXPECT_EQ(registration->endpoint, "10.0.0.2");
  EXPECT_EQ(registration->port, 17001);
  EXPECT_EQ(registration->session_id, "10.0.0.2:15001");
  EXPECT_EQ(registration->arena_base, 0x7f1234567000ULL);
  EXPECT_EQ(registration->contract_wire, kContract);
  EXPECT_EQ(registration->decode_tp_size, 2u);
  EXPECT_EQ(registration->decode_tp_rank, 1u);
}

TEST(ParseRegistrationTest, RequiresExactlyEightFrames) {
  std::vector<std::string> frames = ValidFrames();
  frames.push_back("x");
  ExpectFrameError(frames, "registration: got 9 frames, requires exactly 8 (CACHEPD §3.2)");
  frames.resize(7);
  ExpectFrameError(frames, "got 7 frames");
  ExpectFrameError({}, "got 0 frames");
}

TEST(ParseRegistrationTest, RequiresTheNoneMarker) {
  std::vector<std::string> frames = ValidFrames();
  frames[0] = "none";
  ExpectFrameError(frames, "registration frame 0 (marker): \"none\" must be exactly \"None\"");
}

TEST(ParseRegistrationTest, EndpointAndSessionMustBeAscii) {
  std::vector<std::string> frames = ValidFrames();
  frames[1] = "h\xc3\xb4st";
  ExpectFrameError(frames, "registration frame 1 (endpoint): byte 0xc3 at offset 1 is not ASCII");
  frames = ValidFrames();
  frames[3] = "\xff";
  ExpectFrameError(frames, "registration frame 3 (session id): byte 0xff at offset 0");
}

TEST(ParseRegistrationTest, EndpointIsOneTo255Bytes) {
  std::vector<std::string> frames = ValidFrames();
  frames[1] = std::string(255, 'e');
  EXPECT_TRUE(ParseError(frames).ok());
  frames[1] = std::string(256, 'e');
  ExpectFrameError(frames, "registration frame 1 (endpoint): 256 bytes, must be 1 to 255");
  frames[1] = "";
  ExpectFrameError(frames, "registration frame 1 (endpoint): 0 bytes, must be 1 to 255");
}

TEST(ParseRegistrationTest, SessionIsOneTo512Bytes) {
  std::vector<std::string> frames = ValidFrames();
  frames[3] = std::string(512, 's');
  EXPECT_TRUE(ParseError(frames).ok());
  frames[3] = std::string(513, 's');
  ExpectFrameError(frames, "registration frame 3 (session id): 513 bytes, must be 1 to 512");
  frames[3] = "";
  ExpectFrameError(frames, "registration frame 3 (session id): 0 bytes");
}

TEST(ParseRegistrationTest, PortIsCanonicalOneTo65535) {
  std::vector<std::string> frames = ValidFrames();
  frames[2] = "080";
  EXPECT_EQ(ParseError(frames).message(),
            "registration frame 2 (port): \"080\" must be canonical unsigned ASCII: 1 to 5 "
            "decimal digits, no sign, space or leading zero (CACHEPD §3.1)");
  frames[2] = "0";
  ExpectFrameError(frames, "registration frame 2 (port): 0 is out of range [1, 65535]");
  frames[2] = "65536";
  ExpectFrameError(frames, "is out of range");
}

TEST(ParseRegistrationTest, ReplyRouteChecksFollowTheTableOrder) {
  // Non-ASCII session is reported before a too-long endpoint; both before a bad port.
  std::vector<std::string> frames = ValidFrames();
  frames[1] = std::string(300, 'e');
  frames[2] = "x";
  frames[3] = "\x80";
  ExpectFrameError(frames, "frame 3 (session id): byte 0x80");
  frames[3] = "s";
  ExpectFrameError(frames, "frame 1 (endpoint): 300 bytes");
  frames[1] = "e";
  frames[3] = "";
  ExpectFrameError(frames, "frame 3 (session id): 0 bytes");
  frames[3] = "s";
  ExpectFrameError(frames, "frame 2 (port)");
}

TEST(ParseRegistrationTest, PointerFrameIsExactlyEightBytes) {
  std::vector<std::string> frames = ValidFrames();
  frames[4] = std::string(7, '\x01');
  ExpectFrameError(frames, "registration frame 4 (arena base): 7 bytes, must be exactly 8");
  frames[4] = std::string(9, '\x01');
  ExpectFrameError(frames, "9 bytes");
}

TEST(ParseRegistrationTest, PointerIsLittleEndian) {
  std::vector<std::string> frames = ValidFrames();
  frames[4] = std::string("\x01\0\0\0\0\0\0\0", 8);
  EXPECT_EQ(ParseRegistration(frames, AcceptContract)->arena_base, 1u);
  frames[4] = std::string("\0\0\0\0\0\0\0\x80", 8);
  EXPECT_EQ(ParseRegistration(frames, AcceptContract)->arena_base, 0x8000000000000000ULL);
}

TEST(ParseRegistrationTest, ContractErrorKeepsItsCategoryAndGainsTheFrameName) {
  absl::Status status = ParseRegistration(ValidFrames(), RejectContract).status();
  EXPECT_EQ(CategoryOf(status), ErrorCategory::kInvalidContract);
  EXPECT_EQ(status.message(),
            "registration frame 5 (contract): plan.lcm_block_bytes must be positive");
}

TEST(ParseRegistrationTest, ContractCheckSeesFrameFiveOnceAndOnlyAfterFramesZeroToFour) {
  std::vector<std::string> seen;
  auto record = [&seen](absl::string_view wire) {
    seen.emplace_back(wire);
    return absl::OkStatus();
  };
  ASSERT_TRUE(ParseRegistration(ValidFrames(), record).ok());
  EXPECT_EQ(seen, std::vector<std::string>{kContract});

  seen.clear();
  std::vector<std::string> frames = ValidFrames();
  frames[4] = "short";
  EXPECT_FALSE(ParseRegistration(frames, record).ok());
  EXPECT_TRUE(seen.empty());
}

TEST(ParseRegistrationTest, ContractIsCheckedBeforeTpSizeAndRank) {
  std::vector<std::string> frames = ValidFrames();
  frames[6] = "0";
  EXPECT_EQ(CategoryOf(ParseRegistration(frames, RejectContract).status()),
            ErrorCategory::kInvalidContract);
}

TEST(ParseRegistrationTest, TpSizeIsCanonicalOneTo1024) {
  std::vector<std::string> frames = ValidFrames();
  frames[6] = "1024";
  frames[7] = "1023";
  EXPECT_TRUE(ParseError(frames).ok());
  frames[6] = "0";
  frames[7] = "0";
  ExpectFrameError(frames, "registration frame 6 (decode_tp_size): 0 is out of range [1, 1024]");
  frames[6] = "1025";
  ExpectFrameError(frames, "frame 6 (decode_tp_size): 1025 is out of range");
  frames[6] = "02";
  ExpectFrameError(frames, "frame 6 (decode_tp_size): \"02\" must be canonical");
}

TEST(ParseRegistrationTest, TpRankIsBelowTpSize) {
  std::vector<std::string> frames = ValidFrames();
  frames[6] = "11";
  frames[7] = "10";
  EXPECT_EQ(ParseRegistration(frames, AcceptContract)->decode_tp_rank, 10u);
  frames[6] = "2";
  frames[7] = "2";
  ExpectFrameError(frames, "registration frame 7 (decode_tp_rank): 2 is out of range [0, 1]");
  frames[7] = "-1";
  ExpectFrameError(frames, "frame 7 (decode_tp_rank): \"-1\" must be canonical");
  frames[6] = "1";
  frames[7] = "0";
  EXPECT_TRUE(ParseError(frames).ok());
}

TEST(ParseRegistrationTest, NonzeroPointerIsCheckedLast) {
  std::vector<std::string> frames = ValidFrames();
  frames[4] = std::string(8, '\0');
  ExpectFrameError(frames, "registration frame 4 (arena base): pointer must be nonzero");
  frames[7] = "5";
  ExpectFrameError(frames, "frame 7 (decode_tp_rank)");
  EXPECT_EQ(CategoryOf(ParseRegistration(frames, RejectContract).status()),
            ErrorCategory::kInvalidContract);
}

TEST(ParseRegistrationReplyRouteTest, IgnoresFramesFourToSeven) {
  std::vector<std::string> frames = ValidFrames();
  frames[4] = "";
  frames[5] = "";
  frames[6] = "x";
  frames[7] = "y";
  auto route = ParseRegistrationReplyRoute(frames);
  ASSERT_TRUE(route.ok()) << route.status();
  EXPECT_EQ(*route, (ReplyRoute{"10.0.0.2", 17001, "10.0.0.2:15001"}));
}

TEST(ParseRegistrationReplyRouteTest, StillRequiresEightFramesAndTheMarker) {
  std::vector<std::string> frames = ValidFrames();
  frames.pop_back();
  EXPECT_FALSE(ParseRegistrationReplyRoute(frames).ok());
  frames = ValidFrames();
  frames[0] = "NONE";
  EXPECT_FALSE(ParseRegistrationReplyRoute(frames).ok());
}

TEST(BuildRegistrationTest, WritesTheReferenceFrames) {
  Registration registration{"10.0.0.2", 17001, "10.0.0.2:15001", 0x7f1234567000ULL, kContract,
                            2,          1};
  auto frames = BuildRegistration(registration);
  ASSERT_TRUE(frames.ok()) << frames.status();
  EXPECT_EQ(*frames, ValidFrames());
}

TEST(BuildRegistrationTest, RejectsWhatTheParserRejects) {
  const Registration valid{"10.0.0.2", 17001, "10.0.0.2:15001", 1, kContract, 2, 1};
  ASSERT_TRUE(BuildRegistration(valid).ok());
  struct Case {
    const char* name;
    void (*mutate)(Registration&);
    const char* message;
  };
  const Case cases[] = {
      {"empty endpoint", [](Registration& r) { r.endpoint = ""; }, "frame 1 (endpoint)"},
      {"long endpoint", [](Registration& r) { r.endpoint = std::string(256, 'e'); },
       "frame 1 (endpoint)"},
      {"non-ASCII endpoint", [](Registration& r) { r.endpoint = "\xe9"; }, "not ASCII"},
      {"port 0", [](Registration& r) { r.port = 0; }, "frame 2 (port)"},
      {"empty session", [](Registration& r) { r.session_id = ""; }, "frame 3 (session id)"},
      {"long session", [](Registration& r) { r.session_id = std::string(513, 's'); },
       "frame 3 (session id)"},
      {"zero pointer", [](Registration& r) { r.arena_base = 0; }, "pointer must be nonzero"},
      {"empty contract", [](Registration& r) { r.contract_wire = ""; },
       "registration frame 5 (contract): 0 bytes, must be 1 to 262144"},
      {"long contract", [](Registration& r) { r.contract_wire = std::string(262145, ' '); },
       "frame 5 (contract): 262145 bytes"},
      {"size 0", [](Registration& r) { r.decode_tp_size = 0; }, "frame 6 (decode_tp_size)"},
      {"size 1025", [](Registration& r) { r.decode_tp_size = 1025; }, "frame 6"},
      {"rank = size", [](Registration& r) { r.decode_tp_rank = 2; }, "frame 7 (decode_tp_rank)"},
  };
  for (const Case& c : cases) {
    Registration registration = valid;
    c.mutate(registration);
    absl::Status status = BuildRegistration(registration).status();
    ASSERT_FALSE(status.ok()) << c.name;
    EXPECT_EQ(CategoryOf(status), ErrorCategory::kInvalidFrame) << c.name;
    EXPECT_THAT(std::string(status.message()), StartsWith("cannot build registration: ")) << c.name;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message)) << c.name;
  }
}

TEST(BuildRegistrationTest, ContractBytesAreOpaque) {
  Registration registration{"h", 1, "s", 1, std::string("\xff\x00 not json", 11), 1, 0};
  auto frames = BuildRegistration(registration);
  ASSERT_TRUE(frames.ok()) << frames.status();
  EXPECT_EQ((*frames)[5], registration.contract_wire);
  EXPECT_EQ(*ParseRegistration(*frames, AcceptContract), registration);
}

}  // namespace
}  // namespace kvrail::wire
