// Tests of multi-rail planning (rails.h): topology read from the DGX H100-style sysfs fixture in
// testdata/sysfs_8gpu_8nic, rail choice per arena, stripe planning and the rail health state
// machine with time passed in.
#include "engine/transport/verbs/rails.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvrail::transport {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;

constexpr char kFixture[] = "engine/transport/verbs/testdata/sysfs_8gpu_8nic";

// Under `bazel test` the fixture is in the runfiles tree; run by hand from the workspace root it
// is at its source path. The runfiles hold testdata/ as one link to the source directory (not a
// file-by-file copy), which keeps the fixture's own relative links intact.
std::string FixtureRoot() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return kFixture;
  return absl::StrCat(srcdir, "/", workspace != nullptr ? workspace : "kvrail", "/", kFixture);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The fixture's NICs and GPUs, read once per test (cheap: a few hundred small files).
struct Fixture {
  std::vector<PciDevice> nics;
  std::vector<PciDevice> gpus;

  int Nic(const std::string& name) const {
    for (size_t i = 0; i < nics.size(); ++i) {
      if (nics[i].name == name) return static_cast<int>(i);
    }
    return -1;
  }
};

Fixture LoadFixture() {
  Fixture f;
  absl::StatusOr<std::vector<PciDevice>> nics = ReadRdmaDevices(FixtureRoot());
  absl::StatusOr<std::vector<PciDevice>> gpus = ReadGpus(FixtureRoot());
  EXPECT_TRUE(nics.ok()) << nics.status();
  EXPECT_TRUE(gpus.ok()) << gpus.status();
  if (nics.ok()) f.nics = *nics;
  if (gpus.ok()) f.gpus = *gpus;
  return f;
}

std::vector<std::string> Names(const std::vector<PciDevice>& devices,
                               const std::vector<int>& indices) {
  std::vector<std::string> names;
  for (int i : indices) names.push_back(devices[i].name);
  return names;
}

TEST(ReadRdmaDevices, TheFixtureHasEightComputeNicsAndOneStorageNicWithTheirPciPaths) {
  const Fixture f = LoadFixture();
  ASSERT_EQ(f.nics.size(), 9u);
  EXPECT_EQ(f.nics[0].name, "mlx5_0");
  EXPECT_EQ(f.nics[8].name, "mlx5_8");
  EXPECT_EQ(f.nics[0].pci_address, "0000:1a:00.0");
  EXPECT_EQ(f.nics[0].numa_node, 0);
  EXPECT_THAT(f.nics[0].pci_path, ElementsAre("pci0000:15", "0000:15:01.0", "0000:16:00.0",
                                              "0000:17:02.0", "0000:1a:00.0"));
  EXPECT_EQ(f.nics[4].pci_address, "0000:9c:00.0");
  EXPECT_EQ(f.nics[4].numa_node, 1);
  EXPECT_EQ(f.nics[8].pci_address, "0000:1b:00.0");
  EXPECT_EQ(f.nics[8].numa_node, 0);
  EXPECT_THAT(f.nics[8].pci_path, ElementsAre("pci0000:15", "0000:15:05.0", "0000:1b:00.0"));
}

TEST(ReadGpus, TheFixtureHasEightGpusAndTheNvSwitchesAreLeftOut) {
  const Fixture f = LoadFixture();
  std::vector<std::string> addresses;
  for (const PciDevice& gpu : f.gpus) addresses.push_back(gpu.pci_address);
  EXPECT_THAT(addresses,
              ElementsAre("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
                          "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"));
  ASSERT_EQ(f.gpus.size(), 8u);
  EXPECT_EQ(f.gpus[0].name, "0000:18:00.0");
  EXPECT_EQ(f.gpus[0].numa_node, 0);
  EXPECT_EQ(f.gpus[7].numa_node, 1);
  EXPECT_THAT(f.gpus[0].pci_path, ElementsAre("pci0000:15", "0000:15:01.0", "0000:16:00.0",
                                              "0000:17:00.0", "0000:18:00.0"));
}

