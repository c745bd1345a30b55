#include "bench/raw/raw_target.h"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/memory/arena.h"
#include "engine/memory/pattern.h"
#include "engine/transport/factory.h"
#include "engine/transport/transport.h"
#include "engine/transport/ucx/ucx_transport.h"

namespace kvrail::bench {
namespace {

bool ReadLine(std::FILE* in, std::string& line) {
  line.clear();
  int c;
  while ((c = std::fgetc(in)) != EOF) {
    if (c == '\n') return true;
    line.push_back(static_cast<char>(c));
  }
  return !line.empty();
}

void WriteLine(std::FILE* out, const std::string& line) {
  std::fputs(line.c_str(), out);
  std::fputc('\n', out);
  std::fflush(out);
}

}  // namespace

transport::TransportSpec TransportSpecFor(RawLink link, int lanes, const std::string& net_device,
                                          transport::LandingStores stores) {
  transport::TransportSpec spec;
  spec.lanes = lanes;
  if (link != RawLink::kVerbs) spec.landing_stores = stores;
  switch (link) {
    case RawLink::kShm:
      spec.backend = "ucx";
      spec.tls = "sm";  // UCX's "sm,self"
      break;
    case RawLink::kTcp:
    case RawLink::kNetns:
      spec.backend = "ucx";
      spec.tls = "tcp";
      spec.net_devices = net_device.empty() ? "lo" : net_device;
      break;
    case RawLink::kVerbs:
      spec.backend = "verbs";
      spec.verbs_provider.clear();  // KVRAIL_VERBS_PROVIDER, else libibverbs
      break;
  }
  // Slices are the bench's to choose; let the transport take any block whole.
  spec.max_write_bytes = kMaxBlockBytes;
  return spec;
}

transport::UcxOptions UcxOptionsFor(RawLink link, int lanes, const std::string& net_device) {
  const transport::TransportSpec spec =
      TransportSpecFor(link, lanes, net_device, transport::LandingStores::kPlain);
  transport::UcxOptions options;
  options.lanes = spec.lanes;
  options.tls = spec.tls == "sm" ? "sm,self" : spec.tls;
  options.net_devices = spec.net_devices;
  options.max_write_bytes = spec.max_write_bytes;
  return options;
}

absl::Status RunRawTarget(const RawTargetOptions& options, std::FILE* in, std::FILE* out) {
  absl::StatusOr<std::unique_ptr<transport::Transport>> made = transport::MakeTransport(
      TransportSpecFor(options.link, options.lanes, options.net_device, options.landing_stores));
  if (!made.ok()) return made.status();
  transport::Transport& data_plane = **made;
  // The arena a decode sidecar would give its engine: Allocate places it in UCX's own shared
  // memory when a shared-memory transport is loaded, where peers' puts are plain stores (a
  // memfd registered with every rail over verbs).
  auto shared = data_plane.Allocate(options.arena_bytes);
  if (!shared.ok()) return shared.status();
  auto* arena = static_cast<uint8_t*>(shared->base);
  const uint64_t arena_size = shared->length;
  // Map every page now, so no measured window pays the target's first-touch faults.
  for (uint64_t i = 0; i < arena_size; i += 4096) arena[i] = 0;
  auto descriptor = data_plane.LocalDescriptor();
  if (!descriptor.ok()) return descriptor.status();
  WriteLine(out, absl::StrCat("placement ", shared->placement));
  WriteLine(out,
            absl::StrCat("descriptor ", absl::BytesToHexString(descriptor->SerializeAsString())));

  std::string line;
  while (ReadLine(in, line)) {
    std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words.empty()) continue;
    if (words[0] == "exit") break;
    uint64_t offset = 0, length = 0, pattern_offset = 0;
    if (words[0] != "verify" || words.size() != 4 || !absl::SimpleAtoi(words[1], &offset) ||
        !absl::SimpleAtoi(words[2], &length) || !absl::SimpleAtoi(words[3], &pattern_offset)) {
      WriteLine(out, absl::StrCat("error unknown request: ", line));
      continue;
    }
    if (offset > arena_size || length > arena_size - offset) {
      WriteLine(out, absl::StrFormat("error range [%u, +%u) is outside the %u-byte arena", offset,
                                     length, arena_size));
      continue;
    }
    auto mismatch = FirstPatternMismatch(absl::MakeConstSpan(arena + offset, length),
                                         kRawPatternSeed, pattern_offset);
    WriteLine(out, mismatch.has_value() ? absl::StrCat("mismatch ", offset + *mismatch) : "ok");
  }
  data_plane.Close();
  return absl::OkStatus();
}

