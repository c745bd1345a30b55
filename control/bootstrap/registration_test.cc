#include "control/bootstrap/registration.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "control/bootstrap/refusal.h"
#include "control/layout/revision.h"
#include "control/plan/prefill_description.h"
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
  absl::StatusOr<std::string> body = SerializeRegistration(parsed.registration);
  ASSERT_TRUE(body.ok()) << body.status();
  absl::StatusOr<ParsedRegistration> again = ParseRegistration(*body);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->registration.endpoint, parsed.registration.endpoint);
  EXPECT_EQ(again->registration.engine_rank, 3);
  ASSERT_TRUE(again->registration.pipeline.has_value());
  EXPECT_EQ(again->registration.pipeline->fields_by_stage,
            parsed.registration.pipeline->fields_by_stage);
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

// An older kvrail prefill still sends its former sharding declaration beside the contract;
// like any member the reference does not read, it is ignored, whatever it holds (the
// contract's shard_count declares sharding, CACHEPD §12.8).
TEST(RegistrationTest, AnOlderKvrailPrefillsShardingDeclarationIsIgnored) {
  for (const json& declaration :
       {json::array({{{"group_id", "history"}, {"owners", 4}}}), json("not a list")}) {
    SCOPED_TRACE(declaration.dump());
    json body = Body();
    body["cache_sharded_groups"] = declaration;
    absl::StatusOr<ParsedRegistration> parsed = ParseRegistration(body.dump());
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->canonical_layout, ReferenceLayout());
    absl::StatusOr<std::string> written = SerializeRegistration(parsed->registration);
    ASSERT_TRUE(written.ok()) << written.status();
    EXPECT_EQ(*written, *SerializeRegistration(ParseRegistration(Body().dump())->registration));
  }
}

// The contract the newer reference's bootstrap scenarios register: 2026-09's form (§12.1).
std::string Layout2026() {
  static const std::string* const layout = new std::string(
      kvrail::testing::LoadVectors("r2/bootstrap_r2.json")["contract_used"].get<std::string>());
  return *layout;
}

// The same contract in the snapshot's form.
std::string SnapshotFormOf(const std::string& wire) {
  absl::StatusOr<layout::Contract> contract = layout::ParseContract(wire);
  EXPECT_TRUE(contract.ok()) << contract.status();
  absl::StatusOr<std::string> snapshot =
      layout::SerializeContract(*contract, layout::Revision::kSnapshot);
  EXPECT_TRUE(snapshot.ok()) << snapshot.status();
  return *snapshot;
}

// A stage placement as JSON: a list of lists (a braced list of pairs would be an object).
json Stages(std::vector<std::vector<std::string>> stages) { return json(std::move(stages)); }

// A 2026-09 registration (§12.3) of a two-stage node.
json Body2026() {
  return {{"role", "Prefill"},
          {"world_size", 2},
          {"dp_size", 1},
          {"pp_size", 2},
          {"cache_fields_by_stage",
           Stages({{"layer.0.k", "layer.0.latent"}, {"layer.1.k", "layer.1.latent"}})},
          {"rank_ip", "10.2.0.0"},
          {"rank_port", 18000},
          {"engine_rank", 0},
          {"cache_layout", Layout2026()}};
}

TEST(RegistrationTest, A2026BodyIsReadInThe2026Form) {
  absl::StatusOr<ParsedRegistration> parsed = ParseRegistration(Body2026().dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->registration.contract.revision, layout::Revision::k2026_09);
  ASSERT_TRUE(parsed->registration.pipeline.has_value());
  EXPECT_EQ(parsed->registration.PpSize(), 2);
  EXPECT_EQ(parsed->canonical_layout, Layout2026());
  EXPECT_EQ(parsed->comparable_layout, Layout2026());
}

TEST(RegistrationTest, OneContractInEitherFormHasOneComparableLayout) {
  json snapshot = Body2026();
  snapshot["cache_layout"] = SnapshotFormOf(Layout2026());
  absl::StatusOr<ParsedRegistration> a = ParseRegistration(snapshot.dump());
  absl::StatusOr<ParsedRegistration> b = ParseRegistration(Body2026().dump());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->registration.contract.revision, layout::Revision::kSnapshot);
  EXPECT_NE(a->canonical_layout, b->canonical_layout);
  EXPECT_EQ(a->comparable_layout, b->comparable_layout);
  EXPECT_EQ(*CanonicalLayout(SnapshotFormOf(Layout2026())), *CanonicalLayout(Layout2026()));
}

