// GID selection, MTU and link speed arithmetic of the verbs backend's rails (verbs_rail.h).
#include "engine/transport/verbs/verbs_rail.h"

#include <arpa/inet.h>

#include <cstring>

#include "gtest/gtest.h"

namespace kvrail::transport {
namespace {

ibv_gid Gid(const char* text) {
  ibv_gid gid = {};
  EXPECT_EQ(inet_pton(AF_INET6, text, gid.raw), 1) << text;
  return gid;
}

GidEntry Entry(uint32_t index, const char* text, uint32_t type, bool up = true) {
  return {index, Gid(text), type, up};
}

TEST(ChooseGid, TakesTheFirstRoceV2Ipv4MappedGidWhoseNetdevIsUp) {
  const std::vector<GidEntry> table = {
      Entry(0, "fe80::1", IBV_GID_TYPE_ROCE_V1),
      Entry(1, "fe80::1", IBV_GID_TYPE_ROCE_V2),
      Entry(2, "::ffff:10.0.0.1", IBV_GID_TYPE_ROCE_V1),
      Entry(3, "::ffff:10.0.0.1", IBV_GID_TYPE_ROCE_V2, /*up=*/false),
      Entry(4, "::ffff:10.0.1.1", IBV_GID_TYPE_ROCE_V2),
      Entry(5, "::ffff:10.0.2.1", IBV_GID_TYPE_ROCE_V2),
  };
  EXPECT_EQ(ChooseGid(table, IBV_LINK_LAYER_ETHERNET, -1), 4u);
}

TEST(ChooseGid, NeverPicksALinkLocalGidUnlessConfigured) {
  const std::vector<GidEntry> table = {Entry(0, "fe80::1", IBV_GID_TYPE_ROCE_V2),
                                       Entry(1, "fe80::2", IBV_GID_TYPE_ROCE_V1)};
  EXPECT_FALSE(ChooseGid(table, IBV_LINK_LAYER_ETHERNET, -1).has_value());
  EXPECT_EQ(ChooseGid(table, IBV_LINK_LAYER_ETHERNET, 0), 0u);
}

TEST(ChooseGid, AConfiguredIndexMustBeInUse) {
  const std::vector<GidEntry> table = {Entry(0, "fe80::1", IBV_GID_TYPE_ROCE_V2)};
  EXPECT_FALSE(ChooseGid(table, IBV_LINK_LAYER_ETHERNET, 3).has_value());
}

TEST(ChooseGid, InfiniBandUsesThePortGid) {
  const std::vector<GidEntry> table = {Entry(0, "fe80::2:c903:a:1b2", IBV_GID_TYPE_IB)};
  EXPECT_EQ(ChooseGid(table, IBV_LINK_LAYER_INFINIBAND, -1), 0u);
}

TEST(GidText, PrintsAsRdmaCoreDoesAndFindsIpv4) {
  EXPECT_EQ(GidText(Gid("::ffff:10.1.2.3")), "0000:0000:0000:0000:0000:ffff:0a01:0203");
  EXPECT_EQ(GidIpv4(Gid("::ffff:10.1.2.3")), "10.1.2.3");
  EXPECT_EQ(GidIpv4(Gid("fe80::1")), "");
  EXPECT_TRUE(IsLinkLocal(Gid("fe80::1")));
  EXPECT_FALSE(IsLinkLocal(Gid("::ffff:10.1.2.3")));
}

TEST(Mtu, ConvertsBothWaysAndRoundsDown) {
  EXPECT_EQ(MtuBytes(IBV_MTU_4096), 4096);
  EXPECT_EQ(MtuBytes(IBV_MTU_256), 256);
  EXPECT_EQ(MtuFromBytes(4096), IBV_MTU_4096);
  EXPECT_EQ(MtuFromBytes(3000), IBV_MTU_2048);
  EXPECT_EQ(MtuFromBytes(0), IBV_MTU_256);
}

TEST(PortGbps, ReadsSpeedTimesWidth) {
  ibv_port_attr port = {};
  port.active_speed = 128;  // NDR
  port.active_width = 2;    // 4x
  EXPECT_EQ(PortGbps(port), 400u);
  port.active_speed = 32;  // EDR
  EXPECT_EQ(PortGbps(port), 100u);
  port.active_speed = 1;  // SDR, 2.5 Gb/s a lane
  port.active_width = 1;
  EXPECT_EQ(PortGbps(port), 2u);
  port.active_speed = 3;  // not an IBTA speed
  EXPECT_EQ(PortGbps(port), 0u);
}

}  // namespace
}  // namespace kvrail::transport
