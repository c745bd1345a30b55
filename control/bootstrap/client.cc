#include "control/bootstrap/client.h"

#include <httplib.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "control/bootstrap/bearer_token.h"
#include "engine/base/error.h"

namespace kvrail::bootstrap {
namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

constexpr size_t kExcerptBytes = 200;

std::string Excerpt(absl::string_view body) {
  std::string out = absl::CHexEscape(body.substr(0, kExcerptBytes));
  if (body.size() > kExcerptBytes) absl::StrAppend(&out, "... (", body.size(), " bytes)");
  return absl::StrCat("\"", out, "\"");
}

void SetTimeout(milliseconds timeout, const std::function<void(time_t, time_t)>& set) {
  const int64_t ms = std::max<int64_t>(timeout.count(), 1);
  set(static_cast<time_t>(ms / 1000), static_cast<time_t>((ms % 1000) * 1000));
}

bool IsTimeout(httplib::Error error) {
  return error == httplib::Error::Read || error == httplib::Error::ConnectionTimeout;
}

}  // namespace

BootstrapClient::BootstrapClient(std::string host, int port, BootstrapClientOptions options)
    : host_(std::move(host)), port_(port), options_(options) {}

std::string BootstrapClient::address() const { return absl::StrCat(host_, ":", port_); }

absl::StatusOr<BootstrapClient::Answer> BootstrapClient::Call(
    const std::string& method, const std::string& target, const std::string& body, int retries,
    const NotReady& not_ready, std::optional<Clock::time_point> call_deadline) const {
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = call_deadline.value_or(start + options_.deadline);
  const std::string request = absl::StrCat("bootstrap ", address(), ": ", method, " ", target);
  milliseconds backoff = options_.backoff;
  int attempts = 0;
  int transport_failures = 0;
  std::string last_problem = "no attempt fitted in the deadline";
  bool last_was_timeout = false;
  bool answered = false;  // the server answered an earlier attempt (last_problem says how)
  auto elapsed = [&start] { return duration_cast<milliseconds>(Clock::now() - start).count(); };

  while (true) {
    const milliseconds remaining = duration_cast<milliseconds>(deadline - Clock::now());
    if (remaining.count() <= 0) break;
    ++attempts;
    httplib::Client http(host_, port_);
    SetTimeout(std::min(options_.connect_timeout, remaining),
               [&http](time_t s, time_t us) { http.set_connection_timeout(s, us); });
    SetTimeout(std::min(options_.read_timeout, remaining), [&http](time_t s, time_t us) {
      http.set_read_timeout(s, us);
      http.set_write_timeout(s, us);
    });
    httplib::Headers headers;
    if (method == "PUT" && !options_.bearer_token.empty()) {
      headers.emplace(kAuthorizationHeader, BearerAuthorization(options_.bearer_token));
    }
    httplib::Result result = method == "PUT"
                                 ? http.Put(target.c_str(), headers, body, "application/json")
                                 : http.Get(target.c_str());
    if (!result) {
      // An attempt whose timeouts the deadline cut short, after the server had answered: the
      // answer says more than this attempt's timeout does, so it stays the reason.
      const bool cut_short =
          remaining < options_.connect_timeout || remaining < options_.read_timeout;
      if (answered && cut_short && IsTimeout(result.error())) break;
      ++transport_failures;
      last_was_timeout = IsTimeout(result.error());
      last_problem =
          last_was_timeout
              ? absl::StrCat("no answer within the timeouts (connect ",
                             options_.connect_timeout.count(), " ms, read ",
                             options_.read_timeout.count(),
                             " ms; httplib: ", httplib::to_string(result.error()), ")")
              : absl::StrCat(
                    "cannot reach the server (httplib: ", httplib::to_string(result.error()), ")");
      if (transport_failures > retries) break;
    } else {
      Answer answer{result->status, result->body, result->has_header(kKvrailNodeHeader)};
      std::optional<std::string> why = not_ready ? not_ready(answer) : std::nullopt;
      if (!why.has_value()) return answer;
      answered = true;
      last_was_timeout = true;
      last_problem = *why;
    }
    const milliseconds wait =
        std::min(backoff, duration_cast<milliseconds>(deadline - Clock::now()));
    if (wait.count() > 0) std::this_thread::sleep_for(wait);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
  const std::string message =
      absl::StrCat(request, ": ", last_problem, " (gave up after ", attempts, " attempt",
                   attempts == 1 ? "" : "s", " in ", elapsed(), " ms)");
  return last_was_timeout ? absl::DeadlineExceededError(message) : absl::UnavailableError(message);
}

absl::Status BootstrapClient::Refused(const std::string& method, const std::string& target,
                                      const Answer& answer) const {
  const std::string message = absl::StrCat("bootstrap ", address(), ": ", method, " ", target,
                                           ": answered ", answer.status, " ", Excerpt(answer.body));
  if (answer.status == 409) return absl::FailedPreconditionError(message);
  if (answer.status == 401) return absl::UnauthenticatedError(message);
  return absl::InvalidArgumentError(message);
}

absl::StatusOr<layout::Revision> BootstrapClient::ServerRevisionBy(
    Clock::time_point deadline) const {
  const std::string target = "/route?engine_rank=-1&target_dp_group=-1";
  KVRAIL_ASSIGN_OR_RETURN(Answer answer,
                          Call("GET", target, "", options_.retries, nullptr, deadline));
  if (answer.status != 200) return Refused("GET", target, answer);
  const nlohmann::json body = nlohmann::json::parse(answer.body, nullptr, false);
  if (!body.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("bootstrap ", address(), ": GET ", target,
                                                   ": body ", Excerpt(answer.body),
                                                   " is not a JSON object (CACHEPD §2.2)"));
  }
  // §12.4: a 2026-09 server always answers the member, null before any registration.
  return body.contains("cache_fields_by_stage") ? layout::Revision::k2026_09
                                                : layout::Revision::kSnapshot;
}

