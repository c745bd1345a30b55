#include "control/registry/bootstrap_store.h"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "control/registry/etcd_client.h"
#include "control/registry/keys.h"

namespace kvrail::registry {

absl::StatusOr<std::unique_ptr<BootstrapStore>> BootstrapStore::Open(
    const std::string& registry_url, absl::Duration ttl) {
  absl::StatusOr<std::string> endpoint = ParseRegistryUrl(registry_url);
  if (!endpoint.ok()) return endpoint.status();
  absl::StatusOr<std::unique_ptr<LeasePublisher>> leased = LeasePublisher::Start(*endpoint, ttl);
  if (!leased.ok()) return leased.status();
  return std::unique_ptr<BootstrapStore>(new BootstrapStore(*endpoint, *std::move(leased)));
}

BootstrapStore::BootstrapStore(std::string endpoint, std::unique_ptr<LeasePublisher> leased)
    : endpoint_(std::move(endpoint)), leased_(std::move(leased)) {}

BootstrapStore::~BootstrapStore() { Stop(); }

absl::StatusOr<std::vector<std::string>> BootstrapStore::Bind(const std::string& address) {
  const std::string prefix = BootstrapPrefix(address);
  absl::StatusOr<std::vector<KeyValue>> stored = EtcdClient(endpoint_).List(prefix + "ranks/");
  if (!stored.ok()) return stored.status();
  // The writer's client, used on its thread only.
  auto client = std::make_shared<EtcdClient>(endpoint_);
  auto queue = std::make_unique<WriteQueue>(
      [client](const std::string& key, const std::string& body) {
        return client->Put(key, body).status();
      },
      WriteQueueOptions{absl::StrCat("registry writer (etcd at ", endpoint_, ")")});
  {
    std::lock_guard<std::mutex> lock(mu_);
    address_ = address;
    for (const auto& [suffix, body] : early_) queue->Put(prefix + suffix, body);
    early_.clear();
    queue_ = std::move(queue);
  }
  std::vector<std::string> bodies;
  for (KeyValue& kv : *stored) bodies.push_back(std::move(kv.value));
  return bodies;
}

void BootstrapStore::Save(int dp_group, int rank_in_group, const std::string& body) {
  const std::string suffix = absl::StrCat("ranks/", dp_group, "/", rank_in_group);
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_ == nullptr) {
    early_[suffix] = body;
  } else if (!queue_->Put(BootstrapPrefix(address_) + suffix, body)) {
    spdlog::warn("event=registry_save_dropped key={}{} reason=\"the server is stopping\"",
                 BootstrapPrefix(address_), suffix);
  }
}

void BootstrapStore::PublishNode(const std::string& description) {
  std::string key;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (address_.empty()) return;
    key = NodeKey(address_);
  }
  leased_->Publish(key, description);
}

bool BootstrapStore::AwaitNodeWritten(absl::Duration timeout) {
  return leased_->AwaitWritten(timeout);
}

void BootstrapStore::Stop(absl::Duration flush_deadline) {
  leased_->Stop();
  WriteQueue* queue = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue = queue_.get();
  }
  // Outside mu_: a Save meanwhile finds the queue stopping and drops its body, logged.
  if (queue != nullptr) queue->Stop(flush_deadline);
}

std::string BootstrapAddress(const std::string& host, int port) {
  std::string name = host;
  if (name.empty() || name == "0.0.0.0" || name == "::" || name == "*") {
    char buffer[256] = {};
    name = gethostname(buffer, sizeof(buffer) - 1) == 0 ? buffer : "localhost";
  }
  return absl::StrCat(name, ":", port);
}

std::vector<std::string> ReplayRegistrations(const std::string& host, int port,
                                             const std::string& token,
                                             const std::vector<std::string>& bodies) {
  const std::string target = host.empty() || host == "0.0.0.0" || host == "*" ? "127.0.0.1"
                             : host == "::"                                   ? "[::1]"
                                                                              : host;
  httplib::Client client(absl::StrCat("http://", target, ":", port));
  client.set_connection_timeout(2, 0);
  client.set_read_timeout(5, 0);
  httplib::Headers headers;
  if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
  std::vector<std::string> refused;
  for (const std::string& body : bodies) {
    auto answer = client.Put("/route", headers, body, "application/json");
    if (!answer) {
      refused.push_back(absl::StrCat("replaying a stored registration: PUT /route: ",
                                     httplib::to_string(answer.error())));
    } else if (answer->status != 200) {
      refused.push_back(absl::StrCat("replaying a stored registration: PUT /route answered ",
                                     answer->status, ": ", answer->body.substr(0, 200)));
    }
  }
  return refused;
}

}  // namespace kvrail::registry
