#include "engine/transfer/copy_list_pool.h"

#include <algorithm>
#include <utility>

namespace kvrail::transfer {

namespace {

size_t StorageBytes(const CopyList& list) { return list.capacity() * sizeof(Copy); }

}  // namespace

CopyList CopyListPool::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.empty()) return CopyList();
  auto largest = std::max_element(idle_.begin(), idle_.end(), [](const auto& a, const auto& b) {
    return a.capacity() < b.capacity();
  });
  CopyList list = std::move(*largest);
  *largest = std::move(idle_.back());
  idle_.pop_back();
  idle_bytes_ -= StorageBytes(list);
  return list;
}

void CopyListPool::Give(CopyList list) {
  list.clear();
  const size_t bytes = StorageBytes(list);
  if (bytes == 0 || bytes > max_bytes_) return;  // nothing to keep, or more than may be kept
  std::unique_lock<std::mutex> lock(mu_);
  // Keep the largest lists: make room by dropping smaller idle ones, or drop this one.
  while (idle_bytes_ + bytes > max_bytes_ && !idle_.empty()) {
    auto smallest = std::min_element(idle_.begin(), idle_.end(), [](const auto& a, const auto& b) {
      return a.capacity() < b.capacity();
    });
    if (smallest->capacity() >= list.capacity()) break;
    idle_bytes_ -= StorageBytes(*smallest);
    CopyList dropped = std::move(*smallest);
    *smallest = std::move(idle_.back());
    idle_.pop_back();
    lock.unlock();  // freed outside the lock (a large free unmaps)
    dropped = CopyList();
    lock.lock();
  }
  if (idle_bytes_ + bytes > max_bytes_) return;  // freed on return, the lock released first
  idle_bytes_ += bytes;
  idle_.push_back(std::move(list));
}

size_t CopyListPool::idle_lists() const {
  std::lock_guard<std::mutex> lock(mu_);
  return idle_.size();
}

size_t CopyListPool::idle_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return idle_bytes_;
}

}  // namespace kvrail::transfer
