#include "bench/kv/kv_flags.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace kvrail::bench {
namespace {

TEST(KvFlagsTest, QuickIsTheIssuesSubset) {
  KvFlagText text;
  text.quick = true;
  const KvBenchOptions o = ParseKvFlags(text).value();
  EXPECT_EQ(o.presets, std::vector<std::string>{"llama3-8b"});
  EXPECT_EQ(o.tp_pairs, (std::vector<TpPair>{{1, 1}, {2, 1}}));
  EXPECT_EQ(o.tokens, std::vector<int64_t>{4096});
  EXPECT_EQ(o.links, (std::vector<std::string>{"tcp", "shm"}));
  EXPECT_EQ(o.rooms, 6);
}

TEST(KvFlagsTest, FullAddsTp8AndNetns) {
  KvFlagText text;
  text.full = true;
  const KvBenchOptions o = ParseKvFlags(text).value();
  EXPECT_EQ(o.tp_pairs.size(), 7u);
  EXPECT_EQ(o.tp_pairs.back(), (TpPair{2, 8}));
  EXPECT_EQ(o.links.back(), "netns");
  EXPECT_EQ(o.presets.size(), 4u);
}

TEST(KvFlagsTest, ListsOverrideTheSweep) {
  KvFlagText text;
  text.quick = true;
  text.presets = "deepseek-v3-mla";
  text.tp = "1:1, 4:2";
  text.tokens = "1k,32768";
  text.links = "tcp";
  text.rooms = 2;
  const KvBenchOptions o = ParseKvFlags(text).value();
  EXPECT_EQ(o.presets, std::vector<std::string>{"deepseek-v3-mla"});
  EXPECT_EQ(o.tp_pairs, (std::vector<TpPair>{{1, 1}, {4, 2}}));
  EXPECT_EQ(o.tokens, (std::vector<int64_t>{1024, 32768}));
  EXPECT_EQ(o.links, std::vector<std::string>{"tcp"});
  EXPECT_EQ(o.rooms, 2);
  EXPECT_FALSE(o.naive);
  text.naive = true;
  EXPECT_TRUE(ParseKvFlags(text).value().naive);
  EXPECT_FALSE(o.compare);
  text.compare = true;
  EXPECT_TRUE(ParseKvFlags(text).value().compare);
  EXPECT_FALSE(ParseKvFlags(text).value().streaming_stores);
  text.streaming_stores = true;
  EXPECT_TRUE(ParseKvFlags(text).value().streaming_stores);
  EXPECT_FALSE(ParseKvFlags(text).value().digest);
  text.digest = true;
  EXPECT_TRUE(ParseKvFlags(text).value().digest);
  text.unpopulated = true;
  EXPECT_TRUE(ParseKvFlags(text).value().unpopulated);
  text.layerwise = true;
  EXPECT_TRUE(ParseKvFlags(text).value().layerwise);
  EXPECT_EQ(ParseKvFlags(text).value().layer_compute_scale, 1);
  text.layer_compute_scale = 3;
  EXPECT_EQ(ParseKvFlags(text).value().layer_compute_scale, 3);
}

// Each refusal names the flag and the rule, in one line.
void ExpectRefused(const KvFlagText& text, const std::string& words) {
  const absl::Status status = ParseKvFlags(text).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << words;
  EXPECT_NE(status.message().find(words), std::string::npos) << status;
  EXPECT_EQ(std::string(status.message()).find('\n'), std::string::npos) << status;
}

TEST(KvFlagsTest, BadValuesAreRefusedNamingTheFlag) {
  KvFlagText text;
  text.tp = "2-1";
  ExpectRefused(text, "--tp: \"2-1\": expected <prefill TP>:<decode TP>");
  text.tp = "16:1";
  ExpectRefused(text, "each 1 to 8");
  text = {};
  text.tokens = "4m";
  ExpectRefused(text, "--tokens: \"4m\"");
  text.tokens = "8";
  ExpectRefused(text, "16 to 131072 tokens");
  text = {};
  text.links = "rdma";
  ExpectRefused(text, "--link: \"rdma\": expected tcp, shm or netns");
  text = {};
  text.presets = "llama3-8b,gpt";
  ExpectRefused(text, "--presets: \"gpt\"");
  text = {};
  text.rooms = -1;
  ExpectRefused(text, "--rooms: between 1 and 1000");
  text = {};
  text.sample_every = 0;
  ExpectRefused(text, "--sample-every");
  text = {};
  text.quick = text.full = true;
  ExpectRefused(text, "--quick and --full");
  text = {};
  text.layerwise = true;
  text.layer_compute_scale = 0.1;
  ExpectRefused(text, "--layer-compute-scale: 0.1: the simulated compute per layer is 0.25 to 16");
  text.layer_compute_scale = std::nan("");
  ExpectRefused(text, "--layer-compute-scale: nan");
  text.layer_compute_scale = 2;
  text.layerwise = false;
  ExpectRefused(text, "--layer-compute-scale: it scales the --layerwise rooms' compute");
}

}  // namespace
}  // namespace kvrail::bench
