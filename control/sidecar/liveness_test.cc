#include "control/sidecar/liveness.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace kvrail::sidecar {
namespace {

// A listening socket on an ephemeral port of 127.0.0.1; its port.
int Listen(int& fd) {
  fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  EXPECT_EQ(listen(fd, 4), 0);
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  return ntohs(address.sin_port);
}

TEST(LivenessTest, AListeningPortIsListeningAndAClosedOneRefuses) {
  int fd = -1;
  const int port = Listen(fd);
  EXPECT_EQ(ProbeTcp("127.0.0.1", port, absl::Seconds(1)), Reach::kListening);
  EXPECT_EQ(ProbeEndpoint(absl::StrCat("tcp://127.0.0.1:", port), absl::Seconds(1)),
            Reach::kListening);
  close(fd);
  EXPECT_EQ(ProbeTcp("127.0.0.1", port, absl::Seconds(1)), Reach::kRefused);
}

TEST(LivenessTest, WhatDoesNotParseOrResolveIsUnknown) {
  EXPECT_EQ(ProbeEndpoint("tcp://127.0.0.1", absl::Seconds(1)), Reach::kUnknown);
  EXPECT_EQ(ProbeEndpoint("127.0.0.1:0", absl::Seconds(1)), Reach::kUnknown);
  EXPECT_EQ(ProbeTcp("no-such-host.invalid", 80, absl::Milliseconds(200)), Reach::kUnknown);
}

}  // namespace
}  // namespace kvrail::sidecar