TEST(ChooseRail, EachOfTheFixturesEightGpusGetsTheNicOnItsOwnSwitch) {
  const Fixture f = LoadFixture();
  ASSERT_EQ(f.gpus.size(), 8u);
  for (size_t g = 0; g < f.gpus.size(); ++g) {
    const std::vector<int> rails = ChooseRail({.gpu = f.gpus[g]}, f.nics);
    ASSERT_EQ(rails.size(), 1u) << f.gpus[g].name;
    const PciDevice& nic = f.nics[rails[0]];
    EXPECT_EQ(nic.name, absl::StrCat("mlx5_", g)) << f.gpus[g].name;
    // The same switch: root complex, root port and the switch's upstream port in common.
    ASSERT_GE(nic.pci_path.size(), 3u);
    EXPECT_EQ(nic.pci_path[2], f.gpus[g].pci_path[2]) << f.gpus[g].name;
    EXPECT_EQ(PciDistance(f.gpus[g], nic), 4) << f.gpus[g].name;
  }
}

TEST(RankRailsForDevice, AGpusRailsGoSameSwitchThenRootComplexThenNumaNodeThenOtherSocket) {
  const Fixture f = LoadFixture();
  ASSERT_FALSE(f.gpus.empty());
  EXPECT_THAT(Names(f.nics, RankRailsForDevice(f.gpus[0], f.nics)),
              ElementsAre("mlx5_0", "mlx5_8", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5",
                          "mlx5_6", "mlx5_7"));
  const PciDevice& gpu0 = f.gpus[0];
  EXPECT_LT(PciDistance(gpu0, f.nics[f.Nic("mlx5_0")]), kPciSameRootComplex);
  EXPECT_GE(PciDistance(gpu0, f.nics[f.Nic("mlx5_8")]), kPciSameRootComplex);
  EXPECT_LT(PciDistance(gpu0, f.nics[f.Nic("mlx5_8")]), kPciSameNuma);
  EXPECT_GE(PciDistance(gpu0, f.nics[f.Nic("mlx5_1")]), kPciSameNuma);
  EXPECT_LT(PciDistance(gpu0, f.nics[f.Nic("mlx5_1")]), kPciCrossSocket);
  EXPECT_GE(PciDistance(gpu0, f.nics[f.Nic("mlx5_4")]), kPciCrossSocket);
}

TEST(ChooseRail, AHostArenaOnNumaNodeOneGetsTheNumaOneNics) {
  const Fixture f = LoadFixture();
  EXPECT_THAT(Names(f.nics, ChooseRail({.numa_node = 1}, f.nics)),
              ElementsAre("mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"));
  // Node 0 also has the storage NIC: host memory may use it, at its own rate.
  EXPECT_THAT(Names(f.nics, ChooseRail({.numa_node = 0}, f.nics)),
              ElementsAre("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_8"));
}

TEST(RankRailsForDevice, AHostArenaRanksItsOwnNodesNicsFirstByName) {
  const Fixture f = LoadFixture();
  PciDevice cpu1;
  cpu1.numa_node = 1;
  EXPECT_THAT(Names(f.nics, RankRailsForDevice(cpu1, f.nics)),
              ElementsAre("mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_0", "mlx5_1", "mlx5_2",
                          "mlx5_3", "mlx5_8"));
}

TEST(ChooseRail, TheStorageNicIsNeverFirstForAGpu) {
  const Fixture f = LoadFixture();
  const int storage = f.Nic("mlx5_8");
  ASSERT_GE(storage, 0);
  ASSERT_EQ(f.gpus.size(), 8u);
  for (const PciDevice& gpu : f.gpus) {
    EXPECT_NE(RankRailsForDevice(gpu, f.nics).front(), storage) << gpu.name;
    EXPECT_THAT(ChooseRail({.gpu = gpu}, f.nics), Not(Contains(storage))) << gpu.name;
  }
}

TEST(ReadRdmaDevices, AnUnreadableRootIsAnErrorNamingThePath) {
  const std::string root = "/nonexistent/kvrail-sysfs";
  absl::StatusOr<std::vector<PciDevice>> nics = ReadRdmaDevices(root);
  ASSERT_FALSE(nics.ok());
  EXPECT_TRUE(absl::IsNotFound(nics.status())) << nics.status();
  EXPECT_THAT(nics.status().message(), HasSubstr(root + "/class/infiniband"));

  absl::StatusOr<std::vector<PciDevice>> gpus = ReadGpus(root);
  ASSERT_FALSE(gpus.ok());
  EXPECT_TRUE(absl::IsNotFound(gpus.status())) << gpus.status();
  EXPECT_THAT(gpus.status().message(), HasSubstr(root + "/bus/pci/devices"));
}

