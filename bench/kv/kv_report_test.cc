#include "bench/kv/kv_report.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

namespace kvrail::bench {
namespace {

KvSweepResult TwoRows() {
  KvSweepResult r;
  KvCaseResult base;
  base.shape = "contiguous";
  base.tokens = 4096;
  base.link = "tcp";
  base.mode = "contiguous";
  base.bytes = 1 << 29;
  base.copies = 1;
  base.coalesced_copies = 1;
  base.gbps = 4;
  base.efficiency = 1;
  base.first_byte_ms = 2;
  KvCaseResult model = base;
  model.shape = "llama3-8b";
  model.prefill_tp = 2;
  model.mode = "model";
  model.copies = 16384;
  model.coalesced_copies = 64;
  model.gbps = 3;
  model.efficiency = 0.75;
  model.first_byte_warm_ms = -1;  // never seen
  r.cases = {base, model};
  r.memcpy_gbps = 9.5;
  r.notes = {"netns: skipped: why"};
  return r;
}

TEST(KvReportTest, JsonHasTheIssuesKeysPerCase) {
  const nlohmann::json doc = nlohmann::json::parse(KvSweepToJson(TwoRows()));
  ASSERT_EQ(doc["cases"].size(), 2u);
  for (const char* key :
       {"shape", "prefill_tp", "decode_tp", "tokens", "link", "mode", "bytes", "copies",
        "coalesced_copies", "gbps", "p50_ms", "p99_ms", "first_byte_ms", "efficiency"}) {
    EXPECT_TRUE(doc["cases"][1].contains(key)) << key;
  }
  EXPECT_EQ(doc["cases"][1]["shape"], "llama3-8b");
  EXPECT_EQ(doc["cases"][1]["prefill_tp"], 2);
  EXPECT_EQ(doc["cases"][1]["copies"], 16384);
  EXPECT_DOUBLE_EQ(doc["cases"][1]["efficiency"].get<double>(), 0.75);
  EXPECT_TRUE(doc["cases"][1]["first_byte_warm_ms"].is_null());
  EXPECT_EQ(doc["notes"][0], "netns: skipped: why");
  EXPECT_DOUBLE_EQ(doc["memcpy_gbps"].get<double>(), 9.5);
}

TEST(KvReportTest, CsvHasAHeaderAndOneLinePerCase) {
  const std::string csv = KvSweepToCsv(TwoRows());
  ASSERT_EQ(csv.rfind("shape,prefill_tp,decode_tp,tokens,link,mode,bytes,copies,", 0), 0u) << csv;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3);
  EXPECT_NE(csv.find("\nllama3-8b,2,1,4096,tcp,model,536870912,16384,64,3"), std::string::npos)
      << csv;
  // The missing warm first byte is an empty cell.
  EXPECT_NE(csv.find(",2.0,,0.75,"), std::string::npos) << csv;
}

// --naive: a naive row beside the model's, whose gain over it is in the JSON and the table.
TEST(KvReportTest, TheNaiveRowAndTheGainOverItAreReported) {
  KvSweepResult r = TwoRows();
  KvCaseResult naive = r.cases[1];
  naive.mode = "naive";
  naive.coalesced_copies = naive.copies;
  naive.gbps = 0.5;
  r.cases[1].naive_gain = 6;
  r.cases.insert(r.cases.begin() + 1, naive);
  const nlohmann::json doc = nlohmann::json::parse(KvSweepToJson(r));
  ASSERT_EQ(doc["cases"].size(), 3u);
  EXPECT_EQ(doc["cases"][1]["mode"], "naive");
  EXPECT_EQ(doc["cases"][1]["coalesced_copies"], 16384);
  EXPECT_TRUE(doc["cases"][1]["naive_gain"].is_null());
  EXPECT_DOUBLE_EQ(doc["cases"][2]["naive_gain"].get<double>(), 6);
  EXPECT_TRUE(doc["cases"][0]["naive_gain"].is_null());
  const std::string table = KvSweepToTable(r);
  EXPECT_NE(table.find("x_naive"), std::string::npos) << table;
  EXPECT_NE(table.find(" 6.00      -      -\n"), std::string::npos) << table;
}

// The CPU seconds per GiB of each side's sidecars: in the JSON, and the table's last columns.
TEST(KvReportTest, EachSidesCpuSecondsPerGibAreReported) {
  KvSweepResult r = TwoRows();
  r.cases[1].prefill_cpu_s_per_gib = 1.25;
  r.cases[1].decode_cpu_s_per_gib = 0.5;
  const nlohmann::json doc = nlohmann::json::parse(KvSweepToJson(r));
  EXPECT_DOUBLE_EQ(doc["cases"][1]["prefill_cpu_s_per_gib"].get<double>(), 1.25);
  EXPECT_DOUBLE_EQ(doc["cases"][1]["decode_cpu_s_per_gib"].get<double>(), 0.5);
  EXPECT_TRUE(doc["cases"][0]["prefill_cpu_s_per_gib"].is_null());
  const std::string table = KvSweepToTable(r);
  EXPECT_NE(table.find("cpu_p  cpu_d\n"), std::string::npos) << table;
  EXPECT_NE(table.find("  1.25   0.50\n"), std::string::npos) << table;
}

// TwoRows and a layerwise row exposed 3 ms, its layer's share 2 ms, with `scale` shares of
// simulated compute per layer.
KvSweepResult WithLayerwiseRow(double scale) {
  KvSweepResult r = TwoRows();
  KvCaseResult layered = r.cases[1];
  layered.mode = "layerwise";
  layered.exposed_ms = 3;
  layered.layer_share_ms = 2;
  layered.layer_compute_scale = scale;
  layered.exposed_ratio = 1.5;
  r.cases.push_back(layered);
  return r;
}

// --layerwise: the exposed time, one layer's share and their ratio, against the 1.5 target.
TEST(KvReportTest, TheLayerwiseRowReportsItsExposedTimeAgainstTheTarget) {
  const KvSweepResult r = WithLayerwiseRow(1);
  const nlohmann::json doc = nlohmann::json::parse(KvSweepToJson(r));
  EXPECT_DOUBLE_EQ(doc["cases"][2]["exposed_ratio"].get<double>(), 1.5);
  EXPECT_TRUE(doc["cases"][1]["exposed_ms"].is_null());
  const std::string table = KvSweepToTable(r);
  EXPECT_NE(table.find("3.00 ms exposed after the last layer, one layer's share 2.00 ms"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("1.50x, target <= 1.5 met"), std::string::npos) << table;
}

// --layer-compute-scale other than 1: the compute per layer is shown, and the target, whose
// compute is one share, is not judged.
TEST(KvReportTest, ALayerwiseRowWithScaledComputeIsNotJudged) {
  const KvSweepResult r = WithLayerwiseRow(3);
  const nlohmann::json doc = nlohmann::json::parse(KvSweepToJson(r));
  EXPECT_DOUBLE_EQ(doc["cases"][2]["layer_compute_ms"].get<double>(), 6);
  const std::string table = KvSweepToTable(r);
  EXPECT_NE(table.find("one layer's share 2.00 ms, simulated compute per layer 6.00 ms"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("target <= 1.5 not judged"), std::string::npos) << table;
  EXPECT_EQ(table.find("MISSED"), std::string::npos) << table;
}

TEST(KvReportTest, TableShowsEveryCaseAndTheNotes) {
  const std::string table = KvSweepToTable(TwoRows());
  EXPECT_NE(table.find("llama3-8b"), std::string::npos) << table;
  EXPECT_NE(table.find("contiguous"), std::string::npos) << table;
  EXPECT_NE(table.find("512.0 MiB"), std::string::npos) << table;
  EXPECT_NE(table.find("note: netns: skipped: why"), std::string::npos) << table;
}

}  // namespace
}  // namespace kvrail::bench