TEST(RegistrationTest, SerializesEachFormWithItsMembersInTheReferenceOrder) {
  ParsedRegistration parsed = *ParseRegistration(Body2026().dump());
  absl::StatusOr<std::string> body = SerializeRegistration(parsed.registration);
  ASSERT_TRUE(body.ok()) << body.status();
  std::vector<std::string> keys;
  const nlohmann::ordered_json written = nlohmann::ordered_json::parse(*body);
  for (const auto& [key, value] : written.items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"role", "world_size", "dp_size", "pp_size",
                                            "cache_fields_by_stage", "rank_ip", "rank_port",
                                            "engine_rank", "cache_layout"}));
  EXPECT_EQ(json::parse(*body)["cache_layout"], Layout2026());

  // Without a placement the 2026-09 form still says one stage holding every field (§12.11).
  PrefillRegistration single = parsed.registration;
  single.pipeline.reset();
  single.world_size = 1;
  const json one = json::parse(*SerializeRegistration(single));
  EXPECT_EQ(one["pp_size"], 1);
  EXPECT_EQ(one["cache_fields_by_stage"],
            json::array({{"layer.0.k", "layer.1.k", "layer.0.latent", "layer.1.latent"}}));

  // The snapshot form: today's body, the contract in the snapshot's form.
  single.contract.revision = layout::Revision::kSnapshot;
  const nlohmann::ordered_json snapshot =
      nlohmann::ordered_json::parse(*SerializeRegistration(single));
  EXPECT_FALSE(snapshot.contains("pp_size"));
  EXPECT_FALSE(snapshot.contains("cache_fields_by_stage"));
  EXPECT_EQ(snapshot["cache_layout"], SnapshotFormOf(Layout2026()));
  EXPECT_EQ(snapshot.begin().key(), "role");
}

TEST(RegistrationTest, TheSnapshotFormCannotCarryAShardedGroup) {
  ParsedRegistration parsed = *ParseRegistration(Body2026().dump());
  parsed.registration.contract.group_specs[0].shard_count = 2;
  parsed.registration.contract.revision = layout::Revision::kSnapshot;
  absl::Status status = SerializeRegistration(parsed.registration).status();
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("shard_count"), absl::string_view::npos) << status;
}

