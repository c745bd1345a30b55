#include "bench/raw/raw_report.h"

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace kvrail::bench {
namespace {

std::vector<RawRow> TwoRows() {
  RawRow a;
  a.link = "tcp";
  a.block_bytes = 65536;
  a.batch = 32;
  a.gbps = 1.5;
  a.ops_per_s = 1.5e9 / 65536;
  a.peer_gbps = 1.2;
  a.peer_outstanding = 32;
  a.memcpy_gbps = 9.5;
  a.memcpy_threads = 2;
  a.lanes = 2;
  a.peer_tuned_gbps = 1.0;
  a.one_lane_gbps = 1.1;
  RawRow b = a;
  b.link = "shm";
  b.one_block_gbps = 2.4;
  a.one_block_gbps.reset();
  b.peer_gbps.reset();
  b.note = "ucx_perftest printed no figure";
  return {a, b};
}

TEST(RowsToJson, HasTheIssueShapeWithNullForMissingFigures) {
  const nlohmann::json json = nlohmann::json::parse(RowsToJson(TwoRows()));
  ASSERT_TRUE(json.is_object());
  ASSERT_EQ(json.size(), 1u);
  ASSERT_EQ(json["rows"].size(), 2u);
  for (const char* key :
       {"link", "block_bytes", "batch", "gbps", "ops_per_s", "peer_gbps", "ratio"}) {
    EXPECT_TRUE(json["rows"][0].contains(key)) << key;
  }
  EXPECT_EQ(json["rows"][0]["link"], "tcp");
  EXPECT_EQ(json["rows"][0]["block_bytes"], 65536);
  EXPECT_DOUBLE_EQ(json["rows"][0]["ratio"].get<double>(), 1.25);
  EXPECT_TRUE(json["rows"][1]["peer_gbps"].is_null());
  EXPECT_TRUE(json["rows"][1]["ratio"].is_null());
  EXPECT_TRUE(json["rows"][0]["one_block_gbps"].is_null());
  EXPECT_DOUBLE_EQ(json["rows"][1]["one_block_gbps"].get<double>(), 2.4);
  EXPECT_TRUE(json["rows"][1]["one_block_ratio"].is_null());  // no ucx_perftest figure
}

TEST(RawRow, OneBlockRatioIsAgainstUcxPerftest) {
  RawRow row = TwoRows()[0];
  EXPECT_FALSE(row.one_block_ratio().has_value());
  row.one_block_gbps = 1.8;
  EXPECT_DOUBLE_EQ(*row.one_block_ratio(), 1.5);
}

TEST(RawRow, LikeRatioIsOneLaneAgainstUcxPerftestWithKvrailsSettings) {
  RawRow tcp = TwoRows()[0];
  EXPECT_DOUBLE_EQ(*tcp.like_ratio(), 1.1);  // / peer_tuned_gbps, not / peer_gbps
  tcp.peer_tuned_gbps.reset();
  EXPECT_FALSE(tcp.like_ratio().has_value());
  RawRow shm = TwoRows()[0];
  shm.link = "shm";  // kvrail's settings are tcp's: ucx_perftest at its defaults is alike
  shm.peer_tuned_gbps.reset();
  EXPECT_DOUBLE_EQ(*shm.like_ratio(), 1.1 / 1.2);
  shm.one_lane_gbps.reset();
  EXPECT_FALSE(shm.like_ratio().has_value());
}

TEST(RowsToJson, CarriesTheLikeForLikeFiguresAndTheCopyLimitsThreads) {
  const nlohmann::json json = nlohmann::json::parse(RowsToJson(TwoRows()));
  const nlohmann::json& row = json["rows"][0];
  EXPECT_DOUBLE_EQ(row["one_lane_gbps"].get<double>(), 1.1);
  EXPECT_DOUBLE_EQ(row["like_ratio"].get<double>(), 1.1);
  EXPECT_EQ(row["memcpy_threads"], 2);
  EXPECT_TRUE(json["rows"][1]["like_ratio"].is_null());  // shm without a ucx_perftest figure
}

TEST(RowsFromJson, ReadsBackWhatRowsToJsonWrote) {
  auto rows = RowsFromJson(RowsToJson(TwoRows()));
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].link, "tcp");
  EXPECT_DOUBLE_EQ(*(*rows)[0].peer_gbps, 1.2);
  EXPECT_FALSE((*rows)[1].peer_gbps.has_value());
  EXPECT_FALSE((*rows)[0].one_block_gbps.has_value());
  EXPECT_DOUBLE_EQ(*(*rows)[1].one_block_gbps, 2.4);
  EXPECT_EQ((*rows)[1].note, "ucx_perftest printed no figure");
  EXPECT_DOUBLE_EQ(*(*rows)[0].one_lane_gbps, 1.1);
  EXPECT_EQ((*rows)[0].memcpy_threads, 2);
}

