// The two-process transfer between two network namespaces joined by a veth pair: two hosts on
// one machine, UCX tcp over the veth (MACHINE-NOTES). The test creates the namespaces and the
// link and removes them afterwards. Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN); it fails,
// never skips, without it, because CI runs it as root.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/transfer/harness.h"

namespace kvrail::testing {
namespace {

// Runs a shell command; its exit status.
int Sh(const std::string& command) {
  const int rc = std::system((command + " 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

// Two namespaces A and B, veth ends "kva<pid>" in A (10.233.<n>.1) and "kvb<pid>" in B
// (10.233.<n>.2), removed by the destructor whatever happened.
class VethPair {
 public:
  VethPair() {
    const int n = static_cast<int>(getpid() % 200) + 20;
    a_ = absl::StrCat("kvrail-a-", getpid());
    b_ = absl::StrCat("kvrail-b-", getpid());
    // Made in this namespace before they move: named after the pid, as other tests beside this
    // one make theirs.
    veth_a_ = absl::StrCat("kva", getpid());
    veth_b_ = absl::StrCat("kvb", getpid());
    address_a_ = absl::StrCat("10.233.", n, ".1");
    address_b_ = absl::StrCat("10.233.", n, ".2");
    const std::vector<std::string> steps = {
        absl::StrCat("ip netns add ", a_),
        absl::StrCat("ip netns add ", b_),
        absl::StrCat("ip link add ", veth_a_, " type veth peer name ", veth_b_),
        absl::StrCat("ip link set ", veth_a_, " netns ", a_),
        absl::StrCat("ip link set ", veth_b_, " netns ", b_),
        absl::StrCat("ip -n ", a_, " addr add ", address_a_, "/24 dev ", veth_a_),
        absl::StrCat("ip -n ", b_, " addr add ", address_b_, "/24 dev ", veth_b_),
        absl::StrCat("ip -n ", a_, " link set ", veth_a_, " up"),
        absl::StrCat("ip -n ", b_, " link set ", veth_b_, " up"),
        absl::StrCat("ip -n ", a_, " link set lo up"),
        absl::StrCat("ip -n ", b_, " link set lo up"),
    };
    for (const std::string& step : steps) {
      if (Sh(step) != 0) {
        error_ = absl::StrCat("`", step, "` failed (root is needed for network namespaces)");
        return;
      }
    }
  }
  ~VethPair() {
    Sh(absl::StrCat("ip netns del ", a_, " >/dev/null"));  // deleting A removes the veth pair
    Sh(absl::StrCat("ip netns del ", b_, " >/dev/null"));
  }

  const std::string& error() const { return error_; }
  HarnessOptions Options(const std::string& tls) const {
    HarnessOptions options;
    options.tls = tls;
    options.decode_node = {{"ip", "netns", "exec", b_}, address_b_, veth_b_};
    options.prefill_node = {{"ip", "netns", "exec", a_}, "127.0.0.1", veth_a_};
    return options;
  }

 private:
  std::string a_, b_, veth_a_, veth_b_, address_a_, address_b_, error_;
};

struct NetnsCase {
  const char* name;
  const char* tls;  // "tcp": UCX; "verbs": the verbs backend, its software rail on the veth
  int prefill_tp;
  int decode_tp;
};

class NetnsTransferTest : public ::testing::TestWithParam<NetnsCase> {};

TEST_P(NetnsTransferTest, EveryPlannedByteCrossesTheVethAndNothingElseIsWritten) {
  ASSERT_EQ(geteuid(), 0u) << "this test creates network namespaces and must run as root";
  VethPair veth;
  ASSERT_EQ(veth.error(), "");
  RouteSetup setup;
  setup.prefill_tp = GetParam().prefill_tp;
  setup.decode_tp = GetParam().decode_tp;
  absl::StatusOr<HarnessResult> result = RunTransfer(setup, veth.Options(GetParam().tls));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->bytes_verified, uint64_t{480} * 16 * 32768);
  std::printf("netns %s P=%d -> D=%d: %.1f MiB verified in %.3f s\n", GetParam().tls,
              setup.prefill_tp, setup.decode_tp, result->bytes_verified / 1048576.0,
              result->seconds);
}

INSTANTIATE_TEST_SUITE_P(Routes, NetnsTransferTest,
                         ::testing::Values(NetnsCase{"p2_d1", "tcp", 2, 1},
                                           NetnsCase{"p1_d2", "tcp", 1, 2},
                                           NetnsCase{"verbs_p2_d1", "verbs", 2, 1},
                                           NetnsCase{"verbs_p1_d2", "verbs", 1, 2}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kvrail::testing