// Every refusal of §12.3 steps 3 to 5, in the reference's words, and nothing else read.
TEST(RegistrationTest, EveryStagePlacementRuleRefusesWithTheReferencesWords) {
  auto with = [](const char* member, json value) {
    json body = Body2026();
    body[member] = std::move(value);
    return body;
  };
  auto without = [](const char* member) {
    json body = Body2026();
    body.erase(member);
    return body;
  };
  struct Case {
    const char* name;
    json body;
    int http_status;
    const char* says;
  };
  const Case cases[] = {
      {"2026 contract without placement", without("cache_fields_by_stage"), 500,
       "cache_fields_by_stage: is missing"},
      {"placement null", with("cache_fields_by_stage", nullptr), 500,
       "CachePD requires explicit stage field placement"},
      {"placement not a list", with("cache_fields_by_stage", "layer.0.k"), 500,
       "CachePD requires explicit stage field placement"},
      {"a stage not a list",
       with("cache_fields_by_stage", {"layer.0.k", {"layer.1.k", "layer.1.latent"}}), 500,
       "CachePD requires explicit stage field placement"},
      {"no stage", with("cache_fields_by_stage", json::array()), 500,
       "cache stage placement must cover every logical field exactly once"},
      {"an id not a string",
       with("cache_fields_by_stage", json::array({json::array({"layer.0.k", 7})})), 500,
       "cache stage placement must cover every logical field exactly once"},
      {"a field twice",
       with("cache_fields_by_stage", Stages({{"layer.0.k", "layer.0.latent"},
                                             {"layer.1.k", "layer.1.latent", "layer.0.k"}})),
       500, "'layer.0.k' appears twice"},
      {"an unknown field",
       with("cache_fields_by_stage", Stages({{"layer.0.k", "layer.0.latent"},
                                             {"layer.1.k", "layer.1.latent", "layer.9.k"}})),
       500, "'layer.9.k'"},
      {"a field nowhere",
       with("cache_fields_by_stage", Stages({{"layer.0.k", "layer.0.latent"}, {}})), 500,
       "'layer.1.k' is in no stage"},
      {"pp_size missing", without("pp_size"), 500, "pp_size: is missing"},
      {"pp_size null", with("pp_size", nullptr), 500, "pp_size: int() cannot read null"},
      {"pp_size text", with("pp_size", "two"), 500, "pp_size: int() cannot read"},
      {"pp_size other than the stages", with("pp_size", 3), 500,
       "CachePD placement does not match pipeline stage count"},
      {"pp_size a float", with("pp_size", 2.0), 400, "pp_size: must be an integer"},
      {"pp_size a bool", with("pp_size", true), 400, "pp_size: must be an integer"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::Status status = ParseRegistration(c.body.dump()).status();
    EXPECT_EQ(HttpStatusOf(status), c.http_status) << status;
    EXPECT_NE(status.message().find(c.says), absl::string_view::npos) << status;
    EXPECT_EQ(status.message().find('\n'), absl::string_view::npos) << status;
  }
}

TEST(RegistrationTest, PpSizeIsReadAsPythonIntReadsAString) {
  absl::StatusOr<ParsedRegistration> parsed = ParseRegistration([] {
    json body = Body2026();
    body["pp_size"] = " 2 ";
    return body;
  }()
                                                                    .dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->registration.PpSize(), 2);
}

TEST(RegistrationTest, AnEmptyStageIsAcceptedHereAndRefusedByThePlanner) {
  json body = Body2026();
  body["cache_fields_by_stage"] = {{"layer.0.k", "layer.1.k", "layer.0.latent", "layer.1.latent"},
                                   json::array()};
  absl::StatusOr<ParsedRegistration> parsed = ParseRegistration(body.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->registration.pipeline->fields_by_stage[1].empty());
}

TEST(RegistrationTest, ASnapshotFormContractMayCarryAKvrailSnapshotEraPlacement) {
  // kvrail's snapshot-era prefills sent both members when pp_size > 1; they are read by the
  // same rules (§12.3), and the registration stays in the snapshot form.
  json body = Body2026();
  body["cache_layout"] = SnapshotFormOf(Layout2026());
  absl::StatusOr<ParsedRegistration> parsed = ParseRegistration(body.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->registration.contract.revision, layout::Revision::kSnapshot);
  EXPECT_EQ(parsed->registration.PpSize(), 2);
  body["pp_size"] = 3;
  EXPECT_EQ(HttpStatusOf(ParseRegistration(body.dump()).status()), 500);
  body.erase("cache_fields_by_stage");
  body.erase("pp_size");
  EXPECT_TRUE(ParseRegistration(body.dump()).ok());  // a snapshot-era body: as today
}

TEST(RegistrationTest, PinnedTo2026SnapshotEraRegistrationsAreRefusedNamingTheMismatch) {
  const auto pinned = layout::Revision::k2026_09;
  json snapshot_contract = Body2026();
  snapshot_contract["cache_layout"] = SnapshotFormOf(Layout2026());
  json snapshot_body = Body();  // no placement, snapshot-form contract
  for (const json& body : {snapshot_contract, snapshot_body}) {
    absl::Status status = ParseRegistration(body.dump(), pinned).status();
    EXPECT_EQ(HttpStatusOf(status), 500) << status;
    EXPECT_NE(status.message().find("revision mismatch"), absl::string_view::npos) << status;
  }
  EXPECT_TRUE(ParseRegistration(Body2026().dump(), pinned).ok());
}

TEST(RegistrationTest, PinnedToTheSnapshot2026ContractsAndStagesAreRefused) {
  const auto pinned = layout::Revision::kSnapshot;
  absl::Status status = ParseRegistration(Body2026().dump(), pinned).status();
  EXPECT_EQ(HttpStatusOf(status), 500) << status;
  EXPECT_NE(status.message().find("revision mismatch"), absl::string_view::npos) << status;
  json staged = Body2026();
  staged["cache_layout"] = SnapshotFormOf(Layout2026());
  status = ParseRegistration(staged.dump(), pinned).status();
  EXPECT_EQ(HttpStatusOf(status), 400) << status;
  EXPECT_NE(status.message().find("pinned to CachePD revision snapshot"), absl::string_view::npos)
      << status;
  EXPECT_TRUE(ParseRegistration(Body().dump(), pinned).ok());
}

}  // namespace
}  // namespace kvrail::bootstrap
