#include "tests/transfer/harness.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "control/error/error.h"
#include "engine/memory/arena.h"
#include "engine/memory/pattern.h"
#include "tools/process/subprocess.h"

namespace kvrail::testing {
namespace {

using process::Subprocess;

std::string Name(const char* role, int rank) {
  return absl::StrCat("/kvrail-xfer-", process::ProcessTag(), "-", role, rank);
}

bool AllZero(const uint8_t* bytes, uint64_t length) {
  // Compare in 64 KiB chunks against a zero page.
  static const std::vector<uint8_t> zeros(65536, 0);
  while (length > 0) {
    const uint64_t n = std::min<uint64_t>(length, zeros.size());
    if (std::memcmp(bytes, zeros.data(), n) != 0) return false;
    bytes += n;
    length -= n;
  }
  return true;
}

}  // namespace

std::string NodePath() {
  char resolved[PATH_MAX];
  if (realpath("tests/transfer/transfer_node", resolved) != nullptr) return resolved;
  return "tests/transfer/transfer_node";
}

absl::StatusOr<HarnessResult> RunTransfer(const RouteSetup& setup, const HarnessOptions& options) {
  KVRAIL_ASSIGN_OR_RETURN(const layout::Contract prefill_contract,
                          ContractFor(setup, setup.prefill_tp));
  KVRAIL_ASSIGN_OR_RETURN(const layout::Contract decode_contract,
                          ContractFor(setup, setup.decode_tp));
  // The engines' arenas: patterned prefill pages, zeroed decode pages.
  std::vector<Arena> prefill_arenas, decode_arenas;
  for (int p = 0; p < setup.prefill_tp; ++p) {
    KVRAIL_ASSIGN_OR_RETURN(Arena arena,
                            Arena::CreateShared(Name("p", p), prefill_contract.ArenaBytes()));
    FillPattern(absl::MakeSpan(arena.data(), arena.size()), PrefillSeed(p));
    prefill_arenas.push_back(std::move(arena));
  }
  for (int d = 0; d < setup.decode_tp; ++d) {
    KVRAIL_ASSIGN_OR_RETURN(Arena arena,
                            Arena::CreateShared(Name("d", d), decode_contract.ArenaBytes()));
    decode_arenas.push_back(std::move(arena));
  }
  const std::string node = NodePath();
  const std::string lanes = "2";
  std::vector<std::unique_ptr<Subprocess>> decodes, prefills;
  std::vector<std::string> sessions;
  for (int d = 0; d < setup.decode_tp; ++d) {
    std::vector<std::string> argv = options.decode_prefix;
    for (const std::string& a :
         {node, std::string("decode"), std::string("--arena"), Name("d", d), std::string("--tls"),
          options.tls, std::string("--bind"), options.decode_bind, std::string("--lanes"), lanes}) {
      argv.push_back(a);
    }
    if (options.tls == "tcp") {
      argv.push_back("--net-devices");
      argv.push_back(options.decode_net_devices);
    }
    KVRAIL_ASSIGN_OR_RETURN(auto child, Subprocess::Start(argv));
    KVRAIL_ASSIGN_OR_RETURN(std::string session, child->ReadUntil("session ", absl::Seconds(30)));
    sessions.push_back(session);
    decodes.push_back(std::move(child));
  }
  for (int p = 0; p < setup.prefill_tp; ++p) {
    std::vector<std::string> argv = options.prefill_prefix;
    for (const std::string& a :
         {node, std::string("prefill"), std::string("--arena"), Name("p", p), std::string("--tls"),
          options.tls, std::string("--lanes"), lanes, std::string("--prefill-tp"),
          absl::StrCat(setup.prefill_tp), std::string("--rank"), absl::StrCat(p),
          std::string("--decode-tp"), absl::StrCat(setup.decode_tp), std::string("--rooms"),
          absl::StrCat(options.rooms), std::string("--room-pages"),
          absl::StrCat(setup.room_pages)}) {
      argv.push_back(a);
    }
    if (options.tls == "tcp") {
      argv.push_back("--net-devices");
      argv.push_back(options.prefill_net_devices);
    }
    for (const std::string& a : options.prefill_args) argv.push_back(a);
    int targets = 0;
    for (int d = 0; d < setup.decode_tp; ++d) {
      KVRAIL_ASSIGN_OR_RETURN(plan::CopyList copies, RoomCopies(setup, p, d));
      if (copies.empty()) continue;
      argv.push_back("--target");
      argv.push_back(absl::StrCat(d, "=", sessions[d]));
      ++targets;
    }
    if (targets == 0) continue;
    KVRAIL_ASSIGN_OR_RETURN(auto child, Subprocess::Start(argv));
    prefills.push_back(std::move(child));
  }
  HarnessResult result;
  absl::Time killed = absl::InfiniteFuture();
  if (options.kill_decode_after_submit) {
    for (auto& prefill : prefills) {
      absl::StatusOr<std::string> line = prefill->ReadUntil("submitted", options.timeout);
      if (!line.ok()) return AddContext(line.status(), "prefill node");
    }
    decodes[0]->Signal(SIGKILL);
    killed = absl::Now();
  }
  for (auto& prefill : prefills) {
    absl::StatusOr<std::string> line = prefill->ReadUntil("result ", options.timeout);
    if (!line.ok()) return AddContext(line.status(), "prefill node");
    KVRAIL_ASSIGN_OR_RETURN(const int code, prefill->Wait(absl::Seconds(30)));
    if (options.expect_failure) {
      if (!absl::StartsWith(*line, "failed ") || code != 3) {
        return absl::InternalError(absl::StrCat("prefill node pid ", prefill->pid(),
                                                " should have failed, but: ", *line, " (exit ",
                                                code, ")"));
      }
      result.failures.push_back(*line);
      if (killed != absl::InfiniteFuture()) result.failure_latency = absl::Now() - killed;
      continue;
    }
    if (!absl::StartsWith(*line, "ok ")) {
      return absl::InternalError(absl::StrCat("prefill node pid ", prefill->pid(), ": ", *line));
    }
    const std::vector<std::string> parts = absl::StrSplit(*line, ' ');
    double seconds = 0;
    if (parts.size() == 3 && absl::SimpleAtod(parts[2], &seconds)) {
      result.seconds = std::max(result.seconds, seconds);
    }
    if (code != 0) return absl::InternalError(absl::StrCat("prefill node exited ", code));
  }
  if (options.expect_failure) {
    if (!options.kill_decode_after_submit) {
      for (int d = 0; d < setup.decode_tp; ++d) {
        if (!AllZero(decode_arenas[d].data(), decode_arenas[d].size())) {
          return absl::DataLossError(
              absl::StrCat("decode ", d, ": a rejected room wrote bytes into the arena"));
        }
        result.bytes_untouched += decode_arenas[d].size();
      }
    }
    for (auto& decode : decodes) decode->CloseStdin();
    return result;
  }
  // Verify from this process: the decode arenas are still mapped by their nodes and by us.
  for (int d = 0; d < setup.decode_tp; ++d) {
    struct Range {
      uint64_t dst, length, src;
      int p;
    };
    std::vector<Range> ranges;
    for (int p = 0; p < setup.prefill_tp; ++p) {
      KVRAIL_ASSIGN_OR_RETURN(plan::CopyList copies, RoomCopies(setup, p, d));
      for (const plan::Copy& c : copies)
        ranges.push_back({c.dst_offset, c.length, c.src_offset, p});
    }
    std::sort(ranges.begin(), ranges.end(),
              [](const Range& a, const Range& b) { return a.dst < b.dst; });
    const uint8_t* dst = decode_arenas[d].data();
    uint64_t cursor = 0;
    for (const Range& r : ranges) {
      if (r.dst < cursor) {
        return absl::InternalError(
            absl::StrCat("decode ", d, ": planned copies overlap at ", r.dst));
      }
      if (!AllZero(dst + cursor, r.dst - cursor)) {
        return absl::DataLossError(absl::StrCat("decode ", d, ": bytes [", cursor, ", ", r.dst,
                                                ") outside every copy were written"));
      }
      result.bytes_untouched += r.dst - cursor;
      if (std::memcmp(dst + r.dst, prefill_arenas[r.p].data() + r.src, r.length) != 0) {
        return absl::DataLossError(absl::StrCat("decode ", d, ": copy from prefill ", r.p, " src ",
                                                r.src, " to dst ", r.dst, " (", r.length,
                                                " bytes) differs"));
      }
      result.bytes_verified += r.length;
      cursor = r.dst + r.length;
    }
    const uint64_t size = decode_arenas[d].size();
    if (!AllZero(dst + cursor, size - cursor)) {
      return absl::DataLossError(
          absl::StrCat("decode ", d, ": bytes after the last copy were written"));
    }
    result.bytes_untouched += size - cursor;
  }
  for (auto& decode : decodes) {
    decode->CloseStdin();
    KVRAIL_ASSIGN_OR_RETURN(const int code, decode->Wait(absl::Seconds(30)));
    if (code != 0) return absl::InternalError(absl::StrCat("decode node exited ", code));
  }
  return result;
}

}  // namespace kvrail::testing
