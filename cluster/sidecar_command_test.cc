#include "cluster/sidecar_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvrail::cluster {
namespace {

using ::testing::ElementsAre;

SidecarCommand Decode() {
  SidecarCommand sidecar;
  sidecar.kvrail = "/bin/kvrail";
  sidecar.role = "decode";
  sidecar.engine_endpoint = "ipc:///tmp/d.sock";
  sidecar.host = "127.0.0.1";
  return sidecar;
}

TEST(SidecarCommandTest, UcxSharedMemoryIsTlsSmOnItsNetDevices) {
  SidecarCommand sidecar = Decode();
  sidecar.link = "shm";
  sidecar.net_devices = "lo";
  const Command command = SidecarCommandLine(sidecar);
  EXPECT_THAT(command.argv, ElementsAre("/bin/kvrail", "sidecar", "--role", "decode",
                                        "--engine-endpoint", "ipc:///tmp/d.sock", "--host",
                                        "127.0.0.1", "--tls", "sm", "--net-devices", "lo"));
  EXPECT_TRUE(command.env.empty());
}

TEST(SidecarCommandTest, APrefillInANamespaceNamesItsBootstrapAndKeepsItsExtraFlagsLast) {
  SidecarCommand sidecar = Decode();
  sidecar.role = "prefill";
  sidecar.prefix = {"ip", "netns", "exec", "a"};
  sidecar.bootstrap = "10.0.0.1:8998";
  sidecar.args = {"--lanes", "2"};
  const Command command = SidecarCommandLine(sidecar);
  EXPECT_THAT(command.argv,
              ElementsAre("ip", "netns", "exec", "a", "/bin/kvrail", "sidecar", "--role", "prefill",
                          "--engine-endpoint", "ipc:///tmp/d.sock", "--host", "127.0.0.1", "--tls",
                          "tcp", "--bootstrap", "10.0.0.1:8998", "--lanes", "2"));
}

TEST(SidecarCommandTest, SoftverbsPutsARailOnEachNetDeviceInsteadOfUcxFlags) {
  SidecarCommand sidecar = Decode();
  sidecar.link = "verbs";
  sidecar.verbs_provider = "softverbs";
  sidecar.net_devices = "veth0,veth1";
  const Command command = SidecarCommandLine(sidecar);
  EXPECT_THAT(command.argv,
              ElementsAre("/bin/kvrail", "sidecar", "--role", "decode", "--engine-endpoint",
                          "ipc:///tmp/d.sock", "--host", "127.0.0.1", "--backend", "verbs",
                          "--verbs-provider", "softverbs"));
  EXPECT_EQ(command.env.at("KVRAIL_SOFTVERBS_RAILS"), "softverbs0=veth0,softverbs1=veth1");
}

}  // namespace
}  // namespace kvrail::cluster