TEST(ChooseRail, WithoutATopologyEveryArenaGetsAllRailsInOrder) {
  // What a caller has when the readers fail: the NICs by name only (from ibv_get_device_list),
  // in the order it listed them.
  std::vector<PciDevice> nics(3);
  nics[0].name = "mlx5_2";
  nics[1].name = "mlx5_0";
  nics[2].name = "mlx5_1";
  PciDevice gpu;
  gpu.name = "0000:18:00.0";
  gpu.pci_address = "0000:18:00.0";
  gpu.pci_path = {"pci0000:15", "0000:15:01.0", "0000:18:00.0"};
  EXPECT_THAT(ChooseRail({.gpu = gpu}, nics), ElementsAre(0, 1, 2));
  EXPECT_THAT(ChooseRail({.numa_node = 1}, nics), ElementsAre(0, 1, 2));
  EXPECT_THAT(ChooseRail({}, nics), ElementsAre(0, 1, 2));

  // And the other way round: NICs with a topology, an arena without one.
  const Fixture f = LoadFixture();
  EXPECT_THAT(ChooseRail({.numa_node = -1}, f.nics), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8));
  EXPECT_THAT(ChooseRail({.gpu = PciDevice{.name = "GPU-unknown"}}, f.nics),
              ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8));
  // A node that has no NIC.
  EXPECT_THAT(ChooseRail({.numa_node = 3}, f.nics), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8));
}

TEST(ChooseRail, NamesCompareTheirNumbersAsNumbers) {
  std::vector<PciDevice> nics(3);
  nics[0] = {.name = "mlx5_10", .numa_node = 0};
  nics[1] = {.name = "mlx5_2", .numa_node = 0};
  nics[2] = {.name = "mlx5_1", .numa_node = 0};
  EXPECT_THAT(Names(nics, ChooseRail({.numa_node = 0}, nics)),
              ElementsAre("mlx5_1", "mlx5_2", "mlx5_10"));
}

TEST(ParseRateGbps, ReadsTheFixturesRateFiles) {
  const std::string root = FixtureRoot();
  EXPECT_EQ(ParseRateGbps(ReadFile(root + "/class/infiniband/mlx5_0/ports/1/rate")), 400);
  EXPECT_EQ(ParseRateGbps(ReadFile(root + "/class/infiniband/mlx5_8/ports/1/rate")), 100);
}

TEST(ParseRateGbps, ReadsEveryKnownSpeedAndGivesZeroForGarbage) {
  EXPECT_EQ(ParseRateGbps("400 Gb/sec (4X NDR)"), 400);
  EXPECT_EQ(ParseRateGbps("400 Gb/sec (4X NDR)\n"), 400);
  EXPECT_EQ(ParseRateGbps("100 Gb/sec (4X EDR)"), 100);
  EXPECT_EQ(ParseRateGbps("200 Gb/sec (4X HDR)"), 200);
  EXPECT_EQ(ParseRateGbps("2.5 Gb/sec (1X SDR)"), 2);
  EXPECT_EQ(ParseRateGbps(""), 0);
  EXPECT_EQ(ParseRateGbps("fast"), 0);
  EXPECT_EQ(ParseRateGbps("Gb/sec"), 0);
  EXPECT_EQ(ParseRateGbps("400"), 0);
  EXPECT_EQ(ParseRateGbps("400 Mb/sec"), 0);
  EXPECT_EQ(ParseRateGbps("-400 Gb/sec (4X NDR)"), 0);
  EXPECT_EQ(ParseRateGbps("0 Gb/sec"), 0);
  EXPECT_EQ(ParseRateGbps("1.2.3 Gb/sec"), 0);
  EXPECT_EQ(ParseRateGbps("99999999999 Gb/sec"), 0);
}

constexpr absl::Duration kProbeAfter = absl::Seconds(1);

TEST(RailHealth, AFailedRailIsOutOfRotationUntilProbeAfterHasPassed) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  RailHealth health(3, kProbeAfter);
  EXPECT_THAT(health.Up(t0), ElementsAre(0, 1, 2));
  health.ReportFailure(1, t0);
  EXPECT_FALSE(health.InRotation(1, t0));
  EXPECT_THAT(health.Up(t0), ElementsAre(0, 2));
  EXPECT_EQ(health.TakeProbe(t0 + kProbeAfter - absl::Milliseconds(1)), std::nullopt);
  // Time alone does not bring it back: only a probe does.
  EXPECT_FALSE(health.InRotation(1, t0 + absl::Hours(1)));
}

