#include "engine/base/copy_list.h"

#include <algorithm>
#include <utility>

namespace kvrail {

bool operator==(const Copy& a, const Copy& b) {
  return a.src_offset == b.src_offset && a.dst_offset == b.dst_offset && a.length == b.length &&
         a.rows == b.rows &&
         (a.rows <= 1 || (a.src_stride == b.src_stride && a.dst_stride == b.dst_stride));
}

CopyList::CopyList(std::initializer_list<Copy> copies) {
  std::copy(copies.begin(), copies.end(), Extend(copies.size()));
}

CopyList::CopyList(const CopyList& other) { *this = other; }

CopyList& CopyList::operator=(const CopyList& other) {
  if (this != &other) {
    clear();
    std::copy(other.begin(), other.end(), Extend(other.size()));
  }
  return *this;
}

Copy* CopyList::Extend(size_t n) {
  if (size_ + n > capacity_) {
    const size_t capacity = std::max(size_ + n, capacity_ * 2);
    std::unique_ptr<Copy[]> grown(new Copy[capacity]);
    std::copy(begin(), end(), grown.get());
    data_ = std::move(grown);
    capacity_ = capacity;
  }
  Copy* first = data_.get() + size_;
  size_ += n;
  return first;
}

bool operator==(const CopyList& a, const CopyList& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace kvrail
