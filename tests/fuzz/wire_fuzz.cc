// libFuzzer harness for the CachePD frame codecs in control/wire (CACHEPD §3).
//
// The input is split into frames at every two-byte separator 0x00 0xFF, so every input is a
// frame set. Each frame set goes through Classify and every parser; whatever a parser accepts
// must build back to the same bytes and parse back to the same value, and every rejection must
// be an InvalidArgument status (kvrail's frame errors) or the contract callback's own code.
// Any other outcome aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "control/wire/ascii_uint.h"
#include "control/wire/dispatch.h"
#include "control/wire/limits.h"
#include "control/wire/preallocation.h"
#include "control/wire/python_int.h"
#include "control/wire/registration.h"
#include "control/wire/status.h"

namespace {

using kvrail::wire::kMaxContractBytes;

void Check(bool condition, const char* what) {
  if (condition) {
    return;
  }
  std::fprintf(stderr, "wire_fuzz: %s\n", what);
  std::abort();
}

void CheckRejection(const absl::Status& status, const char* what) {
  Check(!status.ok(), what);
  Check(status.code() == absl::StatusCode::kInvalidArgument, what);
  Check(!status.message().empty(), what);
}

std::vector<std::string> SplitFrames(const uint8_t* data, size_t size) {
  std::vector<std::string> frames(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0x00 && i + 1 < size && data[i + 1] == 0xff) {
      frames.emplace_back();
      ++i;
    } else {
      frames.back().push_back(static_cast<char>(data[i]));
    }
  }
  return frames;
}

// Stands in for the contract parser with a code of its own (OutOfRange), so that its errors
// can be told from frame errors.
absl::Status ContractCheck(absl::string_view wire) {
  if (!wire.empty() && wire.size() <= kMaxContractBytes) {
    return absl::OkStatus();
  }
  return absl::OutOfRangeError("contract payload must be 1..262144 bytes");
}

void FuzzRegistration(const std::vector<std::string>& frames) {
  auto route = kvrail::wire::ParseRegistrationReplyRoute(frames);
  if (!route.ok()) {
    CheckRejection(route.status(), "reply route rejection");
  }
  auto registration = kvrail::wire::ParseRegistration(frames, ContractCheck);
  if (!registration.ok()) {
    Check(registration.status().code() == absl::StatusCode::kInvalidArgument ||
              registration.status().code() == absl::StatusCode::kOutOfRange,
          "registration rejection code");
    return;
  }
  Check(route.ok(), "registration accepted without a reply route");
  Check(route->endpoint == registration->endpoint && route->port == registration->port &&
            route->session_id == registration->session_id,
        "reply route disagrees with registration");
  auto built = kvrail::wire::BuildRegistration(*registration);
  Check(built.ok(), "accepted registration does not build");
  Check(*built == frames, "registration does not build back to its frames");
  auto again = kvrail::wire::ParseRegistration(*built, ContractCheck);
  Check(again.ok() && *again == *registration, "registration does not parse back");
}

void FuzzPreallocation(const std::vector<std::string>& frames) {
  auto header = kvrail::wire::ParsePreallocationRouteHeader(frames);
  if (!header.ok()) {
    CheckRejection(header.status(), "route header rejection");
  }
  auto preallocation = kvrail::wire::ParsePreallocation(frames);
  if (!preallocation.ok()) {
    CheckRejection(preallocation.status(), "pre-allocation rejection");
    return;
  }
  Check(header.ok() && header->room == preallocation->room &&
            header->session_id == preallocation->session_id,
        "route header disagrees with pre-allocation");
  auto built = kvrail::wire::BuildPreallocation(*preallocation);
  Check(built.ok(), "accepted pre-allocation does not build");
  Check(*built == frames, "pre-allocation does not build back to its frames");
  auto again = kvrail::wire::ParsePreallocation(*built);
  Check(again.ok() && *again == *preallocation, "pre-allocation does not parse back");
}

// Status messages of 5 frames (CACHEPD §3.4) and of 6 and 7 (2026-09, CACHEPD §12.9).
void FuzzStatus(const std::vector<std::string>& frames) {
  auto strict = kvrail::wire::ParseStatus(frames);
  auto lenient = kvrail::wire::ParseStatusLenient(frames);
  if (!lenient.ok()) {
    CheckRejection(lenient.status(), "lenient status rejection");
  }
  if (!strict.ok()) {
    CheckRejection(strict.status(), "status rejection");
  } else {
    Check(lenient.ok() && *lenient == *strict, "lenient parse disagrees with strict parse");
    Check(strict->form == kvrail::wire::StatusFormOf(frames), "status form is not its frames'");
    auto built = kvrail::wire::BuildStatus(*strict, strict->form);
    Check(built.ok(), "accepted status does not build");
    // kvrail writes no 6-frame form: a 6-frame status builds back with an empty frame 6.
    std::vector<std::string> expected = frames;
    if (expected.size() == 6) expected.emplace_back();
    Check(*built == expected, "status does not build back to its frames");
  }
  if (lenient.ok()) {
    // Whatever the lenient parser reads, kvrail's sender either refuses it or writes a frame
    // set that the strict parser reads back unchanged, in either form.
    for (const kvrail::wire::StatusForm form :
         {kvrail::wire::StatusForm::kSnapshot, kvrail::wire::StatusForm::k2026_09}) {
      auto built = kvrail::wire::BuildStatus(*lenient, form);
      if (!built.ok()) {
        CheckRejection(built.status(), "status build rejection");
        continue;
      }
      auto again = kvrail::wire::ParseStatus(*built);
      Check(again.ok() && again->form == form, "built status does not parse back");
      kvrail::wire::StatusMessage expected = *lenient;
      expected.form = form;
      if (form == kvrail::wire::StatusForm::kSnapshot) {  // frames 5 and 6 are not sent
        expected.cached_tokens = 0;
        expected.bootstrap_logprob.reset();
      }
      Check(*again == expected, "lenient status does not round-trip");
    }
  }
}

void FuzzIntegers(absl::string_view text) {
  auto uint = kvrail::wire::ParseCanonicalUint(text, 0, std::numeric_limits<uint64_t>::max(), "f");
  if (uint.ok()) {
    Check(kvrail::wire::FormatUint(*uint) == text, "canonical uint is not canonical");
  } else {
    CheckRejection(uint.status(), "canonical uint rejection");
  }
  auto python = kvrail::wire::ParsePythonInt(text, std::numeric_limits<int64_t>::min(),
                                             std::numeric_limits<int64_t>::max(), "f");
  if (!python.ok()) {
    CheckRejection(python.status(), "python int rejection");
  }
  if (uint.ok() && *uint <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    Check(python.ok() && static_cast<uint64_t>(*python) == *uint,
          "python int disagrees with canonical uint");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> frames = SplitFrames(data, size);
  (void)kvrail::wire::Classify(frames);
  FuzzRegistration(frames);
  FuzzPreallocation(frames);
  FuzzStatus(frames);
  FuzzIntegers(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
