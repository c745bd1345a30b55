#include "bench/kv/kv_flags.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/kv/kv_presets.h"
#include "engine/base/error.h"

namespace kvrail::bench {
namespace {

constexpr int kMaxTp = 8;
constexpr int64_t kMinTokens = 16;
constexpr int64_t kMaxTokens = 131072;

std::vector<std::string> Items(absl::string_view text) {
  std::vector<std::string> items;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    items.emplace_back(absl::StripAsciiWhitespace(item));
  }
  return items;
}

absl::Status Empty(const char* flag) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": empty; give a comma list"));
}

}  // namespace

bool operator==(const TpPair& a, const TpPair& b) {
  return a.prefill == b.prefill && a.decode == b.decode;
}

KvBenchOptions QuickKvSweep() {
  KvBenchOptions o;
  o.presets = {"llama3-8b"};
  o.tp_pairs = {{1, 1}, {2, 1}};
  o.tokens = {4096};
  o.links = {"tcp", "shm"};
  o.rooms = 6;
  return o;
}

KvBenchOptions DefaultKvSweep() {
  KvBenchOptions o;
  for (const KvPreset& preset : KvPresets()) o.presets.push_back(preset.name);
  o.tp_pairs = {{1, 1}, {2, 1}, {1, 2}, {4, 2}, {2, 4}};
  o.tokens = {1024, 4096, 16384, 32768};
  o.links = {"tcp", "shm"};
  o.rooms = 5;
  return o;
}

KvBenchOptions FullKvSweep() {
  KvBenchOptions o = DefaultKvSweep();
  o.tp_pairs.push_back({8, 2});
  o.tp_pairs.push_back({2, 8});
  o.links.push_back("netns");
  return o;
}

absl::StatusOr<std::vector<TpPair>> ParseTpPairs(absl::string_view text) {
  if (text.empty()) return Empty("--tp");
  std::vector<TpPair> pairs;
  for (const std::string& item : Items(text)) {
    const std::vector<std::string> sides = absl::StrSplit(item, ':');
    TpPair pair;
    if (sides.size() != 2 || !absl::SimpleAtoi(sides[0], &pair.prefill) ||
        !absl::SimpleAtoi(sides[1], &pair.decode) || pair.prefill < 1 || pair.prefill > kMaxTp ||
        pair.decode < 1 || pair.decode > kMaxTp) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tp: \"", item, "\": expected <prefill TP>:<decode TP>, each 1 to ",
                       kMaxTp, " (e.g. 2:1)"));
    }
    pairs.push_back(pair);
  }
  return pairs;
}

absl::StatusOr<std::vector<int64_t>> ParseTokens(absl::string_view text) {
  if (text.empty()) return Empty("--tokens");
  std::vector<int64_t> tokens;
  for (const std::string& item : Items(text)) {
    absl::string_view digits = item;
    int64_t unit = 1;
    if (!digits.empty() && (digits.back() == 'k' || digits.back() == 'K')) {
      digits.remove_suffix(1);
      unit = 1024;
    }
    int64_t n = 0;
    if (!absl::SimpleAtoi(digits, &n) || n < 1 || n > kMaxTokens / unit || n * unit < kMinTokens) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens: \"", item, "\": expected ",
                                                     kMinTokens, " to ", kMaxTokens,
                                                     " tokens, a number or <n>k (k = 1024)"));
    }
    tokens.push_back(n * unit);
  }
  return tokens;
}

absl::StatusOr<std::vector<std::string>> ParseKvLinks(absl::string_view text) {
  if (text.empty()) return Empty("--link");
  std::vector<std::string> links;
  for (const std::string& item : Items(text)) {
    if (item != "tcp" && item != "shm" && item != "netns") {
      return absl::InvalidArgumentError(
          absl::StrCat("--link: \"", item, "\": expected tcp, shm or netns"));
    }
    links.push_back(item);
  }
  return links;
}

absl::StatusOr<std::vector<std::string>> ParsePresets(absl::string_view text) {
  if (text.empty()) return Empty("--presets");
  std::vector<std::string> presets;
  for (const std::string& item : Items(text)) {
    KVRAIL_RETURN_IF_ERROR(FindKvPreset(item).status());
    presets.push_back(item);
  }
  return presets;
}

absl::StatusOr<KvBenchOptions> ParseKvFlags(const KvFlagText& text) {
  if (text.quick && text.full) {
    return absl::InvalidArgumentError("--quick and --full: give one sweep, not both");
  }
  KvBenchOptions o = text.quick ? QuickKvSweep() : text.full ? FullKvSweep() : DefaultKvSweep();
  // (Braces: the macro is several statements.)
  if (!text.presets.empty()) {
    KVRAIL_ASSIGN_OR_RETURN(o.presets, ParsePresets(text.presets));
  }
  if (!text.tp.empty()) {
    KVRAIL_ASSIGN_OR_RETURN(o.tp_pairs, ParseTpPairs(text.tp));
  }
  if (!text.tokens.empty()) {
    KVRAIL_ASSIGN_OR_RETURN(o.tokens, ParseTokens(text.tokens));
  }
  if (!text.links.empty()) {
    KVRAIL_ASSIGN_OR_RETURN(o.links, ParseKvLinks(text.links));
  }
  if (text.rooms != 0) {
    if (text.rooms < 1 || text.rooms > 1000) {
      return absl::InvalidArgumentError("--rooms: between 1 and 1000 per case");
    }
    o.rooms = text.rooms;
  }
  if (text.sample_every < 1 || text.sample_every > 4096) {
    return absl::InvalidArgumentError(
        "--sample-every: between 1 (every byte of every room) and 4096");
  }
  o.sample_every = text.sample_every;
  o.naive = text.naive;
  o.digest = text.digest;
  o.unpopulated = text.unpopulated;
  o.compare = text.compare;
  o.streaming_stores = text.streaming_stores;
  o.layerwise = text.layerwise;
  if (!(text.layer_compute_scale >= 0.25 && text.layer_compute_scale <= 16)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--layer-compute-scale: ", text.layer_compute_scale,
        ": the simulated compute per layer is 0.25 to 16 layer shares (1: the target's measure)"));
  }
  if (text.layer_compute_scale != 1 && !text.layerwise) {
    return absl::InvalidArgumentError(
        "--layer-compute-scale: it scales the --layerwise rooms' compute; give --layerwise too");
  }
  o.layer_compute_scale = text.layer_compute_scale;
  return o;
}

}  // namespace kvrail::bench