absl::StatusOr<TargetProcess> TargetProcess::Start(const std::vector<std::string>& exec_prefix,
                                                   const std::string& self_exe,
                                                   const RawTargetOptions& options) {
  process::SpawnOptions spec;
  spec.contained = true;
  spec.argv = exec_prefix;
  spec.argv.insert(
      spec.argv.end(),
      {self_exe, "bench", "raw-target", "--link", RawLinkName(options.link), "--lanes",
       absl::StrCat(options.lanes), "--arena-bytes", absl::StrCat(options.arena_bytes)});
  if (!options.net_device.empty()) {
    spec.argv.insert(spec.argv.end(), {"--net-device", options.net_device});
  }
  if (options.link != RawLink::kVerbs) {
    spec.argv.insert(spec.argv.end(),
                     {"--landing-stores", transport::LandingStoresName(options.landing_stores)});
  }
  if (!options.verbs_provider.empty()) {
    spec.env.emplace_back("KVRAIL_VERBS_PROVIDER", options.verbs_provider);
  }
  absl::StatusOr<std::unique_ptr<process::Subprocess>> child = process::Subprocess::Start(spec);
  if (!child.ok()) return child.status();
  TargetProcess target(std::move(*child));
  // Skips anything else on the way (a library's log line); the target sends its errors to
  // stderr and exits, which ends the wait.
  absl::StatusOr<std::string> line;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  do {
    line = target.child_->ReadLine(deadline - absl::Now());
    if (line.ok() && absl::StartsWith(*line, "placement ")) {
      target.placement_ = line->substr(std::string("placement ").size());
    }
  } while (line.ok() && !absl::StartsWith(*line, "descriptor "));
  if (!line.ok()) {
    // A target that failed closes its protocol stream before it prints its error: give it a
    // moment to print it (on our stderr) before the destructor kills it.
    if (absl::IsOutOfRange(line.status())) (void)target.child_->Wait(absl::Seconds(2));
    return absl::UnavailableError(
        absl::StrCat("target process did not send its descriptor: ", line.status().message()));
  }
  absl::string_view hex = *line;
  if (!absl::ConsumePrefix(&hex, "descriptor ") ||
      !target.descriptor_.ParseFromString(absl::HexStringToBytes(hex)) ||
      target.descriptor_.regions_size() != 1) {
    return absl::InternalError(
        absl::StrCat("target process: expected \"descriptor <hex>\" with one region, got: ",
                     line->substr(0, 120)));
  }
  return target;
}

absl::Status TargetProcess::Verify(uint64_t offset, uint64_t length, uint64_t pattern_offset) {
  absl::Status status =
      child_->WriteLine(absl::StrFormat("verify %u %u %u", offset, length, pattern_offset));
  if (!status.ok()) return status;
  absl::StatusOr<std::string> answer;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  do {
    answer = child_->ReadLine(deadline - absl::Now());
  } while (answer.ok() && *answer != "ok" && !absl::StartsWith(*answer, "mismatch") &&
           !absl::StartsWith(*answer, "error"));
  if (!answer.ok()) return answer.status();
  if (*answer == "ok") return absl::OkStatus();
  return absl::DataLossError(
      absl::StrFormat("target bytes [%u, +%u) should hold source bytes [%u, +%u): %s", offset,
                      length, pattern_offset, length, *answer));
}

absl::Status TargetProcess::Stop() {
  (void)child_->WriteLine("exit");
  child_->CloseStdin();
  absl::StatusOr<int> code = child_->Wait(absl::Seconds(30));
  if (!code.ok()) {
    child_->Stop();
    return absl::DeadlineExceededError(
        absl::StrCat("target process did not exit within 30 s of \"exit\"; killed"));
  }
  if (*code != 0) return absl::InternalError(absl::StrCat("target process exited with ", *code));
  return absl::OkStatus();
}

}  // namespace kvrail::bench