absl::StatusOr<layout::Revision> BootstrapClient::ServerRevision() const {
  return ServerRevisionBy(Clock::now() + options_.deadline);
}

absl::Status BootstrapClient::RegisterPrefillRank(const PrefillRegistration& registration,
                                                  layout::Revision* registered_form) const {
  const Clock::time_point deadline = Clock::now() + options_.deadline;
  const std::string target = "/route";
  layout::Revision form;
  if (options_.cachepd_revision.has_value()) {
    form = *options_.cachepd_revision;
  } else {
    KVRAIL_ASSIGN_OR_RETURN(form, ServerRevisionBy(deadline));
  }
  if (form == layout::Revision::kSnapshot) {
    for (const layout::GroupSpec& spec : registration.contract.group_specs) {
      if (spec.shard_count != 1) {
        return absl::FailedPreconditionError(absl::StrCat(
            "bootstrap ", address(), ": PUT /route: revision mismatch: group '", spec.group_id,
            "' has shard_count ", spec.shard_count, ", which the snapshot revision ",
            options_.cachepd_revision ? "this prefill is pinned to (--cachepd-revision)"
                                      : "the server speaks (no cache_fields_by_stage in its "
                                        "sync answer)",
            " cannot express (CACHEPD §12.8, §12.11)"));
      }
    }
  }
  PrefillRegistration in_form = registration;
  in_form.contract.revision = form;
  absl::StatusOr<std::string> body = SerializeRegistration(in_form);
  if (!body.ok()) {
    return AddContext(body.status(),
                      absl::StrCat("bootstrap ", address(), ": PUT /route: registration"));
  }
  KVRAIL_ASSIGN_OR_RETURN(Answer answer,
                          Call("PUT", target, *body, options_.retries, nullptr, deadline));
  if (answer.status != 200) return Refused("PUT", target, answer);
  if (registered_form != nullptr) *registered_form = form;
  return absl::OkStatus();
}

