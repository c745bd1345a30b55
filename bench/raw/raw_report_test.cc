#include "bench/raw/raw_report.h"

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvrail::bench {
namespace {

std::vector<RawRow> TwoRows() {
  RawRow a;
  a.transport = "tcp";
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
  b.transport = "shm";
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
       {"transport", "block_bytes", "batch", "gbps", "ops_per_s", "peer_gbps", "ratio"}) {
    EXPECT_TRUE(json["rows"][0].contains(key)) << key;
  }
  EXPECT_EQ(json["rows"][0]["transport"], "tcp");
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
  shm.transport = "shm";  // kvrail's settings are tcp's: ucx_perftest at its defaults is alike
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
  EXPECT_EQ((*rows)[0].transport, "tcp");
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
  EXPECT_FALSE(RowsFromJson("{\"rows\": [{\"transport\": 1}]}").ok());
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

}  // namespace
}  // namespace kvrail::bench
