#include "tools/inspect.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/base/error.h"
#include "tests/support/vectors.h"

namespace kvrail::tools {
namespace {

using kvrail::testing::LoadVectors;

std::string HexLines(const nlohmann::json& frames_hex) {
  std::string text;
  for (const auto& frame : frames_hex) text += frame.get<std::string>() + "\n";
  return text;
}

TEST(InspectTest, RegistrationFromStdinPrintsEveryMember) {
  const nlohmann::json vectors = LoadVectors("frames.json");
  const auto& entry = vectors["registration"][0];
  absl::StatusOr<std::string> out =
      Inspect({.kind = "registration"}, HexLines(entry["frames_hex"]));
  ASSERT_TRUE(out.ok()) << out.status();
  nlohmann::json json = nlohmann::json::parse(*out);
  const auto& parse = entry["result"]["parse"];
  EXPECT_EQ(json["endpoint"], parse["endpoint"]);
  EXPECT_EQ(json["dst_port"], parse["dst_port"]);
  EXPECT_EQ(json["session_id"], parse["session_id"]);
  EXPECT_EQ(json["dst_kv_ptr"], parse["dst_kv_ptr"]);
  EXPECT_EQ(json["dst_kv_ptr_hex"], parse["dst_kv_ptr_hex"]);
  EXPECT_EQ(json["decode_tp_size"], parse["decode_tp_size"]);
  EXPECT_EQ(json["decode_tp_rank"], parse["decode_tp_rank"]);
  EXPECT_EQ(json["contract"], parse["contract_canonical_wire"]);
}

TEST(InspectTest, FramesAsArgumentsEqualFramesOnStdin) {
  const nlohmann::json vectors = LoadVectors("frames.json");
  const auto& entry = vectors["preallocation"][0];
  InspectOptions args{.kind = "preallocation"};
  for (const auto& f : entry["frames_hex"]) args.hex_frames.push_back(f.get<std::string>());
  EXPECT_EQ(*Inspect(args, ""), *Inspect({.kind = "preallocation"}, HexLines(entry["frames_hex"])));
}

TEST(InspectTest, EmptyLineIsAnEmptyFrame) {
  absl::StatusOr<std::vector<std::string>> frames = FramesFromHexLines("3432\n35\n31\n313030\n\n");
  ASSERT_TRUE(frames.ok());
  ASSERT_EQ(frames->size(), 5u);
  EXPECT_EQ((*frames)[4], "");
  EXPECT_TRUE(FramesFromHexLines("")->empty());
}

// CACHEPD §12.9: a 7-frame status shows its cached tokens and logprob, a 5-frame one 0 and null.
TEST(InspectTest, StatusPrintsCachedTokensAndLogprob) {
  const nlohmann::json vectors = LoadVectors("r2/status_r2.json");
  const auto& entry = vectors["generated_by_prefill"][0];
  absl::StatusOr<std::string> out = Inspect({.kind = "status"}, HexLines(entry["frames_hex"]));
  ASSERT_TRUE(out.ok()) << out.status();
  nlohmann::json json = nlohmann::json::parse(*out);
  EXPECT_EQ(json["frames"], 7);
  EXPECT_EQ(json["revision"], "2026-09");
  EXPECT_EQ(json["cached_tokens"], entry["parsed"]["cached_tokens"]);
  EXPECT_EQ(json["bootstrap_logprob"], entry["parsed"]["bootstrap_logprob"]["value"]);

  out = Inspect({.kind = "status"}, "3432\n35\n31\n313030\n\n");
  ASSERT_TRUE(out.ok()) << out.status();
  json = nlohmann::json::parse(*out);
  EXPECT_EQ(json["revision"], "snapshot");
  EXPECT_EQ(json["cached_tokens"], 0);
  EXPECT_TRUE(json["bootstrap_logprob"].is_null());
}

TEST(InspectTest, ANonFiniteLogprobIsPrintedAsAString) {
  absl::StatusOr<std::string> out = Inspect({.kind = "status", .lenient_status = true},
                                            "3432\n35\n31\n313030\n\n30\n000000000000f87f\n");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(nlohmann::json::parse(*out)["bootstrap_logprob"], "nan");
}

TEST(InspectTest, BadHexNamesTheLine) {
  absl::StatusOr<std::string> out = Inspect({.kind = "status"}, "3432\nzz\n31\n");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(CategoryOf(out.status()), ErrorCategory::kInvalidFrame);
  EXPECT_NE(out.status().message().find("line 2"), absl::string_view::npos);
}

TEST(InspectTest, EveryErrorHasACategory) {
  struct Case {
    InspectOptions options;
    std::string input;
    ErrorCategory category;
  };
  const nlohmann::json contracts = LoadVectors("contracts.json");
  std::string contract = contracts["valid"][0]["result"]["canonical_wire"];
  const Case cases[] = {
      {{.kind = "contract"}, "{}", ErrorCategory::kInvalidContract},
      {{.kind = "manifest"}, "[]", ErrorCategory::kInvalidManifest},
      {{.kind = "registration"}, "4e6f6e65\n", ErrorCategory::kInvalidFrame},
      {{.kind = "preallocation"}, "3037\n73\n\n", ErrorCategory::kInvalidFrame},
      {{.kind = "status"}, "3432\n35\n", ErrorCategory::kInvalidFrame},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::string> out = Inspect(c.options, c.input);
    ASSERT_FALSE(out.ok()) << c.options.kind;
    EXPECT_EQ(CategoryOf(out.status()), c.category) << out.status();
    EXPECT_EQ(DescribeError(out.status()).find('\n'), std::string::npos);
  }
}

}  // namespace
}  // namespace kvrail::tools
