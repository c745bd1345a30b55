#include "engine/zmq_auth/zap_handler.h"

#include <zmq.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/zmq_auth/curve.h"
#include "gtest/gtest.h"

namespace kvrail::zmq_auth {
namespace {

KeyFile Key(KeyRole role, int rank) {
  absl::StatusOr<KeyFile> key = GenerateKeyFile({role, rank, ""});
  EXPECT_TRUE(key.ok()) << key.status();
  return *key;
}

void NoLinger(void* socket) {
  const int linger = 0;
  zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof(linger));
}

// A CURVE PULL server socket of `context` bound to an ephemeral port; `endpoint` says where.
void* BindCurvePull(void* context, const KeyFile& key, std::string& endpoint) {
  void* pull = zmq_socket(context, ZMQ_PULL);
  NoLinger(pull);
  EXPECT_TRUE(MakeCurveServer(pull, key).ok());
  EXPECT_EQ(zmq_bind(pull, "tcp://127.0.0.1:*"), 0);
  char bound[256];
  size_t size = sizeof(bound);
  zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, bound, &size);
  endpoint = bound;
  return pull;
}

// A CURVE PULL server with its ZAP handler, in a context of its own, and PUSH clients.
class ZapHandlerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_key_ = Key(KeyRole::kPrefill, 1);
    allowed_key_ = Key(KeyRole::kDecode, 3);
    auto allowed = AllowedKeys::FromKeys({allowed_key_});
    ASSERT_TRUE(allowed.ok());
    allowed_ = std::make_shared<const AllowedKeys>(*std::move(allowed));
    context_ = zmq_ctx_new();
    ZapOptions options;
    options.allowed = allowed_;
    options.on_refusal = [this](const std::string& address, const std::string& reason) {
      std::lock_guard<std::mutex> lock(mu_);
      refusals_.push_back(absl::StrCat(address, ": ", reason));
    };
    absl::StatusOr<std::unique_ptr<ZapHandler>> zap = ZapHandler::Start(context_, options);
    ASSERT_TRUE(zap.ok()) << zap.status();
    zap_ = *std::move(zap);
    pull_ = BindCurvePull(context_, server_key_, endpoint_);
    client_context_ = zmq_ctx_new();
  }
  void TearDown() override {
    for (void* push : pushes_) zmq_close(push);
    zmq_ctx_term(client_context_);
    zmq_close(pull_);
    zap_->Stop();  // before the context terminates: zmq_ctx_term waits for its socket
    zmq_ctx_term(context_);
  }

  // A PUSH client to `endpoint`; with `key`, a CURVE client of the server's public key.
  void* Push(const std::optional<KeyFile>& key, const std::string& endpoint) {
    void* push = zmq_socket(client_context_, ZMQ_PUSH);
    NoLinger(push);
    if (key) {
      EXPECT_TRUE(MakeCurveClient(push, *key, server_key_.public_key).ok());
    }
    EXPECT_EQ(zmq_connect(push, endpoint.c_str()), 0);
    pushes_.push_back(push);
    return push;
  }
  void* Push(const std::optional<KeyFile>& key) { return Push(key, endpoint_); }

  // The next message's text and User-Id within `timeout_ms`; nullopt when none came.
  std::optional<std::pair<std::string, std::optional<std::string>>> Receive(int timeout_ms) {
    zmq_pollitem_t item{pull_, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, timeout_ms) <= 0) return std::nullopt;
    zmq_msg_t message;
    zmq_msg_init(&message);
    if (zmq_msg_recv(&message, pull_, ZMQ_DONTWAIT) < 0) return std::nullopt;
    std::string text(static_cast<const char*>(zmq_msg_data(&message)), zmq_msg_size(&message));
    std::optional<std::string> user_id = UserIdOf(&message);
    zmq_msg_close(&message);
    return std::make_pair(text, user_id);
  }

  std::vector<std::string> Refusals() {
    std::lock_guard<std::mutex> lock(mu_);
    return refusals_;
  }

  KeyFile server_key_;
  KeyFile allowed_key_;
  std::shared_ptr<const AllowedKeys> allowed_;
  void* context_ = nullptr;
  void* client_context_ = nullptr;
  void* pull_ = nullptr;
  std::unique_ptr<ZapHandler> zap_;
  std::string endpoint_;
  std::vector<void*> pushes_;
  std::mutex mu_;
  std::vector<std::string> refusals_;
};

TEST_F(ZapHandlerTest, AnAllowedKeyDeliversAndItsUserIdComesWithTheMessage) {
  void* push = Push(allowed_key_);
  ASSERT_EQ(zmq_send(push, "hello", 5, 0), 5);
  auto received = Receive(5000);
  ASSERT_TRUE(received.has_value());
  EXPECT_EQ(received->first, "hello");
  EXPECT_EQ(received->second, "decode:3:decode-3");
  EXPECT_EQ(zap_->accepted(), 1u);
  EXPECT_TRUE(Refusals().empty());
}

TEST_F(ZapHandlerTest, AnUnknownKeyNeverDeliversAndIsReported) {
  void* push = Push(Key(KeyRole::kDecode, 3));  // the right role and rank, but not listed
  ASSERT_EQ(zmq_send(push, "forged", 6, ZMQ_DONTWAIT), 6);
  EXPECT_FALSE(Receive(500).has_value());
  EXPECT_GE(zap_->refused(), 1u);
  const std::vector<std::string> refusals = Refusals();
  ASSERT_FALSE(refusals.empty());
  EXPECT_NE(refusals[0].find("is not in the allowed keys"), std::string::npos) << refusals[0];
  EXPECT_NE(refusals[0].find("127.0.0.1"), std::string::npos) << refusals[0];
}

TEST_F(ZapHandlerTest, APlainClientNeverDelivers) {
  void* push = Push(std::nullopt);
  (void)zmq_send(push, "plain", 5, ZMQ_DONTWAIT);
  EXPECT_FALSE(Receive(500).has_value());
  // The allowed peer still gets through afterwards.
  ASSERT_EQ(zmq_send(Push(allowed_key_), "real", 4, 0), 4);
  auto received = Receive(5000);
  ASSERT_TRUE(received.has_value());
  EXPECT_EQ(received->first, "real");
}

TEST_F(ZapHandlerTest, APolicyRefusesAllowedKeysOfAnotherRole) {
  // A second context whose servers take only engine keys.
  void* context = zmq_ctx_new();
  ZapOptions options;
  options.allowed = allowed_;
  options.admit = [](const KeyIdentity& identity) {
    return identity.role == KeyRole::kEngine ? absl::OkStatus()
                                             : absl::PermissionDeniedError("engines only");
  };
  std::mutex mu;
  std::string reason;
  options.on_refusal = [&](const std::string&, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    reason = why;
  };
  auto zap = ZapHandler::Start(context, options);
  ASSERT_TRUE(zap.ok());
  EXPECT_FALSE(ZapHandler::Start(context, options).ok());  // one handler per context
  std::string endpoint;
  void* pull = BindCurvePull(context, server_key_, endpoint);
  (void)zmq_send(Push(allowed_key_, endpoint), "x", 1, ZMQ_DONTWAIT);
  zmq_pollitem_t item{pull, 0, ZMQ_POLLIN, 0};
  EXPECT_EQ(zmq_poll(&item, 1, 500), 0);
  zmq_close(pull);
  (*zap)->Stop();
  zmq_ctx_term(context);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(reason, "decode:3:decode-3 refused: engines only");
}

}  // namespace
}  // namespace kvrail::zmq_auth
