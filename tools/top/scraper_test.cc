#include "tools/top/scraper.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvrail::top {
namespace {

using ::testing::HasSubstr;

// An HTTP server on a free port of 127.0.0.1, stopped at the end of the test.
class FixtureServer {
 public:
  FixtureServer() {
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() is a no-op until listen runs: wait for it.
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FixtureServer() {
    server_.stop();
    thread_.join();
  }
  httplib::Server& server() { return server_; }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

// A port nothing listens on: one the kernel picked, bound, then closed.
std::string DeadEndpoint() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  close(fd);
  return "127.0.0.1:" + std::to_string(ntohs(address.sin_port));
}

std::vector<Target> Targets(const std::vector<std::string>& endpoints) {
  std::vector<Target> targets;
  for (const std::string& endpoint : endpoints) targets.push_back(*ParseTarget(endpoint));
  return targets;
}

TEST(ScrapeAllTest, EachEndpointIsUpOrDownWithWhy) {
  // Before the servers: `slow`'s handler may still read it while the servers stop (they are
  // destroyed first; clang's ASan saw the read after its scope).
  std::atomic<bool> released{false};
  FixtureServer good, bad_status, malformed, slow;
  good.server().Get("/metrics", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("kvrail_bytes_in_flight 12\n", "text/plain; version=0.0.4");
  });
  bad_status.server().Get(
      "/metrics", [](const httplib::Request&, httplib::Response& res) { res.status = 503; });
  malformed.server().Get("/metrics", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok 1\nbroken{\n", "text/plain");
  });
  slow.server().Get("/metrics", [&released](const httplib::Request&, httplib::Response& res) {
    for (int i = 0; i < 300 && !released; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    res.set_content("late 1\n", "text/plain");
  });
  ScrapeLimits limits;
  limits.timeout = std::chrono::milliseconds(300);
  std::vector<Scrape> scrapes =
      ScrapeAll(Targets({good.endpoint(), DeadEndpoint(), bad_status.endpoint(),
                         malformed.endpoint(), slow.endpoint()}),
                limits);
  released = true;
  ASSERT_EQ(scrapes.size(), 5u);
  ASSERT_TRUE(scrapes[0].exposition.ok()) << scrapes[0].exposition.status();
  EXPECT_EQ(scrapes[0].endpoint, good.endpoint());
  EXPECT_EQ(scrapes[0].exposition->samples[0].value, 12);
  EXPECT_GT(scrapes[0].at_seconds, 0);
  EXPECT_THAT(scrapes[1].exposition.status().message(),
              HasSubstr("cannot reach it (httplib: Connection)"));
  EXPECT_EQ(scrapes[2].exposition.status().message(), "GET /metrics answered HTTP 503");
  EXPECT_THAT(scrapes[3].exposition.status().message(), HasSubstr("malformed metrics: line 2: "));
  EXPECT_EQ(scrapes[4].exposition.status().message(), "no answer within 300 ms (httplib: Read)")
      << "an endpoint slower than the timeout is down";
}

TEST(ScrapeAllTest, AnAnswerOverTheSizeLimitIsRefused) {
  FixtureServer big;
  big.server().Get("/metrics", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string(4096, '#'), "text/plain");
  });
  ScrapeLimits limits;
  limits.max_body_bytes = 1000;
  std::vector<Scrape> scrapes = ScrapeAll(Targets({big.endpoint()}), limits);
  EXPECT_EQ(scrapes[0].exposition.status().message(), "the answer is over 1000 bytes");
}

}  // namespace
}  // namespace kvrail::top
