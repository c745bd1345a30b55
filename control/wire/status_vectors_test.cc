// The status vectors of tests/data/cachepd/status.json, produced by running the tokenspeed
// reference (CACHEPD §3.4).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "control/wire/limits.h"
#include "control/wire/status.h"
#include "engine/base/error.h"
#include "tests/support/vectors.h"

namespace kvrail::wire {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

const json& StatusFile() {
  static const json* file = new json(kvrail::testing::LoadVectors("status.json"));
  return *file;
}

std::vector<json> Cases(const char* kind) {
  const json& file = StatusFile();
  if (!file.is_object() || !file.contains(kind)) {
    return {};
  }
  return file[kind].get<std::vector<json>>();
}

std::optional<std::vector<int32_t>> SpecIds(const json& value) {
  if (value.is_null()) {
    return std::nullopt;
  }
  return value.get<std::vector<int32_t>>();
}

StatusMessage MessageFromCall(const json& call) {
  StatusMessage message;
  message.room = call.at("room").get<uint64_t>();
  message.status = call.at("status").get<int>();
  message.prefill_rank = call.at("prefill_rank").get<uint32_t>();
  message.bootstrap_token = call.value("bootstrap_token", int64_t{-1});
  if (call.contains("spec_candidate_ids")) {
    message.spec_candidate_ids = SpecIds(call["spec_candidate_ids"]);
  }
  return message;
}

// `parsed` is [room, status, prefill_rank, bootstrap_token, spec_candidate_ids].
StatusMessage MessageFromParsed(const json& parsed) {
  return StatusMessage{parsed.at(0).get<uint64_t>(), parsed.at(1).get<int>(),
                       parsed.at(2).get<uint32_t>(), parsed.at(3).get<int64_t>(),
                       SpecIds(parsed.at(4))};
}

// Whether an accepted reference result fits kvrail's types; ParseStatusLenient documents that
// it rejects the rest.
bool FitsKvrailTypes(const json& result) {
  uint64_t room = 0;
  if (!absl::SimpleAtoi(result.at("room_decimal").get<std::string>(), &room) || room > kMaxRoom) {
    return false;
  }
  const json& status = result.at("status");
  return status.is_number_integer() && status.get<int64_t>() >= std::numeric_limits<int>::min() &&
         status.get<int64_t>() <= std::numeric_limits<int>::max() &&
         result.at("prefill_rank").is_number_unsigned() &&
         result.at("prefill_rank").get<uint64_t>() <= std::numeric_limits<uint32_t>::max() &&
         result.at("bootstrap_token").is_number_integer();
}

TEST(StatusVectorsTest, FileHasBothSections) {
  EXPECT_EQ(StatusFile().value("format", ""), "cachepd-status-v1");
  EXPECT_FALSE(Cases("generated_by_prefill").empty());
  EXPECT_FALSE(Cases("parse").empty());
}

TEST(StatusVectorsTest, PollValuesAreTheStrictStatusRange) {
  for (const auto& [name, value] : StatusFile().at("poll_values").items()) {
    EXPECT_LE(value.get<uint64_t>(), kMaxTransferPoll) << name;
  }
}

TEST(StatusVectorsTest, BuildStatusMatchesTheReferenceSenderByteForByte) {
  for (const json& vector_case : Cases("generated_by_prefill")) {
    SCOPED_TRACE(vector_case.at("name").get<std::string>());
    auto frames = BuildStatus(MessageFromCall(vector_case.at("call")), StatusForm::kSnapshot);
    ASSERT_TRUE(frames.ok()) << frames.status();
    EXPECT_EQ(*frames, kvrail::testing::VectorFrames(vector_case));
  }
}

TEST(StatusVectorsTest, StrictParseReadsTheReferenceSenderFrames) {
  for (const json& vector_case : Cases("generated_by_prefill")) {
    SCOPED_TRACE(vector_case.at("name").get<std::string>());
    auto message = ParseStatus(kvrail::testing::VectorFrames(vector_case));
    ASSERT_TRUE(message.ok()) << message.status();
    EXPECT_EQ(*message, MessageFromParsed(vector_case.at("parsed")));
  }
}

// The snapshot's reader ignored every frame after 4 (CACHEPD §3.4); 2026-09 reads frames 5 and
// 6 (CACHEPD §12.9, which supersedes §3.4 where they disagree). A snapshot case of more than 5
// frames is therefore checked against §12.9 (SixFramesAreReadAs2026_09 below), not here.
TEST(StatusVectorsTest, LenientParseMatchesTheReferenceDecode) {
  int divergent = 0;
  for (const json& vector_case : Cases("parse")) {
    SCOPED_TRACE(vector_case.at("name").get<std::string>());
    if (kvrail::testing::VectorFrames(vector_case).size() > 5) continue;
    const json& result = vector_case.at("result");
    auto message = ParseStatusLenient(kvrail::testing::VectorFrames(vector_case));
    if (!result.at("ok").get<bool>()) {
      ASSERT_FALSE(message.ok());
      EXPECT_EQ(CategoryOf(message.status()), ErrorCategory::kInvalidFrame);
      continue;
    }
    if (!FitsKvrailTypes(result)) {  // huge_room: a deliberate, documented divergence
      ++divergent;
      ASSERT_FALSE(message.ok());
      EXPECT_THAT(std::string(message.status().message()), HasSubstr("is out of range"));
      continue;
    }
    ASSERT_TRUE(message.ok()) << message.status();
    EXPECT_EQ(message->room, result.at("room").get<uint64_t>());
    EXPECT_EQ(message->status, result.at("status").get<int>());
    EXPECT_EQ(message->prefill_rank, result.at("prefill_rank").get<uint32_t>());
    EXPECT_EQ(message->bootstrap_token, result.at("bootstrap_token").get<int64_t>());
    EXPECT_EQ(message->spec_candidate_ids, SpecIds(result.at("spec_candidate_ids")));
  }
  EXPECT_LE(divergent, 1);
}

// six_frames carries "junk" in frame 5: the snapshot reference ignored it; the 2026-09 one reads
// it as the cached-token count and drops the message (CACHEPD §12.9).
TEST(StatusVectorsTest, SixFramesAreReadAs2026_09) {
  for (const json& vector_case : Cases("parse")) {
    if (vector_case.at("name") != "six_frames") {
      continue;
    }
    const std::vector<std::string> frames = kvrail::testing::VectorFrames(vector_case);
    ASSERT_EQ(frames.size(), 6u);
    EXPECT_EQ(frames[5], "junk");
    auto message = ParseStatusLenient(frames);
    ASSERT_FALSE(message.ok());
    EXPECT_THAT(std::string(message.status().message()),
                HasSubstr("status frame 5 (cached tokens)"));
    EXPECT_FALSE(ParseStatus(frames).ok());
    return;
  }
  FAIL() << "status.json has no six_frames case";
}

TEST(StatusVectorsTest, HugeRoomIsRejectedWithAClearMessage) {
  for (const json& vector_case : Cases("parse")) {
    if (vector_case.at("name") != "huge_room") {
      continue;
    }
    auto message = ParseStatusLenient(kvrail::testing::VectorFrames(vector_case));
    ASSERT_FALSE(message.ok());
    EXPECT_EQ(message.status().message(),
              "status frame 0 (room): 1180591620717411303424 is out of range "
              "[0, 9223372036854775807] (CACHEPD §3.4)");
    return;
  }
  FAIL() << "status.json has no huge_room case";
}

// The strict parser accepts exactly the canonical frame sets: those the reference accepts and
// that kvrail's own sender would write byte for byte.
TEST(StatusVectorsTest, StrictParseAcceptsOnlyCanonicalFrameSets) {
  std::vector<std::string> strictly_accepted;
  for (const json& vector_case : Cases("parse")) {
    const std::string name = vector_case.at("name").get<std::string>();
    SCOPED_TRACE(name);
    const std::vector<std::string> frames = kvrail::testing::VectorFrames(vector_case);
    auto lenient = ParseStatusLenient(frames);
    bool canonical = false;
    if (lenient.ok()) {
      auto rebuilt = BuildStatus(*lenient, lenient->form);
      canonical = rebuilt.ok() && *rebuilt == frames;
    }
    auto strict = ParseStatus(frames);
    EXPECT_EQ(strict.ok(), canonical) << strict.status();
    if (strict.ok()) {
      strictly_accepted.push_back(name);
      EXPECT_EQ(*strict, *lenient);
    } else {
      EXPECT_EQ(CategoryOf(strict.status()), ErrorCategory::kInvalidFrame);
    }
  }
  EXPECT_THAT(strictly_accepted, ::testing::IsSupersetOf({"five_frames", "empty_spec_frame"}));
}

}  // namespace
}  // namespace kvrail::wire
