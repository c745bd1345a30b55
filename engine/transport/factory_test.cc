#include "engine/transport/factory.h"

#include <gtest/gtest.h>

#include <string>

namespace kvrail::transport {
namespace {

TEST(MakeTransportTest, AnUnknownBackendIsRejectedNamingTheKnownOnes) {
  TransportSpec spec;
  spec.backend = "rdma";
  auto made = MakeTransport(spec);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(
      made.status().message().find("\"rdma\" is unknown; known backends: loopback, ucx, verbs"),
      std::string::npos)
      << made.status();
}

TEST(MakeTransportTest, UcxOverTcpHasTheSpecsLanesAndUcxDefaults) {
  TransportSpec spec;
  spec.lanes = 3;
  spec.tls = "tcp";
  spec.net_devices = "lo";
  auto made = MakeTransport(spec);
  ASSERT_TRUE(made.ok()) << made.status();
  const Capabilities& caps = (*made)->capabilities();
  EXPECT_EQ(caps.name, "ucx");
  EXPECT_EQ(caps.lanes, 3);
  EXPECT_EQ(caps.max_write_bytes, uint64_t{16} << 20);
  // No shared-memory transport is loaded: Allocate falls back to a memfd.
  auto shared = (*made)->Allocate(4096);
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(shared->placement, "memfd");
}

TEST(MakeTransportTest, SmMeansUcxSharedMemoryAndIgnoresTheNetworkDevice) {
  TransportSpec spec;
  spec.tls = "sm";
  spec.net_devices = "no-such-interface";
  auto made = MakeTransport(spec);
  ASSERT_TRUE(made.ok()) << made.status();
  auto shared = (*made)->Allocate(4096);
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(shared->placement, "ucx-shm");
}

TEST(MakeTransportTest, SizesGivenInTheSpecReplaceTheBackendsDefaults) {
  TransportSpec spec;
  spec.backend = "loopback";
  spec.lanes = 1;
  spec.max_write_bytes = 1 << 20;
  spec.max_inflight_bytes_per_endpoint = 8 << 20;
  auto made = MakeTransport(spec);
  ASSERT_TRUE(made.ok()) << made.status();
  const Capabilities& caps = (*made)->capabilities();
  EXPECT_EQ(caps.name, "loopback");
  EXPECT_EQ(caps.lanes, 1);
  EXPECT_EQ(caps.max_write_bytes, uint64_t{1} << 20);
  EXPECT_EQ(caps.max_inflight_bytes_per_endpoint, uint64_t{8} << 20);
}

TEST(MakeTransportTest, LoopbackRefusesUcxSettings) {
  TransportSpec spec;
  spec.backend = "loopback";
  spec.tls = "tcp";
  auto made = MakeTransport(spec);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("UCX settings"), std::string::npos) << made.status();
}

// Streaming stores are UCX's lanes' own copies: a UCX transport takes them, and the backends
// that land no bytes by a copy of their own refuse them, naming the setting.
TEST(MakeTransportTest, StreamingLandingStoresAreUcxsAndRefusedElsewhere) {
  TransportSpec ucx;
  ucx.tls = "sm";
  ucx.lanes = 1;
  ucx.landing_stores = LandingStores::kStreaming;
  auto made = MakeTransport(ucx);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ((*made)->capabilities().name, "ucx");

  TransportSpec loopback;
  loopback.backend = "loopback";
  loopback.landing_stores = LandingStores::kStreaming;
  auto refused = MakeTransport(loopback);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("landing_stores \"streaming\" is a UCX setting"),
            std::string::npos)
      << refused.status();

  TransportSpec verbs;
  verbs.backend = "verbs";
  verbs.verbs_provider = "softverbs";
  verbs.landing_stores = LandingStores::kStreaming;
  refused = MakeTransport(verbs);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("landing_stores \"streaming\" is a UCX setting"),
            std::string::npos)
      << refused.status();
}

TEST(MakeTransportTest, TheBackendsOwnErrorsComeThrough) {
  TransportSpec spec;
  spec.tls = "tcp";
  spec.lanes = 0;
  auto made = MakeTransport(spec);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("lanes is 0"), std::string::npos) << made.status();
}

TEST(MakeTransportTest, VerbsOverTheSoftwareProviderHasTheSpecsLanes) {
  TransportSpec spec;
  spec.backend = "verbs";
  spec.verbs_provider = "softverbs";
  spec.lanes = 3;
  auto made = MakeTransport(spec);
  ASSERT_TRUE(made.ok()) << made.status();
  const Capabilities& caps = (*made)->capabilities();
  EXPECT_EQ(caps.name, "verbs");
  EXPECT_EQ(caps.lanes, 3);
  EXPECT_TRUE(caps.disconnect_fences);
  auto descriptor = (*made)->LocalDescriptor();
  ASSERT_TRUE(descriptor.ok()) << descriptor.status();
  EXPECT_EQ(descriptor->transport(), v1::TRANSPORT_KIND_VERBS);
  EXPECT_EQ(descriptor->lanes_size(), 3);
}

TEST(MakeTransportTest, AnUnknownVerbsProviderIsRefusedNamingTheKnownOnes) {
  TransportSpec spec;
  spec.backend = "verbs";
  spec.verbs_provider = "rxe";
  auto made = MakeTransport(spec);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("\"rxe\" is unknown: expected libibverbs"),
            std::string::npos)
      << made.status();
}

TEST(MakeTransportTest, UcxSettingsGivenToVerbsAreRefused) {
  TransportSpec spec;
  spec.backend = "verbs";
  spec.verbs_provider = "softverbs";
  spec.tls = "tcp";
  EXPECT_EQ(MakeTransport(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MakeTransportTest, LibibverbsWithoutRdmaDevicesSaysSoInOneLine) {
  TransportSpec spec;
  spec.backend = "verbs";
  spec.verbs_provider = "libibverbs";
  auto made = MakeTransport(spec);
  if (made.ok()) GTEST_SKIP() << "this host has an RDMA device with an active port";
  const std::string message(made.status().message());
  EXPECT_NE(message.find("libibverbs"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

}  // namespace
}  // namespace kvrail::transport
