#include "control/bootstrap/registration.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "control/bootstrap/refusal.h"
#include "tests/support/vectors.h"

namespace kvrail::bootstrap {
namespace {

using nlohmann::json;

std::string ReferenceLayout() {
  static const std::string* const layout = new std::string(
      kvrail::testing::LoadVectors(
          "bootstrap.json")["scenarios"][0]["exchanges"][2]["json_body"]["cache_layout"]
          .get<std::string>());
  return *layout;
}

json Body() {
  return {{"role", "Prefill"},
          {"world_size", 4},
          {"dp_size", 2},
          {"rank_ip", "10.0.0.3"},
          {"rank_port", "18003"},
          {"engine_rank", " 3 "},
          {"cache_layout", ReferenceLayout()}};
}

TEST(RegistrationTest, ReadsAReferenceBodyWithPythonIntegers) {
  absl::StatusOr<ParsedRegistration> parsed = ParseRegistration(Body().dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const PrefillRegistration& r = parsed->registration;
  EXPECT_EQ(r.role, "Prefill");
  EXPECT_EQ(r.endpoint, (RankEndpoint{"10.0.0.3", 18003}));
  EXPECT_EQ(r.engine_rank, 3);
  EXPECT_EQ(r.DpGroup(), 1);
  EXPECT_EQ(r.RankInDpGroup(), 1);
  EXPECT_FALSE(r.pipeline.has_value());
  EXPECT_EQ(parsed->canonical_layout, ReferenceLayout());
}

TEST(RegistrationTest, RoundTripsThroughSerialize) {
  ParsedRegistration parsed = *ParseRegistration(Body().dump());
  parsed.registration.pipeline =
      plan::PipelineLayout{1, {{"layer.0.k", "layer.0.latent", "layer.1.conv"}}};
  parsed.registration.sharded_groups = {{"history", 2}};
  absl::StatusOr<std::string> body = SerializeRegistration(parsed.registration);
  ASSERT_TRUE(body.ok()) << body.status();
  absl::StatusOr<ParsedRegistration> again = ParseRegistration(*body);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->registration.endpoint, parsed.registration.endpoint);
  EXPECT_EQ(again->registration.engine_rank, 3);
  ASSERT_TRUE(again->registration.pipeline.has_value());
  EXPECT_EQ(again->registration.pipeline->fields_by_stage,
            parsed.registration.pipeline->fields_by_stage);
  ASSERT_EQ(again->registration.sharded_groups.size(), 1u);
  EXPECT_EQ(again->canonical_layout, ReferenceLayout());
}

TEST(RegistrationTest, ACurvePublicKeyRoundTripsAndABodyWithoutOneHasNone) {
  const std::string key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";  // ZMQ RFC 32's example
  json with_key = Body();
  with_key["curve_public_key"] = key;
  absl::StatusOr<ParsedRegistration> parsed = ParseRegistration(with_key.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->registration.endpoint.curve_public_key, key);
  absl::StatusOr<std::string> body = SerializeRegistration(parsed->registration);
  ASSERT_TRUE(body.ok());
  EXPECT_NE(body->find("\"curve_public_key\": \"" + key), std::string::npos) << *body;

  ParsedRegistration plain = *ParseRegistration(Body().dump());
  EXPECT_TRUE(plain.registration.endpoint.curve_public_key.empty());
  EXPECT_EQ(SerializeRegistration(plain.registration)->find("curve"), std::string::npos);

  with_key["curve_public_key"] = "short";
  absl::StatusOr<ParsedRegistration> bad = ParseRegistration(with_key.dump());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("curve_public_key"), std::string::npos);
}

TEST(RegistrationTest, RefusalsCarryTheirHttpStatus) {
  json body = Body();
  body.erase("rank_ip");
  EXPECT_EQ(HttpStatusOf(ParseRegistration(body.dump()).status()), 500);
  body = Body();
  body["engine_rank"] = 9;
  absl::Status range = ParseRegistration(body.dump()).status();
  EXPECT_EQ(HttpStatusOf(range), 400);
  EXPECT_EQ(range.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(range.message().find("engine_rank: 9 is outside"), std::string::npos) << range;
  EXPECT_EQ(HttpStatusOf(absl::OkStatus()), 200);
  EXPECT_EQ(HttpStatusOf(absl::InternalError("x")), 500);
  EXPECT_EQ(HttpStatusOf(Refuse(Refusal::kConflict, "x")), 409);
}

TEST(RegistrationTest, AShardedGroupMustFitTheStageWidth) {
  json body = Body();
  body["cache_sharded_groups"] = {{{"group_id", "history"}, {"owners", 4}}};  // stage TP is 2
  absl::Status status = ParseRegistration(body.dump()).status();
  EXPECT_EQ(HttpStatusOf(status), 400);
  EXPECT_NE(status.message().find("cache_sharded_groups"), std::string::npos) << status;
}

}  // namespace
}  // namespace kvrail::bootstrap
