#include "engine/transport/zmq_request/zmq_request.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <iterator>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/support/silent_listener.h"

namespace kvrail::transport {
namespace {

// A ROUTER that answers each request with its frames reversed, or not at all when the first
// frame is "quiet".
class EchoServer {
 public:
  EchoServer() : router_(SharedZmqContext(), zmq::socket_type::router) {
    router_.set(zmq::sockopt::linger, 0);
    router_.bind("tcp://127.0.0.1:0");
    endpoint_ = router_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this] { Run(); });
  }
  ~EchoServer() {
    stop_.store(true);
    thread_.join();
  }
  const std::string& endpoint() const { return endpoint_; }

 private:
  void Run() {
    while (!stop_.load()) {
      zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, std::chrono::milliseconds(20)) == 0) continue;
      std::vector<zmq::message_t> request;
      if (!zmq::recv_multipart(router_, std::back_inserter(request))) continue;
      if (request.size() > 1 && request[1].to_string() == "quiet") continue;
      std::vector<zmq::message_t> reply;
      reply.push_back(std::move(request[0]));
      for (size_t i = request.size(); i-- > 1;) reply.push_back(std::move(request[i]));
      zmq::send_multipart(router_, reply);
    }
  }
  zmq::socket_t router_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(RequestAllTest, EachRequestGetsItsOwnOutcomeWithinOneDeadline) {
  EchoServer server;
  test_support::SilentListener listener;
  ASSERT_TRUE(listener.bound());
  const std::string silent = absl::StrCat("tcp://127.0.0.1:", listener.port());
  const absl::Time start = absl::Now();
  const std::vector<ZmqReply> replies = RequestAll({{server.endpoint(), {"a", "b"}},
                                                    {silent, {"a"}},
                                                    {server.endpoint(), {"quiet"}},
                                                    {"no-scheme", {"a"}},
                                                    {server.endpoint(), {"c"}}},
                                                   absl::Milliseconds(300));
  // The silent port and the quiet request share the one deadline (with room for a loaded
  // machine).
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  ASSERT_EQ(replies.size(), 5u);
  EXPECT_EQ(replies[0].outcome, ZmqReply::Outcome::kReplied);
  EXPECT_EQ(replies[0].frames, (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(replies[1].outcome, ZmqReply::Outcome::kNoConnection);
  EXPECT_EQ(replies[2].outcome, ZmqReply::Outcome::kNoReply);
  EXPECT_EQ(replies[3].outcome, ZmqReply::Outcome::kFailed);
  EXPECT_NE(replies[3].error.message().find("no-scheme"), std::string::npos);
  EXPECT_EQ(replies[4].outcome, ZmqReply::Outcome::kReplied);
  EXPECT_EQ(replies[4].frames, (std::vector<std::string>{"c"}));
}

TEST(RequestAllTest, AReplyOverTheBoundIsNeverTaken) {
  EchoServer server;
  const std::vector<ZmqReply> replies =
      RequestAll({{server.endpoint(), {std::string(4096, 'x')}, /*max_reply_bytes=*/1024}},
                 absl::Milliseconds(300));
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_NE(replies[0].outcome, ZmqReply::Outcome::kReplied);
}

TEST(RequestAllTest, NoRequestsIsNoReplies) {
  EXPECT_TRUE(RequestAll({}, absl::Seconds(1)).empty());
}

}  // namespace
}  // namespace kvrail::transport
