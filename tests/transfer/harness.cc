#include "tests/transfer/harness.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cluster/process/subprocess.h"
#include "engine/base/error.h"
#include "engine/memory/arena.h"
#include "engine/memory/pattern.h"

namespace kvrail::testing {
namespace {

using process::Subprocess;

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

// The engines' arenas: patterned prefill pages, zeroed decode pages.
struct Arenas {
  std::vector<Arena> prefill, decode;
  // The decode arenas' bytes as the nodes see them (in `decode`, or in an allocated arena).
  std::vector<absl::Span<uint8_t>> decode_bytes;
};

absl::StatusOr<Arenas> CreateArenas(const RouteSetup& setup, bool decode_arenas = true) {
  KVRAIL_ASSIGN_OR_RETURN(const layout::Contract prefill_contract,
                          ContractFor(setup, setup.prefill_tp));
  KVRAIL_ASSIGN_OR_RETURN(const layout::Contract decode_contract,
                          ContractFor(setup, setup.decode_tp));
  Arenas arenas;
  for (int p = 0; p < setup.prefill_tp; ++p) {
    KVRAIL_ASSIGN_OR_RETURN(Arena arena,
                            Arena::CreateShared(ArenaName("p", p), prefill_contract.ArenaBytes()));
    FillPattern(absl::MakeSpan(arena.data(), arena.size()), PrefillSeed(p));
    arenas.prefill.push_back(std::move(arena));
  }
  for (int d = 0; d < setup.decode_tp && decode_arenas; ++d) {
    KVRAIL_ASSIGN_OR_RETURN(Arena arena,
                            Arena::CreateShared(ArenaName("d", d), decode_contract.ArenaBytes()));
    arenas.decode_bytes.push_back(absl::MakeSpan(arena.data(), arena.size()));
    arenas.decode.push_back(std::move(arena));
  }
  return arenas;
}

constexpr const char* kLanes = "2";

// Prefill rank p's command line, writing `rooms` rooms to every decode it sends to; nullopt when
// it sends to none.
absl::StatusOr<std::optional<std::vector<std::string>>> PrefillArgv(
    const RouteSetup& setup, const HarnessOptions& options, int p,
    const std::vector<std::string>& sessions, int rooms) {
  std::vector<std::string> argv = options.prefill_node.prefix;
  for (const std::string& a : {NodePath(),
                               std::string("prefill"),
                               std::string("--arena"),
                               ArenaName("p", p),
                               std::string("--tls"),
                               options.tls,
                               std::string("--lanes"),
                               std::string(kLanes),
                               std::string("--prefill-tp"),
                               absl::StrCat(setup.prefill_tp),
                               std::string("--rank"),
                               absl::StrCat(p),
                               std::string("--decode-tp"),
                               absl::StrCat(setup.decode_tp),
                               std::string("--rooms"),
                               absl::StrCat(rooms),
                               std::string("--room-pages"),
                               absl::StrCat(setup.room_pages),
                               std::string("--pages"),
                               absl::StrCat(setup.shape.pages)}) {
    argv.push_back(a);
  }
  if (options.tls == "tcp" || options.tls == "verbs") {
    argv.push_back("--net-devices");
    argv.push_back(options.prefill_node.net_devices);
  }
  if (!setup.strided_copies) argv.push_back("--no-strided-copies");
  for (const std::string& a : options.prefill_args) argv.push_back(a);
  int targets = 0;
  for (int d = 0; d < setup.decode_tp; ++d) {
    KVRAIL_ASSIGN_OR_RETURN(CopyList copies, RoomCopies(setup, p, d));
    if (copies.empty()) continue;
    argv.push_back("--target");
    argv.push_back(absl::StrCat(d, "=", sessions[d]));
    ++targets;
  }
  if (targets == 0) return std::nullopt;
  return argv;
}

// Checks every decode arena from this process (the nodes still map them): each destination byte
// of a planned copy equals its source byte, and every other byte is still zero.
absl::Status VerifyDecodes(const RouteSetup& setup, const Arenas& arenas, HarnessResult& result) {
  for (int d = 0; d < setup.decode_tp; ++d) {
    struct Range {
      uint64_t dst, length, src;
      int p;
    };
    std::vector<Range> ranges;
    for (int p = 0; p < setup.prefill_tp; ++p) {
      KVRAIL_ASSIGN_OR_RETURN(CopyList copies, RoomCopies(setup, p, d));
      for (const Copy& c : copies) {
        ForEachRow(c, [&](uint64_t src, uint64_t dst, uint64_t length) {
          ranges.push_back({dst, length, src, p});
        });
      }
    }
    std::sort(ranges.begin(), ranges.end(),
              [](const Range& a, const Range& b) { return a.dst < b.dst; });
    const uint8_t* dst = arenas.decode_bytes[d].data();
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
      if (std::memcmp(dst + r.dst, arenas.prefill[r.p].data() + r.src, r.length) != 0) {
        return absl::DataLossError(absl::StrCat("decode ", d, ": copy from prefill ", r.p, " src ",
                                                r.src, " to dst ", r.dst, " (", r.length,
                                                " bytes) differs"));
      }
      result.bytes_verified += r.length;
      cursor = r.dst + r.length;
    }
    const uint64_t size = arenas.decode_bytes[d].size();
    if (!AllZero(dst + cursor, size - cursor)) {
      return absl::DataLossError(
          absl::StrCat("decode ", d, ": bytes after the last copy were written"));
    }
    result.bytes_untouched += size - cursor;
  }
  return absl::OkStatus();
}

// Reads a prefill's "result" line: its seconds into `result` when it moved every room.
absl::Status ReadPrefillSuccess(Subprocess& prefill, const HarnessOptions& options,
                                HarnessResult& result) {
  absl::StatusOr<std::string> line = prefill.ReadUntil("result ", options.timeout);
  if (!line.ok()) return AddContext(line.status(), "prefill node");
  KVRAIL_ASSIGN_OR_RETURN(const int code, prefill.Wait(absl::Seconds(30)));
  if (!absl::StartsWith(*line, "ok ")) {
    return absl::InternalError(absl::StrCat("prefill node pid ", prefill.pid(), ": ", *line));
  }
  const std::vector<std::string> parts = absl::StrSplit(*line, ' ');
  double seconds = 0;
  if (parts.size() == 3 && absl::SimpleAtod(parts[2], &seconds)) {
    result.seconds = std::max(result.seconds, seconds);
  }
  if (code != 0) return absl::InternalError(absl::StrCat("prefill node exited ", code));
  return absl::OkStatus();
}

// Closes the decode nodes' stdin and expects each to exit 0.
absl::Status StopDecodes(std::vector<std::unique_ptr<Subprocess>>& decodes) {
  for (auto& decode : decodes) {
    decode->CloseStdin();
    KVRAIL_ASSIGN_OR_RETURN(const int code, decode->Wait(absl::Seconds(30)));
    if (code != 0) return absl::InternalError(absl::StrCat("decode node exited ", code));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ArenaName(const char* role, int rank) {
  return absl::StrCat("/kvrail-xfer-", process::ProcessTag(), "-", role, rank);
}

std::string NodePath() {
  char resolved[PATH_MAX];
  if (realpath("tests/transfer/transfer_node", resolved) != nullptr) return resolved;
  return "tests/transfer/transfer_node";
}

bool Running(process::Subprocess& process) {
  absl::StatusOr<int> code = process.Wait(absl::ZeroDuration());
  return !code.ok() && code.status().code() == absl::StatusCode::kDeadlineExceeded;
}

absl::StatusOr<DecodeNode> StartDecodeNode(const HarnessOptions& options, const std::string& arena,
                                           uint64_t allocate_bytes) {
  std::vector<std::string> argv = options.decode_node.prefix;
  for (const std::string& a :
       {NodePath(), std::string("decode"), std::string("--tls"), options.tls, std::string("--bind"),
        options.decode_node.host, std::string("--lanes"), std::string(kLanes)}) {
    argv.push_back(a);
  }
  if (allocate_bytes != 0) {
    argv.push_back("--allocate-bytes");
    argv.push_back(absl::StrCat(allocate_bytes));
  } else {
    argv.push_back("--arena");
    argv.push_back(arena);
  }
  if (options.tls == "tcp" || options.tls == "verbs") {
    argv.push_back("--net-devices");
    argv.push_back(options.decode_node.net_devices);
  }
  DecodeNode node;
  KVRAIL_ASSIGN_OR_RETURN(node.process, Subprocess::Start(argv));
  if (allocate_bytes != 0) {
    KVRAIL_ASSIGN_OR_RETURN(const std::string line,
                            node.process->ReadUntil("arena ", absl::Seconds(30)));
    uint64_t offset = 0;
    const std::string path = absl::StrCat("/proc/", process::LineField(line, "pid"), "/fd/",
                                          process::LineField(line, "fd"));
    if (!absl::SimpleAtoi(process::LineField(line, "offset"), &offset)) {
      return absl::InternalError(absl::StrCat("decode node: bad arena line \"", line, "\""));
    }
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      return absl::InternalError(absl::StrCat("decode node: open ", path, ": ", strerror(errno)));
    }
    absl::StatusOr<Arena> mapped = Arena::FromFd(fd);
    close(fd);
    if (!mapped.ok()) return AddContext(mapped.status(), path);
    if (mapped->size() < offset + allocate_bytes) {
      return absl::InternalError(absl::StrCat("decode node: ", path, " holds ", mapped->size(),
                                              " bytes, not ", offset, " + ", allocate_bytes));
    }
    node.allocated = std::move(*mapped);
    node.allocated_offset = offset;
  }
  KVRAIL_ASSIGN_OR_RETURN(node.session, node.process->ReadUntil("session ", absl::Seconds(30)));
  return node;
}

absl::StatusOr<HarnessResult> RunTransfer(const RouteSetup& setup, const HarnessOptions& options) {
  KVRAIL_ASSIGN_OR_RETURN(Arenas arenas, CreateArenas(setup));
  std::vector<std::unique_ptr<Subprocess>> decodes, prefills;
  std::vector<std::string> sessions;
  for (int d = 0; d < setup.decode_tp; ++d) {
    KVRAIL_ASSIGN_OR_RETURN(DecodeNode node, StartDecodeNode(options, ArenaName("d", d)));
    sessions.push_back(node.session);
    decodes.push_back(std::move(node.process));
  }
  for (int p = 0; p < setup.prefill_tp; ++p) {
    KVRAIL_ASSIGN_OR_RETURN(auto argv, PrefillArgv(setup, options, p, sessions, options.rooms));
    if (!argv.has_value()) continue;
    KVRAIL_ASSIGN_OR_RETURN(auto child, Subprocess::Start(*argv));
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
  if (!options.expect_failure) {
    for (auto& prefill : prefills) {
      KVRAIL_RETURN_IF_ERROR(ReadPrefillSuccess(*prefill, options, result));
    }
    KVRAIL_RETURN_IF_ERROR(VerifyDecodes(setup, arenas, result));
    KVRAIL_RETURN_IF_ERROR(StopDecodes(decodes));
    return result;
  }
  for (auto& prefill : prefills) {
    absl::StatusOr<std::string> line = prefill->ReadUntil("result ", options.timeout);
    if (!line.ok()) return AddContext(line.status(), "prefill node");
    KVRAIL_ASSIGN_OR_RETURN(const int code, prefill->Wait(absl::Seconds(30)));
    if (!absl::StartsWith(*line, "failed ") || code != 3) {
      return absl::InternalError(absl::StrCat("prefill node pid ", prefill->pid(),
                                              " should have failed, but: ", *line, " (exit ", code,
                                              ")"));
    }
    result.failures.push_back(*line);
    if (killed != absl::InfiniteFuture()) result.failure_latency = absl::Now() - killed;
  }
  if (!options.kill_decode_after_submit) {
    for (int d = 0; d < setup.decode_tp; ++d) {
      if (!AllZero(arenas.decode_bytes[d].data(), arenas.decode_bytes[d].size())) {
        return absl::DataLossError(
            absl::StrCat("decode ", d, ": a rejected room wrote bytes into the arena"));
      }
      result.bytes_untouched += arenas.decode_bytes[d].size();
    }
  }
  for (auto& decode : decodes) decode->CloseStdin();
  return result;
}

absl::StatusOr<WriterKillResult> RunWriterKillDrill(const RouteSetup& setup,
                                                    const HarnessOptions& options, int kills) {
  if (setup.prefill_tp != 1 || setup.decode_tp != 1) {
    return absl::InvalidArgumentError("the writer-kill drill runs one prefill and one decode");
  }
  KVRAIL_ASSIGN_OR_RETURN(Arenas arenas, CreateArenas(setup, !options.decode_allocates));
  KVRAIL_ASSIGN_OR_RETURN(const layout::Contract contract, ContractFor(setup, 1));
  KVRAIL_ASSIGN_OR_RETURN(DecodeNode decode,
                          StartDecodeNode(options, ArenaName("d", 0),
                                          options.decode_allocates ? contract.ArenaBytes() : 0));
  if (decode.allocated.has_value()) {
    arenas.decode_bytes.push_back(
        absl::MakeSpan(decode.allocated->data() + decode.allocated_offset, contract.ArenaBytes()));
  }
  KVRAIL_ASSIGN_OR_RETURN(CopyList copies, RoomCopies(setup, 0, 0));
  // "Landed": the first planned copy's destination holds the pattern's first bytes.
  const uint8_t* watched = arenas.decode_bytes[0].data() + copies[0].dst_offset;
  const uint64_t watched_length = std::min<uint64_t>(copies[0].length, 4096);
  std::mt19937 random(std::random_device{}());
  WriterKillResult drill;
  for (int kill = 0; kill < kills; ++kill) {
    // Enough rooms that the writer is still writing when it is killed (each rewrites the same
    // pages with the same bytes, so a killed writer's last bytes cannot spoil the final check).
    KVRAIL_ASSIGN_OR_RETURN(auto argv, PrefillArgv(setup, options, 0, {decode.session}, 40));
    KVRAIL_ASSIGN_OR_RETURN(auto writer, Subprocess::Start(*argv));
    KVRAIL_RETURN_IF_ERROR(writer->ReadUntil("submitted", options.timeout).status());
    const absl::Time give_up = absl::Now() + options.timeout;
    while (AllZero(watched, watched_length)) {
      if (absl::Now() > give_up || !Running(*writer)) {
        return absl::InternalError(
            absl::StrCat("writer ", kill, " wrote nothing: ", writer->transcript()));
      }
      absl::SleepFor(absl::Microseconds(200));
    }
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(0, 50)(random)));
    if (!Running(*writer)) {
      return absl::InternalError(
          absl::StrCat("writer ", kill, " finished before it was killed: ", writer->transcript()));
    }
    writer->Signal(SIGKILL);
    KVRAIL_RETURN_IF_ERROR(writer->Wait(absl::Seconds(30)).status());
    ++drill.writers_killed;
    // The decode node must outlive it, including the bytes still queued from it.
    absl::SleepFor(absl::Milliseconds(200));
    if (!Running(*decode.process)) {
      return absl::InternalError(absl::StrCat("the decode node died after writer ", kill,
                                              " was killed: ", decode.process->transcript()));
    }
  }
  KVRAIL_ASSIGN_OR_RETURN(auto argv,
                          PrefillArgv(setup, options, 0, {decode.session}, options.rooms));
  KVRAIL_ASSIGN_OR_RETURN(auto fresh, Subprocess::Start(*argv));
  KVRAIL_RETURN_IF_ERROR(ReadPrefillSuccess(*fresh, options, drill.final_transfer));
  KVRAIL_RETURN_IF_ERROR(VerifyDecodes(setup, arenas, drill.final_transfer));
  std::vector<std::unique_ptr<Subprocess>> decodes;
  decodes.push_back(std::move(decode.process));
  KVRAIL_RETURN_IF_ERROR(StopDecodes(decodes));
  return drill;
}

}  // namespace kvrail::testing
