// The registration and pre-allocation vectors of tests/data/cachepd/frames.json, produced by
// running the tokenspeed reference (CACHEPD §3.2, §3.2.1, §3.3).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "control/wire/dispatch.h"
#include "control/wire/limits.h"
#include "control/wire/preallocation.h"
#include "control/wire/registration.h"
#include "engine/base/error.h"
#include "tests/support/vectors.h"

namespace kvrail::wire {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

const json& FramesFile() {
  static const json* file = new json(kvrail::testing::LoadVectors("frames.json"));
  return *file;
}

std::vector<json> Cases(const char* kind) {
  const json& file = FramesFile();
  if (!file.is_object() || !file.contains(kind)) {
    return {};
  }
  return file[kind].get<std::vector<json>>();
}

// Registration checks outside frame 5 raise ValueError or UnicodeDecodeError (CACHEPD §3.2);
// any other class comes from the contract parser (CacheContractError, ZeroDivisionError,
// RecursionError), which is another package's job.
bool IsContentError(const json& parse) {
  if (parse.at("ok").get<bool>()) {
    return false;
  }
  const std::string error_class = parse.at("error").at("class").get<std::string>();
  return error_class != "ValueError" && error_class != "UnicodeDecodeError";
}

// Stands in for the layout package's contract parser: enforces 1..262144 bytes, and rejects
// the contract whenever the reference rejected this case's contract.
absl::Status VectorContractCheck(const json& vector_case, absl::string_view contract_wire) {
  if (contract_wire.empty() || contract_wire.size() > kMaxContractBytes) {
    return MakeError(ErrorCategory::kInvalidContract, "payload must be 1..262144 bytes");
  }
  if (IsContentError(vector_case.at("result").at("parse"))) {
    return MakeError(ErrorCategory::kInvalidContract, "the reference rejects this contract");
  }
  return absl::OkStatus();
}

MessageKind ExpectedKind(const json& result) {
  const std::string path = result.at("handler_path").get<std::string>();
  if (path == "registration") {
    return MessageKind::kRegistration;
  }
  if (path == "preallocation") {
    return MessageKind::kPreallocation;
  }
  EXPECT_EQ(path, "dropped_malformed_header");
  return MessageKind::kDropped;
}

TEST(FramesVectorsTest, FileHasBothMessageKinds) {
  EXPECT_EQ(FramesFile().value("format", ""), "cachepd-frames-v1");
  EXPECT_FALSE(Cases("registration").empty());
  EXPECT_FALSE(Cases("preallocation").empty());
}

TEST(FramesVectorsTest, ClassifyPicksTheReferenceHandler) {
  for (const char* kind : {"registration", "preallocation"}) {
    for (const json& vector_case : Cases(kind)) {
      SCOPED_TRACE(std::string(kind) + "/" + vector_case.at("name").get<std::string>());
      EXPECT_EQ(Classify(kvrail::testing::VectorFrames(vector_case)),
                ExpectedKind(vector_case["result"]));
    }
  }
}

TEST(FramesVectorsTest, RegistrationReplyRouteMatchesReference) {
  for (const json& vector_case : Cases("registration")) {
    SCOPED_TRACE(vector_case.at("name").get<std::string>());
    const json& expected = vector_case.at("result").at("reply_route");
    auto route = ParseRegistrationReplyRoute(kvrail::testing::VectorFrames(vector_case));
    ASSERT_EQ(route.ok(), expected.at("ok").get<bool>()) << route.status();
    if (!route.ok()) {
      EXPECT_EQ(CategoryOf(route.status()), ErrorCategory::kInvalidFrame);
      continue;
    }
    EXPECT_EQ(route->endpoint, expected.at("endpoint").get<std::string>());
    EXPECT_EQ(route->port, expected.at("dst_port").get<int>());
    EXPECT_EQ(route->session_id, expected.at("session_id").get<std::string>());
  }
}

TEST(FramesVectorsTest, RegistrationParseMatchesReference) {
  for (const json& vector_case : Cases("registration")) {
    SCOPED_TRACE(vector_case.at("name").get<std::string>());
    const json& expected = vector_case.at("result").at("parse");
    auto registration = ParseRegistration(
        kvrail::testing::VectorFrames(vector_case),
        [&](absl::string_view wire) { return VectorContractCheck(vector_case, wire); });
    ASSERT_EQ(registration.ok(), expected.at("ok").get<bool>()) << registration.status();
    if (!registration.ok()) {
      const bool content = IsContentError(expected);
      EXPECT_EQ(CategoryOf(registration.status()),
                content ? ErrorCategory::kInvalidContract : ErrorCategory::kInvalidFrame)
          << registration.status();
      if (content) {
        EXPECT_THAT(std::string(registration.status().message()),
                    HasSubstr("registration frame 5 (contract)"));
      }
      continue;
    }
    EXPECT_EQ(registration->endpoint, expected.at("endpoint").get<std::string>());
    EXPECT_EQ(registration->port, expected.at("dst_port").get<int>());
    EXPECT_EQ(registration->session_id, expected.at("session_id").get<std::string>());
    EXPECT_EQ(registration->arena_base, expected.at("dst_kv_ptr").get<uint64_t>());
    EXPECT_EQ(registration->decode_tp_size, expected.at("decode_tp_size").get<uint32_t>());
    EXPECT_EQ(registration->decode_tp_rank, expected.at("decode_tp_rank").get<uint32_t>());
  }
}

TEST(FramesVectorsTest, RegistrationErrorsNameTheRuleTheReferenceNames) {
  // The reference's message says which rule broke; kvrail's names the same one.
  for (const json& vector_case : Cases("registration")) {
    const json& expected = vector_case.at("result").at("parse");
    if (expected.at("ok").get<bool>() || IsContentError(expected)) {
      continue;
    }
    SCOPED_TRACE(vector_case.at("name").get<std::string>());
    const std::string reference = expected.at("error").at("message").get<std::string>();
    auto registration = ParseRegistration(kvrail::testing::VectorFrames(vector_case),
                                          [](absl::string_view) { return absl::OkStatus(); });
    ASSERT_FALSE(registration.ok());
    const std::string message(registration.status().message());
    for (const char* rule : {"must be canonical unsigned ASCII", "is out of range", "nonzero"}) {
      if (reference.find(rule) != std::string::npos) {
        EXPECT_THAT(message, HasSubstr(rule));
      }
    }
  }
}

TEST(FramesVectorsTest, PreallocationRouteHeaderMatchesReference) {
  for (const json& vector_case : Cases("preallocation")) {
    SCOPED_TRACE(vector_case.at("name").get<std::string>());
    const json& expected = vector_case.at("result").at("route_header");
    auto header = ParsePreallocationRouteHeader(kvrail::testing::VectorFrames(vector_case));
    ASSERT_EQ(header.ok(), expected.at("ok").get<bool>()) << header.status();
    if (!header.ok()) {
      EXPECT_EQ(CategoryOf(header.status()), ErrorCategory::kInvalidFrame);
      continue;
    }
    EXPECT_EQ(header->room, expected.at("room").get<uint64_t>());
    EXPECT_EQ(header->session_id, expected.at("session_id").get<std::string>());
  }
}

TEST(FramesVectorsTest, PreallocationParseMatchesReferenceUpToManifestContent) {
  for (const json& vector_case : Cases("preallocation")) {
    SCOPED_TRACE(vector_case.at("name").get<std::string>());
    const std::vector<std::string> frames = kvrail::testing::VectorFrames(vector_case);
    const json& expected = vector_case.at("result").at("parse");
    const json& header = vector_case.at("result").at("route_header");
    auto preallocation = ParsePreallocation(frames);
    // Manifest JSON is the layout package's to judge (CACHEPD §5): where the reference rejects
    // only the manifest's content, the frames themselves are valid.
    const bool manifest_content_only = IsContentError(expected) && header.at("ok").get<bool>() &&
                                       frames[2].size() <= kMaxManifestBytes;
    const bool expect_ok = expected.at("ok").get<bool>() || manifest_content_only;
    ASSERT_EQ(preallocation.ok(), expect_ok) << preallocation.status();
    if (!preallocation.ok()) {
      // An oversized manifest is the manifest's rule (CACHEPD §5.1); the rest are frame rules.
      EXPECT_EQ(CategoryOf(preallocation.status()),
                frames.size() == 3 && frames[2].size() > kMaxManifestBytes
                    ? ErrorCategory::kInvalidManifest
                    : ErrorCategory::kInvalidFrame);
      continue;
    }
    const json& values = expected.at("ok").get<bool>() ? expected : header;
    EXPECT_EQ(preallocation->room, values.at("room").get<uint64_t>());
    EXPECT_EQ(preallocation->session_id, values.at("session_id").get<std::string>());
    EXPECT_EQ(preallocation->is_dummy(), frames[2].empty());
    if (expected.at("ok").get<bool>()) {
      EXPECT_EQ(preallocation->is_dummy(), expected.at("is_dummy").get<bool>());
    }
  }
}

TEST(FramesVectorsTest, AcceptedRegistrationsBuildBackToTheSameBytes) {
  int accepted = 0;
  for (const json& vector_case : Cases("registration")) {
    SCOPED_TRACE(vector_case.at("name").get<std::string>());
    const std::vector<std::string> frames = kvrail::testing::VectorFrames(vector_case);
    auto registration = ParseRegistration(
        frames, [&](absl::string_view wire) { return VectorContractCheck(vector_case, wire); });
    if (!registration.ok()) {
      continue;
    }
    ++accepted;
    auto built = BuildRegistration(*registration);
    ASSERT_TRUE(built.ok()) << built.status();
    // Contract bytes are carried as sent, so even a non-canonical contract (contract_pretty)
    // comes back byte for byte.
    EXPECT_EQ(*built, frames);
  }
  EXPECT_GT(accepted, 0);
}

TEST(FramesVectorsTest, AcceptedPreallocationsBuildBackToTheSameBytes) {
  int accepted = 0;
  for (const json& vector_case : Cases("preallocation")) {
    SCOPED_TRACE(vector_case.at("name").get<std::string>());
    const std::vector<std::string> frames = kvrail::testing::VectorFrames(vector_case);
    auto preallocation = ParsePreallocation(frames);
    if (!preallocation.ok()) {
      continue;
    }
    ++accepted;
    auto built = BuildPreallocation(*preallocation);
    ASSERT_TRUE(built.ok()) << built.status();
    EXPECT_EQ(*built, frames);
  }
  EXPECT_GT(accepted, 0);
}

TEST(FramesVectorsTest, GeneratedFramesCarryTheContractAndManifestUsed) {
  for (const char* kind : {"registration", "preallocation"}) {
    for (const json& vector_case : Cases(kind)) {
      if (!vector_case.contains("generated_by")) {
        continue;
      }
      SCOPED_TRACE(vector_case.at("name").get<std::string>());
      const std::vector<std::string> frames = kvrail::testing::VectorFrames(vector_case);
      if (std::string(kind) == "registration") {
        EXPECT_EQ(frames.at(5), FramesFile().at("contract_used").get<std::string>());
      } else {
        EXPECT_EQ(frames.at(2), FramesFile().at("manifest_used").get<std::string>());
      }
    }
  }
}

}  // namespace
}  // namespace kvrail::wire
