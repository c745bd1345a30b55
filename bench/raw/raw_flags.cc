#include "bench/raw/raw_flags.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace kvrail::bench {
namespace {

constexpr char kSizeRule[] =
    "a size is decimal digits with an optional suffix B, KiB, MiB or GiB (e.g. 64KiB)";

absl::Status Invalid(absl::string_view flag, absl::string_view value, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrFormat("%s: \"%s\": %s", flag, value, rule));
}

// Splits a comma-separated list; an empty list or an empty entry is an error.
absl::StatusOr<std::vector<absl::string_view>> SplitList(absl::string_view flag,
                                                         absl::string_view text) {
  std::vector<absl::string_view> items = absl::StrSplit(text, ',');
  for (absl::string_view& item : items) {
    item = absl::StripAsciiWhitespace(item);
    if (item.empty()) {
      return Invalid(flag, text,
                     "the list is empty or has an empty entry; give values "
                     "separated by commas, e.g. 64KiB,1MiB");
    }
  }
  return items;
}

template <typename T>
void AppendUnique(std::vector<T>& values, const T& value) {
  if (std::find(values.begin(), values.end(), value) == values.end()) values.push_back(value);
}

}  // namespace

const char* RawLinkName(RawLink link) {
  switch (link) {
    case RawLink::kTcp:
      return "tcp";
    case RawLink::kShm:
      return "shm";
    case RawLink::kNetns:
      return "netns";
    case RawLink::kVerbs:
      return "verbs";
  }
  return "?";
}

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view flag, absl::string_view text) {
  absl::string_view digits = text;
  size_t end = 0;
  while (end < digits.size() && absl::ascii_isdigit(static_cast<unsigned char>(digits[end]))) {
    ++end;
  }
  if (end == 0) return Invalid(flag, text, kSizeRule);
  const absl::string_view suffix = digits.substr(end);
  digits = digits.substr(0, end);
  int shift = 0;
  if (suffix.empty() || suffix == "B") {
    shift = 0;
  } else if (suffix == "KiB") {
    shift = 10;
  } else if (suffix == "MiB") {
    shift = 20;
  } else if (suffix == "GiB") {
    shift = 30;
  } else {
    return Invalid(flag, text,
                   absl::StrFormat("unknown suffix \"%s\"; %s (binary units only: KB and MB "
                                   "are ambiguous)",
                                   suffix, kSizeRule));
  }
  uint64_t value = 0;
  if (!absl::SimpleAtoi(digits, &value) || value > (UINT64_MAX >> shift)) {
    return Invalid(flag, text, "the size does not fit in 64 bits");
  }
  value <<= shift;
  if (value == 0) return Invalid(flag, text, "a size must be at least 1 byte");
  return value;
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes != 0 && bytes % (uint64_t{1} << 30) == 0) return absl::StrFormat("%u GiB", bytes >> 30);
  if (bytes != 0 && bytes % (uint64_t{1} << 20) == 0) return absl::StrFormat("%u MiB", bytes >> 20);
  if (bytes != 0 && bytes % (uint64_t{1} << 10) == 0) return absl::StrFormat("%u KiB", bytes >> 10);
  return absl::StrFormat("%u B", bytes);
}

absl::StatusOr<std::vector<uint64_t>> ParseBlockSizes(absl::string_view flag,
                                                      absl::string_view text) {
  auto items = SplitList(flag, text);
  if (!items.ok()) return items.status();
  std::vector<uint64_t> sizes;
  for (absl::string_view item : *items) {
    absl::StatusOr<uint64_t> size = ParseByteSize(flag, item);
    if (!size.ok()) return size.status();
    if (*size > kMaxBlockBytes) {
      return Invalid(flag, item, "a block size must be between 1 B and 64 MiB");
    }
    AppendUnique(sizes, *size);
  }
  return sizes;
}

absl::StatusOr<std::vector<int>> ParseBatchSizes(absl::string_view flag, absl::string_view text) {
  auto items = SplitList(flag, text);
  if (!items.ok()) return items.status();
  std::vector<int> batches;
  for (absl::string_view item : *items) {
    int batch = 0;
    if (!absl::SimpleAtoi(item, &batch) || batch < 1 || batch > kMaxBatch ||
        !absl::ascii_isdigit(static_cast<unsigned char>(item.front()))) {
      return Invalid(flag, item, "a batch size is an integer between 1 and 1024");
    }
    AppendUnique(batches, batch);
  }
  return batches;
}

absl::StatusOr<std::vector<RawLink>> ParseLinks(absl::string_view flag,
                                                const std::vector<std::string>& values) {
  std::vector<RawLink> links;
  for (const std::string& value : values) {
    auto items = SplitList(flag, value);
    if (!items.ok()) return items.status();
    for (absl::string_view item : *items) {
      if (item == "tcp") {
        AppendUnique(links, RawLink::kTcp);
      } else if (item == "shm") {
        AppendUnique(links, RawLink::kShm);
      } else if (item == "netns") {
        AppendUnique(links, RawLink::kNetns);
      } else if (item == "verbs") {
        AppendUnique(links, RawLink::kVerbs);
      } else {
        return Invalid(flag, item, "a link is tcp, shm, netns or verbs");
      }
    }
  }
  if (links.empty()) return Invalid(flag, "", "name at least one link: tcp, shm, netns, verbs");
  return links;
}

}  // namespace kvrail::bench