TEST(RowsFromJson, RejectsOtherShapes) {
  EXPECT_FALSE(RowsFromJson("[]").ok());
  EXPECT_FALSE(RowsFromJson("{\"rows\": [{\"link\": 1}]}").ok());
  EXPECT_FALSE(RowsFromJson("not json").ok());
}

TEST(RowsToTable, PrintsOneLinePerRowAndTheNotes) {
  const std::string table = RowsToTable(TwoRows());
  EXPECT_NE(table.find("64 KiB"), std::string::npos);
  EXPECT_NE(table.find("1.25"), std::string::npos);
  EXPECT_NE(table.find("[1] ucx_perftest printed no figure"), std::string::npos);
  EXPECT_NE(table.find("2^20"), std::string::npos);
  EXPECT_NE(table.find("1lane GB/s"), std::string::npos);
  EXPECT_NE(table.find("like"), std::string::npos);
}

// A verbs row measured through `provider`, with figures a bandwidth row would show.
RawRow VerbsRow(const std::string& provider) {
  RawRow row = TwoRows()[0];
  row.peer_gbps.reset();
  row.peer_tuned_gbps.reset();
  row.peer_outstanding = 0;
  row.gbps = 7.654;
  row.ops_per_s = 7.654e9 / 65536;
  row.one_lane_gbps = 3.21;
  MarkVerbsRow(row, provider);
  return row;
}

TEST(MarkVerbsRow, SoftverbsMakesNoBandwidthClaim) {
  const RawRow soft = VerbsRow("softverbs");
  EXPECT_EQ(soft.link, "verbs");
  EXPECT_EQ(soft.provider, "softverbs");
  EXPECT_EQ(soft.label(), "verbs(softverbs)");
  EXPECT_FALSE(soft.bandwidth_claim);
  EXPECT_EQ(soft.note, kSoftverbsNote);
  RawRow with_peer = soft;  // even a figure beside it makes no ratio
  with_peer.peer_gbps = 1.0;
  with_peer.peer_tuned_gbps = 1.0;
  with_peer.one_block_gbps = 1.0;
  EXPECT_FALSE(with_peer.ratio().has_value());
  EXPECT_FALSE(with_peer.tuned_ratio().has_value());
  EXPECT_FALSE(with_peer.like_ratio().has_value());
  EXPECT_FALSE(with_peer.one_block_ratio().has_value());

  const RawRow hard = VerbsRow("libibverbs");
  EXPECT_EQ(hard.label(), "verbs(libibverbs)");
  EXPECT_TRUE(hard.bandwidth_claim);
  EXPECT_EQ(hard.note, kVerbsNoBaselineNote);
  EXPECT_EQ(TwoRows()[0].label(), "tcp");
}