TEST(RailHealth, AfterProbeAfterExactlyOneCallerGetsTheProbe) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  RailHealth health(3, kProbeAfter);
  health.ReportFailure(1, t0);
  EXPECT_EQ(health.TakeProbe(t0 + kProbeAfter), 1);
  EXPECT_EQ(health.TakeProbe(t0 + kProbeAfter), std::nullopt);
  EXPECT_EQ(health.TakeProbe(t0 + absl::Minutes(5)), std::nullopt);
  // The probed rail is still not in rotation: only its prober uses it.
  EXPECT_FALSE(health.InRotation(1, t0 + kProbeAfter));
}

TEST(RailHealth, ASuccessfulProbePutsTheRailBackInRotation) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  RailHealth health(2, kProbeAfter);
  health.ReportFailure(0, t0);
  const absl::Time t1 = t0 + kProbeAfter;
  ASSERT_EQ(health.TakeProbe(t1), 0);
  health.ReportSuccess(0, t1);
  EXPECT_TRUE(health.InRotation(0, t1));
  EXPECT_THAT(health.Up(t1), ElementsAre(0, 1));
  EXPECT_EQ(health.Backoff(0), absl::ZeroDuration());
  // The backoff starts over: the next failure is out for probe_after again.
  health.ReportFailure(0, t1);
  EXPECT_EQ(health.Backoff(0), kProbeAfter);
}

TEST(RailHealth, AFailedProbeDoublesTheBackoffUpToSixteenTimes) {
  absl::Time now = absl::FromUnixSeconds(1000);
  RailHealth health(1, kProbeAfter);
  health.ReportFailure(0, now);
  std::vector<absl::Duration> backoffs = {health.Backoff(0)};
  for (int i = 0; i < 6; ++i) {
    const absl::Duration wait = health.Backoff(0);
    EXPECT_EQ(health.TakeProbe(now + wait - absl::Milliseconds(1)), std::nullopt);
    now += wait;
    ASSERT_EQ(health.TakeProbe(now), 0);
    health.ReportFailure(0, now);
    backoffs.push_back(health.Backoff(0));
  }
  EXPECT_THAT(backoffs,
              ElementsAre(absl::Seconds(1), absl::Seconds(2), absl::Seconds(4), absl::Seconds(8),
                          absl::Seconds(16), absl::Seconds(16), absl::Seconds(16)));
}

TEST(RailHealth, LateReportsWhileOutChangeNothing) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  RailHealth health(1, kProbeAfter);
  health.ReportFailure(0, t0);
  // Completions of transfers posted before the failure.
  health.ReportSuccess(0, t0 + absl::Milliseconds(1));
  health.ReportFailure(0, t0 + absl::Milliseconds(2));
  EXPECT_FALSE(health.InRotation(0, t0 + absl::Milliseconds(3)));
  EXPECT_EQ(health.Backoff(0), kProbeAfter);
  EXPECT_EQ(health.TakeProbe(t0 + kProbeAfter), 0);
}

TEST(RailHealth, RailsOutOfRangeAreIgnored) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  RailHealth health(2, kProbeAfter);
  health.ReportFailure(-1, t0);
  health.ReportFailure(2, t0);
  health.ReportSuccess(7, t0);
  EXPECT_FALSE(health.InRotation(2, t0));
  EXPECT_THAT(health.Up(t0), ElementsAre(0, 1));
  EXPECT_EQ(health.TakeProbe(t0 + absl::Hours(1)), std::nullopt);
}

TEST(RailsForAffinity, AGpuGetsTheNicOnItsSwitchAndANumaNodeItsNics) {
  EXPECT_THAT(RailsForAffinity(FixtureRoot(), "gpu:0000:18:00.0").value(), ElementsAre("mlx5_0"));
  EXPECT_THAT(RailsForAffinity(FixtureRoot(), "gpu:0000:db:00.0").value(), ElementsAre("mlx5_7"));
  EXPECT_THAT(RailsForAffinity(FixtureRoot(), "numa:1").value(),
              ElementsAre("mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"));
}

TEST(RailsForAffinity, RefusesWhatItCannotPlaceNamingTheRule) {
  auto unknown = RailsForAffinity(FixtureRoot(), "gpu:0000:77:00.0");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("shows no GPU 0000:77:00.0"), std::string::npos)
      << unknown.status();
  auto garbage = RailsForAffinity(FixtureRoot(), "socket:1");
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(garbage.status().message().find("expected gpu:<PCI address>"), std::string::npos);
  EXPECT_EQ(RailsForAffinity(FixtureRoot(), "numa:-1").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(RailsForAffinity("/nonexistent", "numa:0").ok());
}

}  // namespace
}  // namespace kvrail::transport
