#include "control/registry/prefix_watcher.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "control/registry/gateway_json.h"
#include "engine/sync/thread_name.h"

namespace kvrail::registry {
namespace {

using nlohmann::json;

constexpr size_t kMaxLineBytes = 4 * kMaxValueBytes;

}  // namespace

absl::StatusOr<std::unique_ptr<PrefixWatcher>> PrefixWatcher::Start(
    const std::string& endpoint, const std::string& prefix, Handler handler,
    absl::Duration reconnect_every) {
  auto watcher = std::unique_ptr<PrefixWatcher>(
      new PrefixWatcher(endpoint, prefix, std::move(handler), reconnect_every));
  auto revision = watcher->Relist();
  if (!revision.ok()) return revision.status();
  watcher->thread_ = std::thread([w = watcher.get()] { w->Run(); });
  NameThread(watcher->thread_, "kvrail-regwatch");
  return watcher;
}

PrefixWatcher::PrefixWatcher(const std::string& endpoint, std::string prefix, Handler handler,
                             absl::Duration reconnect_every)
    : endpoint_(endpoint),
      prefix_(std::move(prefix)),
      handler_(std::move(handler)),
      reconnect_every_(reconnect_every),
      client_(endpoint),
      stream_client_(std::make_unique<httplib::Client>(absl::StrCat("http://", endpoint))),
      outage_(absl::StrCat("registry watcher of ", prefix_, " (etcd at ", endpoint, ")")) {
  const int64_t us = absl::ToInt64Microseconds(reconnect_every_);
  stream_client_->set_connection_timeout(2, 0);
  stream_client_->set_read_timeout(us / 1000000, us % 1000000);
}

PrefixWatcher::~PrefixWatcher() { Stop(); }

void PrefixWatcher::Stop() {
  // Not httplib's Client::stop(): its lock lives in Debian's uninstrumented library, which TSan
  // then reports as misused. A stream ends at its next event or read timeout instead.
  if (stop_.exchange(true)) return;
  if (thread_.joinable()) thread_.join();
}

void PrefixWatcher::Deliver(const WatchEvent& event) {
  if (event.type == WatchEvent::Type::kPut) {
    known_[event.key] = event.mod_revision;
  } else {
    known_.erase(event.key);
  }
  handler_(event);
}

absl::StatusOr<int64_t> PrefixWatcher::Relist() {
  int64_t revision = 0;
  auto listed = client_.List(prefix_, &revision);
  if (!listed.ok()) return listed.status();
  std::set<std::string> present;
  for (KeyValue& kv : *listed) {
    present.insert(kv.key);
    auto it = known_.find(kv.key);
    if (it != known_.end() && it->second == kv.mod_revision) continue;
    Deliver({WatchEvent::Type::kPut, std::move(kv.key), std::move(kv.value), kv.mod_revision});
  }
  std::vector<std::string> gone;
  for (const auto& [key, unused] : known_) {
    if (present.count(key) == 0) gone.push_back(key);
  }
  for (std::string& key : gone) Deliver({WatchEvent::Type::kDelete, std::move(key), "", revision});
  next_revision_ = revision + 1;
  need_relist_ = false;
  ++relists_;
  return revision;
}

bool PrefixWatcher::HandleLine(const std::string& line) {
  json message = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!message.is_object()) {
    spdlog::warn("registry watcher of {}: a stream line is not JSON; ignored", prefix_);
    return true;
  }
  if (message.contains("error")) {
    spdlog::warn("registry watcher of {}: etcd at {}: {}", prefix_, endpoint_,
                 message["error"].dump().substr(0, 200));
    need_relist_ = true;
    return false;
  }
  const json& result = message.contains("result") ? message["result"] : message;
  if (result.value("canceled", false)) {
    // Compacted past our revision (or cancelled by etcd): list afresh.
    need_relist_ = true;
    return false;
  }
  auto events = result.find("events");
  if (events != result.end() && events->is_array()) {
    for (const json& event : *events) {
      const json kv = event.value("kv", json::object());
      auto parsed = ParseGatewayKeyValue(kv);
      if (!parsed.ok()) {
        spdlog::warn("registry watcher of {}: {}; event ignored", prefix_,
                     std::string(parsed.status().message()));
        continue;
      }
      WatchEvent out;
      out.type = event.is_object() && event.value("type", std::string("PUT")) == "DELETE"
                     ? WatchEvent::Type::kDelete
                     : WatchEvent::Type::kPut;
      out.key = std::move(parsed->key);
      out.value = std::move(parsed->value);
      out.mod_revision = parsed->mod_revision;
      next_revision_ = std::max(next_revision_, out.mod_revision + 1);
      Deliver(out);
    }
  }
  return true;
}

absl::Status PrefixWatcher::Stream() {
  ++streams_;
  const json create = {{"create_request",
                        {{"key", absl::Base64Escape(prefix_)},
                         {"range_end", absl::Base64Escape(PrefixEnd(prefix_))},
                         {"start_revision", absl::StrCat(next_revision_)}}}};
  httplib::Request request;
  request.method = "POST";
  request.path = "/v3/watch";
  request.body = create.dump();
  request.set_header("Content-Type", "application/json");
  std::string pending;
  bool received = false;
  bool oversized = false;
  request.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
    received = true;
    pending.append(data, length);
    size_t newline;
    while ((newline = pending.find('\n')) != std::string::npos) {
      const std::string line = pending.substr(0, newline);
      pending.erase(0, newline + 1);
      if (oversized) {
        oversized = false;  // the rest of a line that was too long
        continue;
      }
      if (!line.empty() && !HandleLine(line)) return false;
    }
    if (pending.size() > kMaxLineBytes) {
      spdlog::warn("registry watcher of {}: a stream line longer than {} bytes; dropped", prefix_,
                   kMaxLineBytes);
      pending.clear();
      oversized = true;
    }
    return !stop_.load();
  };
  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  const bool sent = stream_client_->send(request, response, error);
  if (stop_.load() || need_relist_) return absl::OkStatus();
  // The read timeout ends a quiet stream: normal, reopened from next_revision_.
  if (!sent && error == httplib::Error::Read && received) return absl::OkStatus();
  if (!sent && error != httplib::Error::Read) {
    return absl::UnavailableError(
        absl::StrCat("etcd at ", endpoint_, ": watch ", prefix_, "*: ", httplib::to_string(error)));
  }
  if (sent && response.status != 200) {
    return absl::UnavailableError(
        absl::StrCat("etcd at ", endpoint_, ": watch ", prefix_, "* answered ", response.status));
  }
  return absl::OkStatus();
}

void PrefixWatcher::Run() {
  while (!stop_.load()) {
    absl::Status status = absl::OkStatus();
    if (need_relist_) {
      status = Relist().status();
    }
    if (status.ok()) status = Stream();
    if (stop_.load()) return;
    if (status.ok()) {
      outage_.Recovered();
      continue;
    }
    outage_.Failed(status);
    // etcd may come back empty (a new member): list again when it answers.
    need_relist_ = true;
    for (int i = 0; i < 10 && !stop_.load(); ++i) absl::SleepFor(absl::Milliseconds(100));
  }
}

}  // namespace kvrail::registry