TEST(RowsToTable, SoftverbsRowHasTheNoteAndNoBandwidthFigure) {
  std::vector<RawRow> rows = TwoRows();
  rows.push_back(VerbsRow("softverbs"));
  const std::string table = RowsToTable(rows);
  // The row: named with its provider, n/a where kvrail's rates would be, its note's mark.
  const size_t at = table.find("\nverbs(softverbs) ");
  ASSERT_NE(at, std::string::npos) << table;
  const std::string line = table.substr(at + 1, table.find('\n', at + 1) - at - 1);
  EXPECT_NE(line.find("64 KiB"), std::string::npos) << line;
  EXPECT_NE(line.find("n/a"), std::string::npos) << line;
  EXPECT_EQ(line.find("7.654"), std::string::npos) << line;  // kvrail GB/s withheld
  EXPECT_EQ(line.find("3.210"), std::string::npos) << line;  // 1lane GB/s withheld
  EXPECT_NE(line.find(" [2]"), std::string::npos) << line;   // after the shm row's note
  EXPECT_NE(table.find(absl::StrCat("[2] ", kSoftverbsNote)), std::string::npos) << table;
  EXPECT_NE(table.find("not a bandwidth figure"), std::string::npos);
  // The other rows keep their figures, aligned under the wider link column.
  EXPECT_NE(table.find("\ntcp                64 KiB"), std::string::npos) << table;
  EXPECT_NE(table.find("1.500"), std::string::npos);
}

TEST(RowsToTable, LibibverbsRowIsAFigureWithTheNoBaselineNote) {
  const std::string table = RowsToTable({VerbsRow("libibverbs")});
  EXPECT_NE(table.find("verbs(libibverbs)"), std::string::npos) << table;
  EXPECT_NE(table.find("7.654"), std::string::npos) << table;
  EXPECT_EQ(table.find("n/a"), std::string::npos) << table;
  EXPECT_NE(table.find(absl::StrCat("[1] ", kVerbsNoBaselineNote)), std::string::npos) << table;
}

TEST(RowsToTable, UcxRowsKeepTheirLayout) {
  const std::string table = RowsToTable(TwoRows());
  EXPECT_EQ(table.rfind("link     block  batch", 0), 0u) << table;
  EXPECT_EQ(table.find("verbs"), std::string::npos);
}

TEST(RowsToJson, SoftverbsRowCarriesItsProviderAndNoBandwidthClaim) {
  const nlohmann::json json =
      nlohmann::json::parse(RowsToJson({TwoRows()[0], VerbsRow("softverbs")}));
  const nlohmann::json& tcp = json["rows"][0];
  EXPECT_TRUE(tcp["provider"].is_null());
  EXPECT_EQ(tcp["bandwidth_claim"], true);
  const nlohmann::json& soft = json["rows"][1];
  EXPECT_EQ(soft["link"], "verbs");
  EXPECT_EQ(soft["provider"], "softverbs");
  EXPECT_EQ(soft["bandwidth_claim"], false);
  EXPECT_TRUE(soft["gbps"].is_null());
  EXPECT_TRUE(soft["ops_per_s"].is_null());
  EXPECT_TRUE(soft["one_lane_gbps"].is_null());
  EXPECT_TRUE(soft["ratio"].is_null());
  EXPECT_TRUE(soft["peer_gbps"].is_null());
  EXPECT_EQ(soft["note"], kSoftverbsNote);

  auto back = RowsFromJson(json.dump());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)[0].provider, "");
  EXPECT_TRUE((*back)[0].bandwidth_claim);
  EXPECT_EQ((*back)[1].label(), "verbs(softverbs)");
  EXPECT_FALSE((*back)[1].bandwidth_claim);
  EXPECT_EQ((*back)[1].gbps, 0);
  EXPECT_EQ((*back)[1].note, kSoftverbsNote);

  const nlohmann::json hard = nlohmann::json::parse(RowsToJson({VerbsRow("libibverbs")}));
  EXPECT_EQ(hard["rows"][0]["provider"], "libibverbs");
  EXPECT_EQ(hard["rows"][0]["bandwidth_claim"], true);
  EXPECT_DOUBLE_EQ(hard["rows"][0]["gbps"].get<double>(), 7.654);
}

TEST(RowsFromJson, RefusesAMissingFigureOnARowThatClaimsBandwidth) {
  EXPECT_FALSE(RowsFromJson("{\"rows\": [{\"link\": \"tcp\", \"block_bytes\": 1, "
                            "\"batch\": 1, \"gbps\": null, \"ops_per_s\": 1}]}")
                   .ok());
}

}  // namespace
}  // namespace kvrail::bench