absl::StatusOr<plan::PrefillDescription> BootstrapClient::Sync(bool* kvrail_node) const {
  const std::string target = "/route?engine_rank=-1&target_dp_group=-1";
  // §2.2: every member is null until the first registration.
  const NotReady not_ready = [](const Answer& answer) -> std::optional<std::string> {
    if (answer.status != 200) return std::nullopt;
    const nlohmann::json body = nlohmann::json::parse(answer.body, nullptr, false);
    if (!body.is_object()) return std::nullopt;
    for (const char* member : {"prefill_tp_size", "prefill_dp_size", "cache_layout"}) {
      auto it = body.find(member);
      if (it != body.end() && it->is_null()) {
        return absl::StrCat("the prefill node is not ready: ", member,
                            " is null, so no prefill rank has registered yet");
      }
    }
    return std::nullopt;
  };
  KVRAIL_ASSIGN_OR_RETURN(Answer answer, Call("GET", target, "", options_.retries, not_ready));
  if (answer.status != 200) return Refused("GET", target, answer);
  if (kvrail_node != nullptr) *kvrail_node = answer.kvrail_node;
  absl::StatusOr<plan::PrefillDescription> description = plan::ParsePrefillDescription(answer.body);
  if (!description.ok()) {
    return AddContext(description.status(), absl::StrCat("bootstrap ", address(), ": GET ", target,
                                                         ": body ", Excerpt(answer.body)));
  }
  return description;
}

absl::StatusOr<RankEndpoint> BootstrapClient::LookupRank(int rank_in_group, int dp_group) const {
  const std::string target =
      absl::StrCat("/route?engine_rank=", rank_in_group, "&target_dp_group=", dp_group);
  const NotReady not_ready = [rank_in_group,
                              dp_group](const Answer& answer) -> std::optional<std::string> {
    if (answer.status < 500) return std::nullopt;
    return absl::StrCat("prefill rank ", rank_in_group, " of dp group ", dp_group,
                        " is not registered (answered ", answer.status, " ", Excerpt(answer.body),
                        ")");
  };
  KVRAIL_ASSIGN_OR_RETURN(Answer answer, Call("GET", target, "", options_.retries, not_ready));
  if (answer.status != 200) return Refused("GET", target, answer);
  const nlohmann::json body = nlohmann::json::parse(answer.body, nullptr, false);
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("bootstrap ", address(), ": GET ", target,
                                                   ": body ", Excerpt(answer.body), " ", what,
                                                   " (CACHEPD §2.2)"));
  };
  if (!body.is_object()) return bad("is not a JSON object");
  auto ip = body.find("rank_ip");
  if (ip == body.end() || !ip->is_string() || ip->get_ref<const std::string&>().empty()) {
    return bad("has no rank_ip string");
  }
  auto port = body.find("rank_port");
  if (port == body.end() || !port->is_number_integer() || port->get<int64_t>() < 1 ||
      port->get<int64_t>() > 65535) {
    return bad("has no rank_port integer in 1..65535");
  }
  RankEndpoint endpoint{ip->get<std::string>(), static_cast<int>(port->get<int64_t>())};
  if (auto key = body.find("curve_public_key"); key != body.end()) {
    if (!key->is_string()) return bad("has a curve_public_key that is not a string");
    endpoint.curve_public_key = key->get<std::string>();
  }
  return endpoint;
}

absl::Status BootstrapClient::Health() const {
  const std::string target = "/health";
  KVRAIL_ASSIGN_OR_RETURN(Answer answer, Call("GET", target, "", /*retries=*/0, nullptr));
  if (answer.status != 200) return Refused("GET", target, answer);
  return absl::OkStatus();
}

}  // namespace kvrail::bootstrap
