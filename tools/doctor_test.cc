#include "tools/doctor.h"

#include <string>

#include "gtest/gtest.h"

namespace kvrail::tools {
namespace {

using Level = Finding::Level;

// A host like this one: UCX over tcp and shared memory, no RDMA device, no GPU.
DoctorFacts PlainHost() {
  DoctorFacts f;
  f.data_plane.ucx_version = "1.13.1";
  f.data_plane.ucx_resources = {{"tcp", "tcp", "tcp", "eth0", "network"},
                                {"posix", "posix", "posix", "memory", "shared memory"},
                                {"self", "self", "self", "memory0", "self"}};
  f.data_plane.rdma_status = absl::UnavailableError(
      "libibverbs: ibv_get_device_list returned no list (errno 38, Function not implemented): "
      "this kernel has no RDMA support");
  f.cuda = absl::FailedPreconditionError("no GPU: cudaGetDeviceCount returned 35");
  f.host_addresses = {"127.0.0.1 (lo)", "10.0.0.5 (eth0)"};
  return f;
}

const Finding* Find(const std::vector<Finding>& findings, const std::string& check, Level level) {
  for (const Finding& f : findings) {
    if (f.check == check && f.level == level) return &f;
  }
  return nullptr;
}

TEST(DoctorTest, AHostWithoutRdmaOrGpuIsReadyAndSaysWhatItFallsBackTo) {
  const std::vector<Finding> findings = Diagnose(PlainHost());
  EXPECT_FALSE(AnyFailed(findings)) << FormatText(findings);
  const Finding* rdma = Find(findings, "rdma", Level::kWarn);
  ASSERT_NE(rdma, nullptr);
  EXPECT_NE(rdma->detail.find("errno 38"), std::string::npos) << rdma->detail;
  EXPECT_NE(rdma->fix.find("tcp and shared memory"), std::string::npos) << rdma->fix;
  const Finding* ucx = Find(findings, "ucx", Level::kWarn);
  ASSERT_NE(ucx, nullptr);
  EXPECT_NE(ucx->detail.find("tcp, and shared memory"), std::string::npos) << ucx->detail;
  ASSERT_NE(Find(findings, "ucx", Level::kOk), nullptr);
  EXPECT_NE(Find(findings, "ucx", Level::kOk)->detail.find("UCX 1.13.1"), std::string::npos);
  EXPECT_NE(Find(findings, "gpu", Level::kWarn), nullptr);
}

TEST(DoctorTest, AnAdvertisedAddressThatIsNotThisHostsFailsNamingTheAddressesToUse) {
  DoctorFacts f = PlainHost();
  f.advertise_host = "172.17.0.2";
  f.advertise = absl::FailedPreconditionError(
      "\"172.17.0.2\" cannot be bound here (Cannot assign requested address): it is not an "
      "address of this host");
  const std::vector<Finding> findings = Diagnose(f);
  EXPECT_TRUE(AnyFailed(findings));
  const Finding* advertise = Find(findings, "advertise", Level::kFail);
  ASSERT_NE(advertise, nullptr);
  EXPECT_NE(advertise->detail.find("172.17.0.2"), std::string::npos);
  EXPECT_NE(advertise->fix.find("10.0.0.5 (eth0)"), std::string::npos) << advertise->fix;
  EXPECT_NE(advertise->fix.find("container"), std::string::npos) << advertise->fix;
}

TEST(DoctorTest, ALoopbackAdvertisedAddressWarnsThatOnlyThisHostReachesIt) {
  DoctorFacts f = PlainHost();
  f.advertise_host = "127.0.0.1";
  const std::vector<Finding> findings = Diagnose(f);
  EXPECT_FALSE(AnyFailed(findings));
  EXPECT_NE(Find(findings, "advertise", Level::kWarn), nullptr);
}

TEST(DoctorTest, ABootstrapOrPeerThatDoesNotAnswerFails) {
  DoctorFacts f = PlainHost();
  f.bootstrap = "10.0.0.9:8998";
  f.bootstrap_health = absl::DeadlineExceededError("bootstrap 10.0.0.9:8998: no answer");
  f.peer = "10.0.0.7:17000";
  f.peer_handshake = absl::DeadlineExceededError("session 10.0.0.7:17000: no answer");
  const std::vector<Finding> findings = Diagnose(f);
  ASSERT_NE(Find(findings, "bootstrap", Level::kFail), nullptr);
  EXPECT_NE(Find(findings, "bootstrap", Level::kFail)->fix.find("kvrail bootstrap"),
            std::string::npos);
  ASSERT_NE(Find(findings, "peer", Level::kFail), nullptr);
  const std::string text = FormatText(findings);
  EXPECT_NE(text.find("problems found"), std::string::npos) << text;
}

// Recorded facts of an RDMA host: one RoCE port up with only a v1 GID at MTU 1024, one port
// down, a GPU on a NUMA node without a NIC.
TEST(DoctorTest, RdmaPortsGidsAndPlacementAreCheckedOnARecordedHost) {
  DoctorFacts f = PlainHost();
  f.data_plane.rdma_status = absl::OkStatus();
  transport::RdmaDevice nic;
  nic.name = "mlx5_0";
  nic.numa_node = 0;
  nic.ports.push_back({1,
                       "PORT_ACTIVE",
                       1024,
                       "Ethernet",
                       {{0, "fe80:0000:0000:0000:0000:0000:0000:0001", "IB/RoCE v1", "eth2"}}});
  nic.ports.push_back({2, "PORT_DOWN", 0, "InfiniBand", {}});
  f.data_plane.rdma_devices = {nic};
  f.cuda = absl::OkStatus();
  f.gpus = {{"0000:b1:00.0", "NVIDIA GPU", 1}};
  const std::vector<Finding> findings = Diagnose(f);
  EXPECT_FALSE(AnyFailed(findings)) << FormatText(findings);
  const std::string text = FormatText(findings);
  EXPECT_NE(text.find("mlx5_0 port 1: no RoCE v2 GID"), std::string::npos) << text;
  EXPECT_NE(text.find("mlx5_0 port 2: PORT_DOWN"), std::string::npos) << text;
  EXPECT_NE(text.find("path MTU 1024"), std::string::npos) << text;
  const Finding* placement = Find(findings, "placement", Level::kWarn);
  ASSERT_NE(placement, nullptr);
  EXPECT_NE(placement->detail.find("no RDMA NIC on its node"), std::string::npos);
}

TEST(DoctorTest, JsonCarriesTheFindingsAndTheFacts) {
  DoctorFacts f = PlainHost();
  const std::string json = FormatJson(f, Diagnose(f));
  EXPECT_NE(json.find("\"ok\": true"), std::string::npos) << json;
  EXPECT_NE(json.find("\"transport\": \"posix\""), std::string::npos) << json;
  EXPECT_NE(json.find("errno 38"), std::string::npos) << json;
}

// The real probe on this host: UCX answers with its tcp transport, whatever else it has.
TEST(DoctorTest, GatherAsksThisHostsUcx) {
  const DoctorFacts f = Gather({});
  ASSERT_TRUE(f.data_plane.ucx_status.ok()) << f.data_plane.ucx_status;
  EXPECT_FALSE(f.data_plane.ucx_version.empty());
  EXPECT_TRUE(f.data_plane.UcxHas({"tcp"}));
  // Either libibverbs listed devices, or it said why not.
  if (!f.data_plane.rdma_status.ok()) {
    EXPECT_NE(f.data_plane.rdma_status.message().find("ibv_get_device_list"), std::string::npos);
  }
}

}  // namespace
}  // namespace kvrail::tools
