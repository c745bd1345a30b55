#include "bench/raw/raw_flags.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace kvrail::bench {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = kKiB * 1024;

TEST(ParseByteSize, AcceptsBinarySuffixesAndPlainBytes) {
  EXPECT_EQ(*ParseByteSize("--x", "4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("--x", "512B"), 512u);
  EXPECT_EQ(*ParseByteSize("--x", "64KiB"), 64 * kKiB);
  EXPECT_EQ(*ParseByteSize("--x", "1MiB"), kMiB);
  EXPECT_EQ(*ParseByteSize("--x", "2GiB"), 2048 * kMiB);
}

TEST(ParseByteSize, RejectsDecimalAndUnknownSuffixesNamingTheFlag) {
  for (const char* text : {"64KB", "1M", "64k", "1mib", "KiB", "", "-4KiB", "1.5MiB", "4 KiB"}) {
    auto size = ParseByteSize("--block-sizes", text);
    ASSERT_FALSE(size.ok()) << text;
    EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(size.status().message(), "--block-sizes")) << size.status();
  }
}

TEST(ParseByteSize, RejectsZeroAndOverflow) {
  EXPECT_FALSE(ParseByteSize("--x", "0").ok());
  EXPECT_FALSE(ParseByteSize("--x", "0KiB").ok());
  EXPECT_FALSE(ParseByteSize("--x", "99999999999999999999").ok());
  EXPECT_FALSE(ParseByteSize("--x", "17179869184GiB").ok());
}

TEST(ParseBlockSizes, ParsesAListKeepingOrderAndDroppingDuplicates) {
  auto sizes = ParseBlockSizes("--block-sizes", "64KiB,1MiB,65536, 64MiB");
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  EXPECT_EQ(*sizes, (std::vector<uint64_t>{64 * kKiB, kMiB, 64 * kMiB}));
}

TEST(ParseBlockSizes, RejectsBlocksOver64MiBWithTheRule) {
  auto sizes = ParseBlockSizes("--block-sizes", "4KiB,128MiB");
  ASSERT_FALSE(sizes.ok());
  EXPECT_TRUE(absl::StrContains(sizes.status().message(), "128MiB"));
  EXPECT_TRUE(absl::StrContains(sizes.status().message(), "between 1 B and 64 MiB"));
}

TEST(ParseBlockSizes, RejectsEmptyEntries) {
  EXPECT_FALSE(ParseBlockSizes("--block-sizes", "").ok());
  EXPECT_FALSE(ParseBlockSizes("--block-sizes", "4KiB,,1MiB").ok());
  EXPECT_FALSE(ParseBlockSizes("--block-sizes", "4KiB,").ok());
}

TEST(ParseBatchSizes, AcceptsOneTo1024) {
  auto batches = ParseBatchSizes("--batch-sizes", "1,16,1024,16");
  ASSERT_TRUE(batches.ok()) << batches.status();
  EXPECT_EQ(*batches, (std::vector<int>{1, 16, 1024}));
  for (const char* text : {"0", "1025", "-1", "+4", "x", "1.5", "4KiB"}) {
    auto bad = ParseBatchSizes("--batch-sizes", text);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_TRUE(absl::StrContains(bad.status().message(), "between 1 and 1024"));
  }
}

TEST(ParseLinks, AcceptsRepeatsAndCommaLists) {
  auto links = ParseLinks("--link", {"tcp,shm", "netns", "tcp"});
  ASSERT_TRUE(links.ok()) << links.status();
  EXPECT_EQ(*links, (std::vector<RawLink>{RawLink::kTcp, RawLink::kShm, RawLink::kNetns}));
}

TEST(ParseLinks, AcceptsVerbs) {
  auto links = ParseLinks("--link", {"verbs"});
  ASSERT_TRUE(links.ok()) << links.status();
  EXPECT_EQ(*links, (std::vector<RawLink>{RawLink::kVerbs}));
  links = ParseLinks("--link", {"shm, verbs", "verbs,tcp"});
  ASSERT_TRUE(links.ok()) << links.status();
  EXPECT_EQ(*links, (std::vector<RawLink>{RawLink::kShm, RawLink::kVerbs, RawLink::kTcp}));
  EXPECT_STREQ(RawLinkName(RawLink::kVerbs), "verbs");
}

TEST(ParseLinks, RejectsUnknownNames) {
  auto links = ParseLinks("--link", {"tcp,rdma"});
  ASSERT_FALSE(links.ok());
  EXPECT_TRUE(absl::StrContains(links.status().message(), "\"rdma\""));
  EXPECT_TRUE(absl::StrContains(links.status().message(), "tcp, shm, netns or verbs"));
  // Names are exact: the provider is not part of the link's name.
  EXPECT_FALSE(ParseLinks("--link", {"Verbs"}).ok());
  EXPECT_FALSE(ParseLinks("--link", {"verbs(softverbs)"}).ok());
  EXPECT_FALSE(ParseLinks("--link", {}).ok());
}

TEST(FormatBytes, UsesTheLargestExactBinaryUnit) {
  EXPECT_EQ(FormatBytes(4096), "4 KiB");
  EXPECT_EQ(FormatBytes(64 * kMiB), "64 MiB");
  EXPECT_EQ(FormatBytes(1536), "1536 B");
  EXPECT_EQ(FormatBytes(3 * kMiB / 2), "1536 KiB");
}

}  // namespace
}  // namespace kvrail::bench
