#include <gtest/gtest.h>

#include <string>

#include "proto/kvrail/v1/handshake.pb.h"

namespace kvrail {
namespace {

TEST(HandshakeProtoTest, DescriptorRoundTripsThroughTheWire) {
  v1::HandshakeDescriptor descriptor;
  descriptor.set_version(3);
  descriptor.set_transport(v1::TRANSPORT_KIND_UCX);
  descriptor.set_session_id("127.0.0.1:15001");
  descriptor.add_lanes()->set_address(std::string("\x01\x02\x00\x03", 4));
  v1::Region* region = descriptor.add_regions();
  region->set_base(0x7f1234567000);
  region->set_length(1 << 20);
  region->set_remote_key("rkey");
  region->set_memory_kind(v1::MEMORY_KIND_HOST);

  std::string bytes;
  ASSERT_TRUE(descriptor.SerializeToString(&bytes));
  v1::HandshakeDescriptor back;
  ASSERT_TRUE(back.ParseFromString(bytes));
  EXPECT_EQ(back.version(), 3u);
  EXPECT_EQ(back.lanes(0).address(), std::string("\x01\x02\x00\x03", 4));
  EXPECT_EQ(back.regions(0).base(), 0x7f1234567000u);
  EXPECT_EQ(back.session_id(), "127.0.0.1:15001");
}

}  // namespace
}  // namespace kvrail
