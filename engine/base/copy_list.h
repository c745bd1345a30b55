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

// One contiguous copy: `length` bytes from prefill arena offset `src_offset` to decode arena
// offset `dst_offset`. Trivial on purpose: CopyList grows without initialising it.
struct Copy {
  uint64_t src_offset;
  uint64_t dst_offset;
  uint64_t length;
};

bool operator==(const Copy& a, const Copy& b);
inline bool operator!=(const Copy& a, const Copy& b) { return !(a == b); }

// A room's copy list: a growable array reused from room to room. Unlike std::vector it never
// value-initialises what it grows into, so expanding a 32k-token room costs the writes alone,
// and once grown it allocates nothing.
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
