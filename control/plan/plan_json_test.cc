#include "control/plan/plan_json.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "control/plan/vector_cases.h"
#include "engine/base/error.h"

namespace kvrail::plan {
namespace {

using testing::CategoryOfReferenceError;
using testing::PlannerCase;
using testing::PlannerCases;
using testing::ReadPlannerCase;

// Replaces every "error" object by {"category": ...}: the reference's Python exception maps to
// its kvrail category, and kvrail's own message (not the reference's text) is dropped.
void NormalizeErrors(nlohmann::json& json, bool reference) {
  if (json.is_array()) {
    for (nlohmann::json& item : json) {
      NormalizeErrors(item, reference);
    }
    return;
  }
  if (!json.is_object()) {
    return;
  }
  for (auto it = json.begin(); it != json.end(); ++it) {
    if (it.key() == "error" && it.value().is_object()) {
      std::string category = "error";
      if (reference) {
        auto mapped = CategoryOfReferenceError(it.value());
        if (mapped.has_value()) {
          category = static_cast<std::string>(CategoryName(*mapped));
        }
      } else {
        category = it.value().at("category").get<std::string>();
      }
      it.value() = nlohmann::json{{"category", category}};
    } else {
      NormalizeErrors(it.value(), reference);
    }
  }
}

nlohmann::json Plain(const nlohmann::ordered_json& json) {
  return nlohmann::json::parse(json.dump());
}

TEST(PlanJsonTest, EveryCaseEqualsTheVectorResult) {
  int ok_cases = 0;
  for (const nlohmann::json& entry : PlannerCases()) {
    const PlannerCase c = ReadPlannerCase(entry);
    SCOPED_TRACE(c.name);
    nlohmann::json ours =
        Plain(PlanToJson(Planner::Create(c.prefill_tp, c.decode_tp, c.prefill, c.decode)));
    nlohmann::json theirs = *c.result;
    NormalizeErrors(ours, /*reference=*/false);
    NormalizeErrors(theirs, /*reference=*/true);
    EXPECT_EQ(ours, theirs) << "ours:   " << ours.dump() << "\ntheirs: " << theirs.dump();
    if (theirs.at("ok").get<bool>()) {
      ++ok_cases;
    }
  }
  EXPECT_GT(ok_cases, 0);
}

std::vector<std::string> Keys(const nlohmann::ordered_json& object) {
  std::vector<std::string> keys;
  for (auto it = object.begin(); it != object.end(); ++it) {
    keys.push_back(it.key());
  }
  return keys;
}

using Names = std::vector<std::string>;

// The member order of planner.json's `result`, object by object.
TEST(PlanJsonTest, MembersComeInTheVectorOrder) {
  const PlannerCase c = [] {
    for (const nlohmann::json& entry : PlannerCases()) {
      if (entry.at("name") == "gqa_kv4_p8_d2") {
        return ReadPlannerCase(entry);
      }
    }
    return PlannerCase();
  }();
  const nlohmann::ordered_json json =
      PlanToJson(Planner::Create(c.prefill_tp, c.decode_tp, c.prefill, c.decode));
  EXPECT_EQ(Keys(json), (Names{"ok", "decode_ranks_by_prefill_rank", "decode_ranks",
                               "prefill_registrations", "required_counts"}));
  EXPECT_EQ(Keys(json["decode_ranks_by_prefill_rank"][0]),
            (Names{"prefill_tp_rank", "decode_tp_ranks"}));
  const nlohmann::ordered_json& decode_rank = json["decode_ranks"][0];
  EXPECT_EQ(Keys(decode_rank),
            (Names{"decode_tp_rank", "whole_field_copy", "fragments_by_prefill_rank",
                   "expected_prefill_ranks", "dummy_tp_ranks", "target_tp_ranks"}));
  EXPECT_EQ(Keys(decode_rank["fragments_by_prefill_rank"][0]),
            (Names{"prefill_tp_rank", "fragments"}));
  EXPECT_EQ(
      Keys(decode_rank["fragments_by_prefill_rank"][0]["fragments"][0]),
      (Names{"group_id", "field_id", "src_byte_offset", "dst_byte_offset", "src_row_stride_bytes",
             "dst_row_stride_bytes", "bytes_per_row", "rows_per_page"}));
  const nlohmann::ordered_json& registrations = json["prefill_registrations"];
  EXPECT_EQ(registrations[0]["outcome"], "send");
  EXPECT_EQ(Keys(registrations[0]), (Names{"prefill_tp_rank", "decode_tp_rank", "outcome",
                                           "fragments", "expected_decode_ranks"}));
  EXPECT_EQ(registrations[1]["outcome"], "reject");
  EXPECT_EQ(Keys(registrations[1]),
            (Names{"prefill_tp_rank", "decode_tp_rank", "outcome", "error"}));
  EXPECT_EQ(Keys(registrations[1]["error"]), (Names{"category", "message"}));
  EXPECT_EQ(Keys(json["required_counts"]), (Names{"preallocations_per_room_by_prefill_rank",
                                                  "completions_per_room_by_decode_rank"}));
}

TEST(PlanJsonTest, ConstructorErrorHasTheVectorShape) {
  const PlannerCase c = [] {
    for (const nlohmann::json& entry : PlannerCases()) {
      if (entry.at("name") == "err_tp_not_multiple_of_shards") {
        return ReadPlannerCase(entry);
      }
    }
    return PlannerCase();
  }();
  const nlohmann::ordered_json json =
      PlanToJson(Planner::Create(c.prefill_tp, c.decode_tp, c.prefill, c.decode));
  EXPECT_EQ(Keys(json), (Names{"ok", "stage", "error"}));
  EXPECT_EQ(json["ok"], false);
  EXPECT_EQ(json["stage"], "planner_constructor");
  EXPECT_EQ(json["error"]["category"], "unsupported-layout");
  EXPECT_NE(json["error"]["message"].get<std::string>().find("layer.0.k"), std::string::npos);
}

TEST(PlanJsonTest, DecodeRankErrorReplacesItsRoute) {
  const PlannerCase c = [] {
    for (const nlohmann::json& entry : PlannerCases()) {
      if (entry.at("name") == "err_no_fields_heterogeneous") {
        return ReadPlannerCase(entry);
      }
    }
    return PlannerCase();
  }();
  const nlohmann::ordered_json json =
      PlanToJson(Planner::Create(c.prefill_tp, c.decode_tp, c.prefill, c.decode));
  EXPECT_EQ(Keys(json["decode_ranks"][0]), (Names{"decode_tp_rank", "error"}));
  EXPECT_EQ(json["decode_ranks"][0]["error"]["category"], "unsupported-layout");
}

TEST(PlanJsonTest, ErrorWithoutCategoryIsPlainError) {
  const nlohmann::ordered_json json = ErrorToJson(absl::InternalError("boom"));
  EXPECT_EQ(json.dump(), R"({"category":"error","message":"boom"})");
}

}  // namespace
}  // namespace kvrail::plan
