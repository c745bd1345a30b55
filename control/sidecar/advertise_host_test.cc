#include "control/sidecar/advertise_host.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

namespace kvrail::sidecar {
namespace {

// A TCP listener on `host` (an IPv4 address) and a free port, closed with the object.
class Listener {
 public:
  explicit Listener(const std::string& host) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    inet_pton(AF_INET, host.c_str(), &address.sin_addr);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(listen(fd_, 4), 0);
    socklen_t size = sizeof(address);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &size);
    port_ = ntohs(address.sin_port);
  }
  ~Listener() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

const std::vector<std::string> kAddresses = {"127.0.0.1", "::1", "fe80::1", "10.1.2.3"};

TEST(ChooseAdvertiseHostTest, TheGivenAddressWins) {
  EXPECT_EQ(*ChooseAdvertiseHost("0.0.0.0", "10.9.9.9", kAddresses), "10.9.9.9");
  EXPECT_EQ(*ChooseAdvertiseHost("127.0.0.1", "node7.example", kAddresses), "node7.example");
}

TEST(ChooseAdvertiseHostTest, DefaultsToTheBindHost) {
  EXPECT_EQ(*ChooseAdvertiseHost("127.0.0.1", "", kAddresses), "127.0.0.1");
  EXPECT_EQ(*ChooseAdvertiseHost("10.1.2.3", "", kAddresses), "10.1.2.3");
}

TEST(ChooseAdvertiseHostTest, AWildcardBindAdvertisesARealAddress) {
  EXPECT_EQ(*ChooseAdvertiseHost("0.0.0.0", "", kAddresses), "10.1.2.3");
  EXPECT_EQ(*ChooseAdvertiseHost("*", "", {"127.0.0.1", "fe80::1", "2001:db8::7"}),
            "[2001:db8::7]");
  EXPECT_EQ(*ChooseAdvertiseHost("::", "", {"127.0.0.1", "::1"}), "127.0.0.1");
}

TEST(ChooseAdvertiseHostTest, AWildcardAdvertiseHostIsRefused) {
  const absl::StatusOr<std::string> chosen = ChooseAdvertiseHost("127.0.0.1", "0.0.0.0", {});
  ASSERT_FALSE(chosen.ok());
  EXPECT_NE(chosen.status().message().find("--advertise-host 0.0.0.0"), std::string::npos);
}

TEST(HostAddressesTest, ListsLoopback) {
  const absl::StatusOr<std::vector<std::string>> addresses = HostAddresses();
  ASSERT_TRUE(addresses.ok()) << addresses.status();
  EXPECT_NE(std::find(addresses->begin(), addresses->end(), "127.0.0.1"), addresses->end());
}

TEST(CheckAdvertiseHostTest, AnAddressOfThisHostThatTheBindCovers) {
  const std::vector<std::string> addresses = *HostAddresses();
  Listener listener("127.0.0.1");
  EXPECT_TRUE(CheckAdvertiseHost("127.0.0.1", "127.0.0.1", listener.port(), addresses,
                                 absl::Milliseconds(500))
                  .ok());
  EXPECT_TRUE(
      CheckAdvertiseHost("localhost", "0.0.0.0", 1, addresses, absl::Milliseconds(500)).ok());
}

TEST(CheckAdvertiseHostTest, AnotherAddressThatReachesTheListener) {
  // 127.0.0.5 is on lo (all of 127/8 is) but getifaddrs lists 127.0.0.1 only: the connect
  // decides.
  Listener listener("0.0.0.0");
  EXPECT_TRUE(CheckAdvertiseHost("127.0.0.5", "0.0.0.0", listener.port(), {"127.0.0.1"},
                                 absl::Milliseconds(500))
                  .ok());
}

TEST(CheckAdvertiseHostTest, AnAddressTheBindDoesNotCoverIsRefused) {
  Listener listener("127.0.0.1");
  const absl::Status status = CheckAdvertiseHost("127.0.0.5", "127.0.0.1", listener.port(),
                                                 {"127.0.0.1"}, absl::Milliseconds(500));
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("--advertise-host 127.0.0.5 is neither"), std::string::npos)
      << status;
  EXPECT_NE(status.message().find("this host's addresses: 127.0.0.1"), std::string::npos) << status;
}

TEST(CheckAdvertiseHostTest, AnUnreachableAddressIsRefusedNamingIt) {
  Listener listener("0.0.0.0");
  const std::vector<std::string> addresses = *HostAddresses();
  // 192.0.2.1 is TEST-NET-1 (RFC 5737): never this host's, never routed.
  const absl::Status status = CheckAdvertiseHost("192.0.2.1", "0.0.0.0", listener.port(), addresses,
                                                 absl::Milliseconds(300));
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("--advertise-host 192.0.2.1"), std::string::npos) << status;
  EXPECT_NE(status.message().find("192.0.2.1:" + std::to_string(listener.port())),
            std::string::npos)
      << status;
  EXPECT_EQ(status.message().find('\n'), std::string::npos);
}

TEST(CheckAdvertiseHostTest, ANameThatDoesNotResolveIsRefused) {
  const absl::Status status =
      CheckAdvertiseHost("no-such-host.invalid", "0.0.0.0", 1, {}, absl::Milliseconds(100));
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("no-such-host.invalid does not resolve"), std::string::npos)
      << status;
}

}  // namespace
}  // namespace kvrail::sidecar
