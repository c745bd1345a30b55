// Which sanitizer this translation unit is built with, the same way under gcc and clang: gcc
// predefines __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__, clang 14 answers __has_feature only.
//   KVRAIL_ASAN  1 under -fsanitize=address, else 0
//   KVRAIL_TSAN  1 under -fsanitize=thread, else 0
#ifndef KVRAIL_ENGINE_BASE_SANITIZERS_H_
#define KVRAIL_ENGINE_BASE_SANITIZERS_H_

#if defined(__SANITIZE_ADDRESS__)
#define KVRAIL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVRAIL_ASAN 1
#endif
#endif
#ifndef KVRAIL_ASAN
#define KVRAIL_ASAN 0
#endif

#if defined(__SANITIZE_THREAD__)
#define KVRAIL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVRAIL_TSAN 1
#endif
#endif
#ifndef KVRAIL_TSAN
#define KVRAIL_TSAN 0
#endif

#endif  // KVRAIL_ENGINE_BASE_SANITIZERS_H_
