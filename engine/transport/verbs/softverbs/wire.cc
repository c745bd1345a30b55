#include "engine/transport/verbs/softverbs/wire.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <random>

namespace kvrail::transport::softverbs::wire {

std::string ShmName(uint32_t qpn) {
  char name[64];
  std::snprintf(name, sizeof(name), "/kvrail-softverbs-%06x", qpn);
  return name;
}

bool ProcessIsDead(int64_t pid) {
  if (pid <= 0) return false;
  return kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

namespace {

uint64_t PidNamespace() {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

Segment* MapFd(int fd) {
  void* p = mmap(nullptr, kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<Segment*>(p);
}

// A name whose owner died can be taken over: true if the name is gone now.
bool RemoveIfStale(uint32_t qpn) {
  const std::string name = ShmName(qpn);
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return errno == ENOENT;
  struct stat st;
  bool stale = false;
  if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= kSegmentBytes) {
    if (Segment* s = MapFd(fd)) {
      stale = s->magic.load(std::memory_order_acquire) == kMagic && ProcessIsDead(OwnerPid(s));
      UnmapSegment(s);
    }
  }
  close(fd);
  if (stale) shm_unlink(name.c_str());
  return stale;
}

}  // namespace

int64_t OwnerPid(const Segment* segment) {
  const uint64_t ns = segment->pidns.load(std::memory_order_relaxed);
  if (ns == 0 || ns != PidNamespace()) return 0;
  return segment->pid.load(std::memory_order_relaxed);
}

void SweepStaleSegments() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  constexpr char kPrefix[] = "kvrail-softverbs-";
  while (dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, kPrefix, sizeof(kPrefix) - 1) != 0) continue;
    char* end = nullptr;
    const unsigned long qpn = std::strtoul(e->d_name + sizeof(kPrefix) - 1, &end, 16);
    if (end == nullptr || *end != '\0' || qpn == 0 || qpn > 0xFFFFFF) continue;
    RemoveIfStale(static_cast<uint32_t>(qpn));
  }
  closedir(dir);
}

Segment* CreateSegment(uint32_t* qpn) {
  static std::once_flag sweep;
  std::call_once(sweep, SweepStaleSegments);
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  std::mt19937_64 rng((static_cast<uint64_t>(rd()) << 32) ^ getpid() ^
                      (counter.fetch_add(1) * 0x9e3779b97f4a7c15ULL));
  for (int attempt = 0; attempt < 1000; ++attempt) {
    // 24-bit QP numbers; the low ones are left out as real devices reserve QP 0 and 1.
    const uint32_t candidate = 0x100 + static_cast<uint32_t>(rng() % (0xFFFFFF - 0x100));
    const std::string name = ShmName(candidate);
    int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      if (errno == EEXIST && RemoveIfStale(candidate)) --attempt;  // Retry with a new number.
      continue;
    }
    if (ftruncate(fd, kSegmentBytes) != 0) {
      close(fd);
      shm_unlink(name.c_str());
      return nullptr;
    }
    Segment* s = MapFd(fd);
    close(fd);
    if (s == nullptr) {
      shm_unlink(name.c_str());
      return nullptr;
    }
    // The file is zero-filled; the atomics need no construction beyond that on x86-64, but
    // placement-new of the header words keeps the object model honest.
    new (&s->pid) std::atomic<int64_t>(getpid());
    s->pidns.store(PidNamespace(), std::memory_order_relaxed);
    s->qpn.store(candidate, std::memory_order_relaxed);
    *qpn = candidate;
    return s;
  }
  return nullptr;
}

Segment* MapSegment(uint32_t qpn) {
  int fd = shm_open(ShmName(qpn).c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return nullptr;
  struct stat st;
  Segment* s = nullptr;
  if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= kSegmentBytes) s = MapFd(fd);
  close(fd);
  if (s != nullptr && s->magic.load(std::memory_order_acquire) != kMagic) {
    UnmapSegment(s);
    s = nullptr;
  }
  return s;
}

void UnmapSegment(Segment* segment) {
  if (segment != nullptr) munmap(segment, kSegmentBytes);
}

void UnlinkSegment(uint32_t qpn) { shm_unlink(ShmName(qpn).c_str()); }

}  // namespace kvrail::transport::softverbs::wire
