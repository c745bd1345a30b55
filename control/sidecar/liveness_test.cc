#include "control/sidecar/liveness.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

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

// Many at once: listening, refusing, unparsable and silent endpoints, each answered in place.
// The silent one listens with its accept queue full, so the kernel drops the probe's SYNs and
// its connect never completes in time, as with a host that is cut off (kUnknown).
TEST(LivenessTest, ManyEndpointsAreProbedTogether) {
  int listening = -1, closed = -1, full = -1;
  const int open_port = Listen(listening);
  const int closed_port = Listen(closed);
  close(closed);
  const int full_port = Listen(full);
  listen(full, 0);
  std::vector<int> fillers;
  for (int i = 0; i < 4; ++i) {
    fillers.push_back(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons(full_port);
    (void)connect(fillers.back(), reinterpret_cast<sockaddr*>(&to), sizeof(to));
  }
  const std::vector<std::string> endpoints = {
      absl::StrCat("tcp://127.0.0.1:", open_port), absl::StrCat("127.0.0.1:", closed_port),
      "tcp://127.0.0.1", absl::StrCat("127.0.0.1:", full_port),
      absl::StrCat("127.0.0.1:", open_port)};
  const std::vector<Reach> reach = ProbeEndpoints(endpoints, absl::Milliseconds(300));
  ASSERT_EQ(reach.size(), endpoints.size());
  EXPECT_EQ(reach[0], Reach::kListening);
  EXPECT_EQ(reach[1], Reach::kRefused);
  EXPECT_EQ(reach[2], Reach::kUnknown);
  EXPECT_EQ(reach[3], Reach::kUnknown);
  EXPECT_EQ(reach[4], Reach::kListening);
  close(listening);
  close(full);
  for (int fd : fillers) close(fd);
}

}  // namespace
}  // namespace kvrail::sidecar
