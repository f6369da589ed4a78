// ThreadSanitizer annotations for the test harness (docs/RELIABILITY.md,
// "Sanitizers"). Without ThreadSanitizer they compile to nothing.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define FERRY_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_TEST_TSAN 1
#endif
#endif

#if defined(FERRY_TEST_TSAN)
// Exported by the TSan runtime (libtsan); GCC 12's <sanitizer/tsan_interface.h>
// does not declare them.
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

namespace ferry::test {

// Scope of a harness access (a check of landed bytes, a re-poisoning memset)
// to registered memory that a NIC writes, where TSan cannot see the order
// between the access and the NIC's writes.
//
// With libfabric's tcp;ofi_rxm and shm providers the "NIC" is software: a
// landing write is a recv()/memcpy() inside libfabric on the receiving
// engine's worker thread, which TSan tracks like any other access. Two
// harness patterns then look like races although they are not ferry's:
//
//  - Reuse ordered through another process. The harness checks the bytes
//    (after the immediate count, an acquire TSan does see), answers the
//    sender over a socket, and the sender's next write lands on the same
//    bytes. The order check -> socket -> other process -> landing write is
//    invisible to TSan, so every later landing write is reported against the
//    check. Suppressing those (race:libfabric.so.1) is not enough: each one
//    still runs TSan's whole report path (stack restoration, a list of racy
//    addresses that grows with every report), which made one 8 MiB landing
//    write take over 30 s and the multi-NIC tests run out of time; and once
//    the worker's history no longer holds the libfabric stack the
//    suppression does not even match.
//  - Writes without an immediate. Nothing signals that they landed (the API
//    promises nothing), so the harness polls until the bytes match: racy by
//    design, bounded by a timeout.
//
// The scope makes TSan ignore the calling thread's own memory accesses until
// it ends. That is the narrowest tool that works: __tsan_acquire needs a
// release on the writing side, which is inside libfabric; a suppression
// would also hide real ferry races on the same memory (a region freed or a
// send buffer reused while the provider still uses it); and
// AnnotateIgnoreReadsBegin/End is, in the TSan runtime, the same per-thread
// ignore as __tsan_ignore_thread_begin/end, not a reads-only one. Nothing
// else is hidden: other threads, all synchronisation, and the harness outside
// the scope are checked as usual. What a scope gives up is TSan checking
// that its reads come after the landing writes; the test checks that itself
// (the bytes must match once the immediates are counted).
class NicMemoryAccess {
 public:
#if defined(FERRY_TEST_TSAN)
  NicMemoryAccess() {
    __tsan_ignore_thread_begin();
  }
  ~NicMemoryAccess() {
    __tsan_ignore_thread_end();
  }
#else
  NicMemoryAccess() = default;
#endif
  NicMemoryAccess(const NicMemoryAccess&) = delete;
  NicMemoryAccess& operator=(const NicMemoryAccess&) = delete;
};

}  // namespace ferry::test
