// The 2026-09 status vectors of tests/data/cachepd/r2/status_r2.json, produced by running the
// newer tokenspeed reference (CACHEPD §12.9): the 7-frame sender and the 5- to 8-frame reader.
// The `apply` sequences run through the decode's room logic (control/session).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/casts.h"
#include "control/wire/byte_order.h"
#include "control/wire/status.h"
#include "engine/base/error.h"
#include "tests/support/vectors.h"

namespace kvrail::wire {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

const json& StatusFile() {
  static const json* file = new json(kvrail::testing::LoadVectors("r2/status_r2.json"));
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

// {"hex_le": ..., "value": ..., "repr": ...} or null. The bits come from hex_le, since `value`
// is null for NaN and infinities.
std::optional<double> Logprob(const json& value) {
  if (value.is_null()) {
    return std::nullopt;
  }
  return absl::bit_cast<double>(
      DecodeLittleEndian64(kvrail::testing::FromHex(value.at("hex_le").get<std::string>())));
}

// A generated_by_prefill case's message: the call, the rank the sender wrote (stage-major,
// CACHEPD §12.6) and the values recorded when the final chunk committed.
StatusMessage MessageFromCase(const json& vector_case) {
  const json& call = vector_case.at("call");
  StatusMessage message;
  message.room = call.at("room").get<uint64_t>();
  message.status = call.at("status").get<int>();
  message.prefill_rank = vector_case.at("parsed").at("prefill_rank").get<uint32_t>();
  message.bootstrap_token = call.value("bootstrap_token", int64_t{-1});
  if (call.contains("spec_candidate_ids")) {
    message.spec_candidate_ids = SpecIds(call["spec_candidate_ids"]);
  }
  const json& recorded = vector_case.at("recorded");
  message.cached_tokens = recorded.at("cached_tokens").get<int64_t>();
  message.bootstrap_logprob = Logprob(recorded.at("bootstrap_logprob"));
  return message;
}

// A `parsed` or `result` object read as kvrail's message, in the form of `frames`.
StatusMessage MessageFromResult(const json& result, const std::vector<std::string>& frames) {
  StatusMessage message{result.at("room").get<uint64_t>(), result.at("status").get<int>(),
                        result.at("prefill_rank").get<uint32_t>(),
                        result.at("bootstrap_token").get<int64_t>(),
                        SpecIds(result.at("spec_candidate_ids"))};
  message.cached_tokens = result.at("cached_tokens").get<int64_t>();
  message.bootstrap_logprob = Logprob(result.at("bootstrap_logprob"));
  message.form = StatusFormOf(frames);
  return message;
}

TEST(StatusR2VectorsTest, FileHasEverySection) {
  EXPECT_EQ(StatusFile().value("format", ""), "cachepd-status-r2");
  EXPECT_FALSE(Cases("generated_by_prefill").empty());
  EXPECT_FALSE(Cases("parse").empty());
  EXPECT_FALSE(Cases("apply").empty());
}

TEST(StatusR2VectorsTest, BuildStatusIn2026_09FormMatchesTheNewerSenderByteForByte) {
  for (const json& vector_case : Cases("generated_by_prefill")) {
    SCOPED_TRACE(vector_case.at("name").get<std::string>());
    auto frames = BuildStatus(MessageFromCase(vector_case), StatusForm::k2026_09);
    ASSERT_TRUE(frames.ok()) << frames.status();
    EXPECT_EQ(frames->size(), 7u);
    EXPECT_EQ(*frames, kvrail::testing::VectorFrames(vector_case));
  }
}

TEST(StatusR2VectorsTest, BothParsersReadTheNewerSenderFrames) {
  for (const json& vector_case : Cases("generated_by_prefill")) {
    SCOPED_TRACE(vector_case.at("name").get<std::string>());
    const std::vector<std::string> frames = kvrail::testing::VectorFrames(vector_case);
    const StatusMessage expected = MessageFromResult(vector_case.at("parsed"), frames);
    auto strict = ParseStatus(frames);
    ASSERT_TRUE(strict.ok()) << strict.status();
    EXPECT_EQ(*strict, expected);
    EXPECT_EQ(strict->form, StatusForm::k2026_09);
    auto lenient = ParseStatusLenient(frames);
    ASSERT_TRUE(lenient.ok()) << lenient.status();
    EXPECT_EQ(*lenient, expected);
  }
}

TEST(StatusR2VectorsTest, LenientParseMatchesTheNewerReferenceDecode) {
  for (const json& vector_case : Cases("parse")) {
    SCOPED_TRACE(vector_case.at("name").get<std::string>());
    const json& result = vector_case.at("result");
    const std::vector<std::string> frames = kvrail::testing::VectorFrames(vector_case);
    auto message = ParseStatusLenient(frames);
    if (!result.at("ok").get<bool>()) {
      ASSERT_FALSE(message.ok());
      EXPECT_EQ(CategoryOf(message.status()), ErrorCategory::kInvalidFrame);
      continue;
    }
    ASSERT_TRUE(message.ok()) << message.status();
    EXPECT_EQ(*message, MessageFromResult(result, frames));
  }
}

// CACHEPD §12.9: frame 6 is read before frame 5, so the logprob's error is the one reported.
TEST(StatusR2VectorsTest, TheLogprobErrorIsReportedFirst) {
  for (const json& vector_case : Cases("parse")) {
    if (vector_case.at("name") != "logprob_bad_with_bad_cached") {
      continue;
    }
    auto message = ParseStatusLenient(kvrail::testing::VectorFrames(vector_case));
    ASSERT_FALSE(message.ok());
    EXPECT_THAT(std::string(message.status().message()),
                HasSubstr("status frame 6 (bootstrap logprob): 1 bytes"));
    return;
  }
  FAIL() << "status_r2.json has no logprob_bad_with_bad_cached case";
}

// The strict parser accepts the frame sets kvrail's own sender would write byte for byte (a
// 6-frame set builds back with an empty frame 6), less NaN and +inf logprobs (status.h).
TEST(StatusR2VectorsTest, StrictParseAcceptsOnlyCanonicalFrameSets) {
  std::vector<std::string> strictly_accepted;
  for (const json& vector_case : Cases("parse")) {
    const std::string name = vector_case.at("name").get<std::string>();
    SCOPED_TRACE(name);
    std::vector<std::string> frames = kvrail::testing::VectorFrames(vector_case);
    auto lenient = ParseStatusLenient(frames);
    bool canonical = false;
    if (lenient.ok()) {
      auto rebuilt = BuildStatus(*lenient, lenient->form);
      std::vector<std::string> expected = frames;
      if (expected.size() == 6) expected.emplace_back();
      canonical = rebuilt.ok() && *rebuilt == expected;
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
  EXPECT_THAT(strictly_accepted,
              ::testing::IsSupersetOf({"seven_frames", "six_frames_no_logprob",
                                       "seven_frames_empty_logprob", "big_endian_logprob_bytes"}));
}

}  // namespace
}  // namespace kvrail::wire
