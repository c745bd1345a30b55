// Names a thread kvrail started, as top -H, perf, gdb and /proc/<pid>/task/*/comm show it. Every
// thread kvrail starts is named by its starter right after it starts, before the starter returns
// to anyone who could look (docs/ARCHITECTURE.md, "Threads", lists them). Linux keeps 15
// characters: longer names are cut.
#ifndef KVRAIL_ENGINE_SYNC_THREAD_NAME_H_
#define KVRAIL_ENGINE_SYNC_THREAD_NAME_H_

#include <pthread.h>

#include <string>
#include <thread>

namespace kvrail {

inline void NameThread(std::thread& thread, const std::string& name) {
  pthread_setname_np(thread.native_handle(), name.substr(0, 15).c_str());
}

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_SYNC_THREAD_NAME_H_
