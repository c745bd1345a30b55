#include "engine/transport/ucx/am_protocol.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "engine/base/rows.h"

namespace kvrail::transport::am {

void PlanMessages(absl::Span<const Write> writes, uint64_t slice, std::vector<AmMessage>* plan) {
  plan->clear();
  const uint64_t packable = slice / 8;
  const size_t count = writes.size();
  for (size_t i = 0; i < count;) {
    const Write& w = writes[i];
    if (w.rows > 1) {
      const uint64_t per_message =
          slice > sizeof(PackedRows) ? (slice - sizeof(PackedRows)) / w.length : 0;
      for (uint64_t row = 0; row < w.rows;) {
        if (per_message == 0) {  // a row longer than a message: its slices, one by one
          for (uint64_t done = 0; done < w.length; done += slice) {
            plan->push_back(AmMessage{.id = kWriteAm,
                                      .first = i,
                                      .end = i + 1,
                                      .offset = done,
                                      .length = std::min(slice, w.length - done),
                                      .row = row});
          }
          ++row;
          continue;
        }
        const uint64_t rows = std::min(per_message, w.rows - row);
        plan->push_back(
            AmMessage{.id = kRowsAm, .first = i, .end = i + 1, .length = rows, .row = row});
        row += rows;
      }
      ++i;
      continue;
    }
    // A run of small writes that fits one message, entries and bytes together.
    size_t end = i;
    uint64_t bytes = 0;
    while (end < count && writes[end].rows == 1 && writes[end].length <= packable &&
           (end - i + 1) * sizeof(PackedWrite) + bytes + writes[end].length <= slice) {
      bytes += writes[end].length;
      ++end;
    }
    if (end - i >= 2) {
      plan->push_back(AmMessage{.id = kWritesAm, .first = i, .end = end, .length = bytes});
      i = end;
      continue;
    }
    for (uint64_t done = 0; done < w.length; done += slice) {
      plan->push_back(AmMessage{.id = kWriteAm,
                                .first = i,
                                .end = i + 1,
                                .offset = done,
                                .length = std::min(slice, w.length - done)});
    }
    ++i;
  }
}

size_t GatherPieces(const AmMessage& message, absl::Span<const Write> writes) {
  if (message.id == kWritesAm) return 1 + (message.end - message.first);
  if (message.id == kRowsAm) {
    const Write& w = writes[message.first];
    return 1 + (w.local_stride == w.length ? 1 : message.length);
  }
  return 1;
}

bool PackedBeforeSending(const AmMessage& message, absl::Span<const Write> writes) {
  return message.id != kWriteAm && GatherPieces(message, writes) > kMostGatherPieces;
}

uint64_t PayloadBytes(const AmMessage& message, absl::Span<const Write> writes) {
  if (message.id == kWritesAm) {
    return (message.end - message.first) * sizeof(PackedWrite) + message.length;
  }
  if (message.id == kRowsAm) {
    return sizeof(PackedRows) + message.length * writes[message.first].length;
  }
  return message.length;
}

void PackPayload(const AmMessage& message, absl::Span<const Write> writes, const std::byte* base,
                 std::byte* out) {
  if (message.id == kWritesAm) {
    for (size_t k = message.first; k < message.end; ++k) {
      const PackedWrite entry{writes[k].remote_address, writes[k].length};
      std::memcpy(out, &entry, sizeof(entry));
      out += sizeof(entry);
    }
    for (size_t k = message.first; k < message.end; ++k) {
      std::memcpy(out, base + writes[k].local_offset, writes[k].length);
      out += writes[k].length;
    }
    return;
  }
  const Write& w = writes[message.first];
  const PackedRows rows{message.length, w.length};
  std::memcpy(out, &rows, sizeof(rows));
  out += sizeof(rows);
  const std::byte* row = base + w.local_offset + message.row * w.local_stride;
  for (uint64_t r = 0; r < message.length; ++r, row += w.local_stride, out += w.length) {
    std::memcpy(out, row, w.length);
  }
}

PlanSizes SizesOf(absl::Span<const AmMessage> plan, absl::Span<const Write> writes) {
  PlanSizes sizes;
  sizes.headers = plan.size();
  for (const AmMessage& message : plan) {
    if (message.id == kWriteAm) continue;
    if (PackedBeforeSending(message, writes)) {
      sizes.packed_bytes += PayloadBytes(message, writes);
      continue;
    }
    ++sizes.rows;  // a kWritesAm is always packed: it has two writes at least
    sizes.gather += GatherPieces(message, writes);
  }
  return sizes;
}

AmHeader AmWriter::WriteHeader(const AmMessage& message, absl::Span<const Write> writes) const {
  AmHeader header;
  header.token = token_;
  const Write& w = writes[message.first];
  if (message.id == kWritesAm) {
    header.a = message.end - message.first;
  } else if (message.id == kRowsAm) {
    header.a = w.remote_address + message.row * w.remote_stride;
    header.b = w.remote_stride;
  } else {
    header.a = w.remote_address + message.row * w.remote_stride + message.offset;
  }
  return header;
}

absl::Status FlushReplyStatus(const FlushReply& reply, PeerId peer, int lane) {
  if (reply.refused == 0) return absl::OkStatus();
  if (reply.refused == kRefusedWriter) {
    return absl::UnavailableError(absl::StrFormat(
        "flush to peer %d lane %d: the peer refused a write of %u bytes at 0x%x: it refuses this "
        "writer's connections (it found the writer gone)",
        peer, lane, reply.refused_length, reply.refused_address));
  }
  return absl::UnavailableError(absl::StrFormat(
      "flush to peer %d lane %d: the peer refused a write of %u bytes at 0x%x: not inside a "
      "region it has registered (deregistered since its descriptor was fetched?)",
      peer, lane, reply.refused_length, reply.refused_address));
}

void AmTarget::Inbound::Refuse(uint64_t address, uint64_t length, Refusal why) {
  if (refused != 0) return;  // the first since the last answer is the one the answer names
  refused = why;
  refused_address = address;
  refused_length = length;
}

void AmTarget::AnswerHandled(uint64_t token, Inbound& in, const Reply& reply) {
  auto& waiting = in.waiting;
  for (auto it = waiting.begin(); it != waiting.end();) {
    if (it->first > in.handled) {
      ++it;
      continue;
    }
    reply(FlushReply{.token = token,
                     .seq = it->second,
                     .refused = in.refused,
                     .refused_address = in.refused_address,
                     .refused_length = in.refused_length});
    in.refused = 0;
    it = waiting.erase(it);
  }
}

void AmTarget::OnWrite(const AmHeader& header, const std::byte* data, uint64_t length, bool whole,
                       AmLanding& landing, const Reply* reply) {
  Inbound& in = inbound_[header.token];
  ++in.handled;
  if (in.writer_refused) {
    in.Refuse(header.a, length, kRefusedWriter);
  } else if (whole && landing.Registered(header.a, length)) {
    landing.CopyRows(header.a, length, data, length, 1);
    landing.Fence();  // landed before any flush this message completes is answered
  } else {
    in.Refuse(header.a, length);
  }
  if (reply != nullptr && !in.waiting.empty()) AnswerHandled(header.token, in, *reply);
}

void AmTarget::OnWrites(const AmHeader& header, const std::byte* data, uint64_t length, bool whole,
                        AmLanding& landing, const Reply* reply) {
  Inbound& in = inbound_[header.token];
  ++in.handled;
  // The entries, then the bytes: the message must hold exactly what its entries say.
  const uint64_t n = header.a;
  if (in.writer_refused) {
    in.Refuse(0, length, kRefusedWriter);
  } else if (!whole || n == 0 || n > length / sizeof(PackedWrite)) {
    in.Refuse(0, length);
  } else {
    const uint64_t payload = length - n * sizeof(PackedWrite);
    uint64_t total = 0;
    for (uint64_t k = 0; k < n && total <= payload; ++k) {
      PackedWrite entry;
      std::memcpy(&entry, data + k * sizeof(PackedWrite), sizeof(entry));
      total += std::min(entry.length, payload + 1);
    }
    if (total != payload) {
      in.Refuse(0, length);
    } else {
      // Bounds before bytes, each write on its own, as for kWriteAm.
      uint64_t offset = n * sizeof(PackedWrite);
      for (uint64_t k = 0; k < n; ++k) {
        PackedWrite entry;
        std::memcpy(&entry, data + k * sizeof(PackedWrite), sizeof(entry));
        if (landing.Registered(entry.address, entry.length)) {
          landing.CopyRows(entry.address, entry.length, data + offset, entry.length, 1);
        } else {
          in.Refuse(entry.address, entry.length);
        }
        offset += entry.length;
      }
      landing.Fence();  // every row landed before any flush this message completes is answered
    }
  }
  if (reply != nullptr && !in.waiting.empty()) AnswerHandled(header.token, in, *reply);
}

void AmTarget::OnRows(const AmHeader& header, const std::byte* data, uint64_t length, bool whole,
                      AmLanding& landing, const Reply* reply) {
  Inbound& in = inbound_[header.token];
  ++in.handled;
  PackedRows rows;
  RowsMeasure m;
  const bool well_formed = whole && length >= sizeof(PackedRows) &&
                           (std::memcpy(&rows, data, sizeof(rows)),
                            MeasureRows(rows.rows, rows.length, header.b, header.b, &m)) &&
                           m.payload == length - sizeof(PackedRows);
  // Bounds before bytes: the rows' whole span inside one region registered now, or none lands.
  if (in.writer_refused) {
    in.Refuse(header.a, length, kRefusedWriter);
  } else if (!well_formed) {
    in.Refuse(header.a, length);
  } else if (!landing.Registered(header.a, m.span_b)) {
    in.Refuse(header.a, m.span_b);
  } else {
    landing.CopyRows(header.a, header.b, data + sizeof(PackedRows), rows.length, rows.rows);
    landing.Fence();  // every row landed before any flush this message completes is answered
  }
  if (reply != nullptr && !in.waiting.empty()) AnswerHandled(header.token, in, *reply);
}

void AmTarget::OnHello(const AmHeader& header, const std::byte* name, uint64_t length) {
  inbound_[header.token].writer.assign(reinterpret_cast<const char*>(name), length);
}

void AmTarget::OnBye(const AmHeader& header) {
  auto found = inbound_.find(header.token);
  if (found == inbound_.end()) return;
  if (!found->second.writer.empty()) {
    if (closed_.size() >= kMostClosedNames) closed_.clear();
    ++closed_[found->second.writer];
  }
  inbound_.erase(found);
}

size_t AmTarget::Refuse(std::string_view writer) {
  if (writer.empty()) return 0;
  size_t settled = 0;
  for (auto& [token, in] : inbound_) {
    if (in.writer != writer) continue;
    in.writer_refused = true;
    ++settled;
  }
  auto closed = closed_.find(std::string(writer));
  if (closed != closed_.end()) settled += closed->second;
  return settled;
}

void AmTarget::OnFlush(const AmHeader& header, const Reply* reply) {
  if (reply == nullptr) return;  // not a kvrail writer: nobody to answer
  Inbound& in = inbound_[header.token];
  in.waiting.emplace_back(header.a, header.b);
  AnswerHandled(header.token, in, *reply);
}

}  // namespace kvrail::transport::am
