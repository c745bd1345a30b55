#include "tests/fuzz/copy_bounds.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/transport/bounds.h"
#include "engine/transport/transport.h"
#include "tests/fuzz/check.h"

namespace kvrail::fuzz {

void CheckCopiesInArenas(const CopyList& copies, uint64_t source_bytes, uint64_t destination_base,
                         uint64_t destination_bytes, absl::string_view what) {
  // 128-bit sums: nothing here may wrap while it is being checked.
  using Wide = unsigned __int128;
  const Wide address_space = Wide{std::numeric_limits<uint64_t>::max()} + 1;
  Check(Wide{destination_base} + destination_bytes <= address_space || copies.empty(), [&] {
    return absl::StrCat(what, ": copies into an arena at 0x", absl::Hex(destination_base), " of ",
                        destination_bytes, " bytes, which passes 2^64");
  });
  for (size_t i = 0; i < copies.size(); ++i) {
    const Copy& c = copies[i];
    // A strided copy: its last row's end, each side (every row lies between its first and it).
    const Wide rows_before_last = c.rows == 0 ? 0 : Wide{c.rows} - 1;
    const char* broken = nullptr;
    if (c.length == 0 || c.rows == 0) {
      broken = "moves no byte";
    } else if (c.rows > 1 && (c.src_stride < c.length || c.dst_stride < c.length)) {
      broken = "has rows that overlap";
    } else if (Wide{c.src_offset} + rows_before_last * c.src_stride + c.length > source_bytes) {
      broken = "reads outside the prefill arena";
    } else if (Wide{c.dst_offset} + rows_before_last * c.dst_stride + c.length >
               destination_bytes) {
      broken = "writes outside the decode arena";
    }
    Check(broken == nullptr, [&] {
      return absl::StrCat(what, ": copy ", i, " of ", copies.size(), " {src ", c.src_offset,
                          ", dst ", c.dst_offset, ", ", c.rows, " rows of ", c.length,
                          " bytes, strides ", c.src_stride, " and ", c.dst_stride, "} ", broken,
                          " (prefill ", source_bytes, " bytes, decode ", destination_bytes,
                          " bytes)");
    });
  }
}

void CheckTransportTakes(const CopyList& pages, uint64_t source_bytes, uint64_t destination_base,
                         uint64_t destination_bytes) {
  if (pages.empty() || destination_bytes == 0 ||
      destination_base > std::numeric_limits<uint64_t>::max() - destination_bytes) {
    return;
  }
  v1::HandshakeDescriptor descriptor;
  v1::Region* region = descriptor.add_regions();
  region->set_base(destination_base);
  region->set_length(destination_bytes);
  absl::StatusOr<transport::RemoteRegions> remote =
      transport::RemoteRegions::FromDescriptor(descriptor);
  Check(remote.ok(), "the decode arena as a descriptor's region is refused");
  transport::Capabilities caps;  // a transport that takes a strided copy as one write
  caps.strided_writes = true;
  caps.max_write_bytes = std::numeric_limits<uint64_t>::max();
  std::vector<transport::Write> writes;
  writes.reserve(pages.size());
  for (const Copy& c : pages) {
    writes.push_back({c.src_offset, destination_base + c.dst_offset, c.length, c.rows, c.src_stride,
                      c.dst_stride});
  }
  const absl::Status taken = transport::CheckWrites(writes, source_bytes, *remote, caps);
  Check(taken.ok(), [&] {
    return absl::StrCat("the transport's bounds check refuses the strided cursor's copies: ",
                        taken.ToString());
  });
  // The same copies with the last one's last row one byte past the decode arena: refused, and
  // the error names that write.
  transport::Write& last = writes.back();
  const uint64_t span = (last.rows - 1) * last.remote_stride + last.length;
  if (span > destination_bytes) return;
  last.remote_address = destination_base + destination_bytes - span + 1;
  const absl::Status refused = transport::CheckWrites(writes, source_bytes, *remote, caps);
  Check(!refused.ok() &&
            absl::StrContains(refused.message(), absl::StrCat("write ", writes.size() - 1, " of ")),
        [&] {
          return absl::StrCat(
              "a strided copy one byte past the decode arena is not refused by "
              "name: ",
              refused.ToString());
        });
}

absl::Status ExpandAndCheck(const plan::CopyPlan& plan, const layout::Manifest& src,
                            const layout::Manifest& dst, uint64_t source_bytes,
                            uint64_t destination_base, uint64_t destination_bytes,
                            CopyList& copies) {
  copies.clear();
  const absl::Status expanded = plan.ExpandCoalesced(src, dst, copies);
  if (!expanded.ok()) {
    Check(copies.empty(), "ExpandCoalesced failed and still appended copies");
    return expanded;
  }
  CheckCopiesInArenas(copies, source_bytes, destination_base, destination_bytes, "ExpandCoalesced");
  CopyList plain;
  Check(plan.Expand(src, dst, plain).ok(), "Expand fails where ExpandCoalesced succeeds");
  plan::Coalesce(plain);
  Check(plain == copies, "Expand + Coalesce differs from ExpandCoalesced");
  absl::StatusOr<plan::CopyCursor> cursor = plan.Begin(src, dst, /*coalesce=*/true);
  Check(cursor.ok(), "Begin fails where ExpandCoalesced succeeds");
  CopyList streamed;
  Copy batch[7];  // small and odd, so that runs cross batch ends
  size_t n = 0;
  while ((n = cursor->Next(batch, 7)) > 0) {
    for (size_t i = 0; i < n; ++i) streamed.push_back(batch[i]);
  }
  Check(cursor->done(), "a cursor that returned 0 copies is not done");
  Check(streamed == copies, "the coalescing cursor differs from ExpandCoalesced");
  // Strided, as the prefill sidecar streams a room (a page's rows as one copy): every copy's
  // rows inside both arenas, and its rows, merged, the same list.
  absl::StatusOr<plan::CopyCursor> strided =
      plan.Begin(src, dst, /*coalesce=*/true, /*strided=*/true);
  Check(strided.ok(), "a strided Begin fails where ExpandCoalesced succeeds");
  CopyList pages;
  while ((n = strided->Next(batch, 7)) > 0) {
    for (size_t i = 0; i < n; ++i) pages.push_back(batch[i]);
  }
  CheckCopiesInArenas(pages, source_bytes, destination_base, destination_bytes, "strided cursor");
  CheckTransportTakes(pages, source_bytes, destination_base, destination_bytes);
  CopyList rows;
  for (const Copy& page : pages) {
    ForEachRow(page, [&](uint64_t s, uint64_t d, uint64_t length) {
      rows.push_back({s, d, length});
    });
  }
  plan::Coalesce(rows);
  Check(rows == copies, "the strided cursor's rows differ from ExpandCoalesced");
  return expanded;
}

void CheckTransfer(const session::TransferWork& work, const layout::Contract& prefill) {
  Check(work.source_manifest != nullptr, "a transfer without a source manifest");
  CopyList copies;
  uint64_t total = 0;
  for (const session::TransferDestination& d : work.destinations) {
    Check(d.peer != nullptr && d.peer->copy_plan != nullptr && d.manifest != nullptr,
          "a transfer destination without its registration, copy plan or manifest");
    const absl::Status expanded =
        ExpandAndCheck(*d.peer->copy_plan, *work.source_manifest, *d.manifest,
                       static_cast<uint64_t>(prefill.ArenaBytes()), d.peer->registration.arena_base,
                       static_cast<uint64_t>(d.peer->contract.ArenaBytes()), copies);
    Check(expanded.ok(), [&] {
      return absl::StrCat("a room the rooms layer accepted does not expand: ", expanded.ToString());
    });
    uint64_t bytes = 0;
    for (const Copy& c : copies) bytes += PayloadBytes(c);
    Check(bytes == d.bytes, [&] {
      return absl::StrCat("the copies move ", bytes,
                          " bytes, the rooms layer "
                          "planned ",
                          d.bytes);
    });
    total += bytes;
  }
  Check(total == work.total_bytes, "a transfer's total bytes differ from its destinations' sum");
}

}  // namespace kvrail::fuzz
