// A room's copies (docs/ARCHITECTURE.md, layer 0): what the planner produces
// (control/plan/copy_plan.h) and the transfer scheduler consumes (engine/transfer), in a type
// neither owns, so that engine/ depends on nothing in control/.
#ifndef KVRAIL_ENGINE_BASE_COPY_LIST_H_
#define KVRAIL_ENGINE_BASE_COPY_LIST_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>

namespace kvrail {

// One copy from the prefill arena to the decode arena: `rows` rows of `length` bytes, row r
// from prefill offset `src_offset` + r * `src_stride` to decode offset `dst_offset` + r *
// `dst_stride`. One row (the default) is one contiguous run, and its strides mean nothing; a
// strided copy (rows > 1) is a head-sliced page of a mismatched TP route as one unit (issue 31:
// the planner, the scheduler and the transports that can move rows take it whole), its strides
// at least `length` so that no two rows overlap.
struct Copy {
  uint64_t src_offset;
  uint64_t dst_offset;
  uint64_t length;
  uint64_t rows = 1;
  uint64_t src_stride = 0;
  uint64_t dst_stride = 0;
};

// Equal when they move the same bytes the same way: the strides count only with rows > 1.
bool operator==(const Copy& a, const Copy& b);
inline bool operator!=(const Copy& a, const Copy& b) { return !(a == b); }

// The bytes a copy moves: rows x length.
inline uint64_t PayloadBytes(const Copy& c) { return c.rows * c.length; }
// The span of its rows on each side: from the first row's first byte to the last row's last.
inline uint64_t SourceSpan(const Copy& c) { return (c.rows - 1) * c.src_stride + c.length; }
inline uint64_t DestinationSpan(const Copy& c) { return (c.rows - 1) * c.dst_stride + c.length; }

// Calls fn(src_offset, dst_offset, length) for each row of `c`, in order.
template <typename Fn>
void ForEachRow(const Copy& c, Fn&& fn) {
  for (uint64_t r = 0; r < c.rows; ++r) {
    fn(c.src_offset + r * c.src_stride, c.dst_offset + r * c.dst_stride, c.length);
  }
}

// A room's copy list: a growable array reused from room to room. Once grown it allocates
// nothing; what it grows into gets one row and no strides (Copy's defaults), its offsets and
// lengths left for the writer.
class CopyList {
 public:
  CopyList() = default;
  CopyList(std::initializer_list<Copy> copies);
  CopyList(const CopyList& other);
  CopyList& operator=(const CopyList& other);
  CopyList(CopyList&&) noexcept = default;
  CopyList& operator=(CopyList&&) noexcept = default;

  size_t size() const { return size_; }
  // Copies it holds room for without growing.
  size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  const Copy* begin() const { return data_.get(); }
  const Copy* end() const { return data_.get() + size_; }
  Copy* begin() { return data_.get(); }
  Copy* end() { return data_.get() + size_; }
  const Copy& operator[](size_t i) const { return data_[i]; }
  Copy& operator[](size_t i) { return data_[i]; }

  // Forgets the copies and keeps the storage.
  void clear() { size_ = 0; }
  // Appends one copy.
  void push_back(const Copy& copy) { *Extend(1) = copy; }
  // Makes room for `n` more copies and returns the first of them, uninitialised; size()
  // grows by n. Pointers returned earlier are invalidated.
  Copy* Extend(size_t n);
  // Keeps the first `n` copies (n <= size()).
  void Truncate(size_t n) { size_ = n; }

 private:
  std::unique_ptr<Copy[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

bool operator==(const CopyList& a, const CopyList& b);

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_BASE_COPY_LIST_H_
