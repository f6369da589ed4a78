// The engine's interned peer addresses. A request names its destination by a
// pointer into this table instead of a copy of the caller's NetAddr: a copy
// bumps the address's shared count on the submitting thread and drops it on
// the worker, so that count's cache line crossed between the two cores twice
// per request, both times on the way to the wire.
//
// Entries live as long as the table (the workers keep every address they have
// resolved anyway, restarted peers' old ones included); holders of requests
// that may outlive the engine (prepared transfers) keep the table alive.
//
// Lookups take no lock: an open-addressed array of pointers, published whole.
// Inserts take a mutex and, past half full, publish a doubled array; earlier
// arrays stay until the table dies, since a reader may still be probing one
// (a miss there is retried under the mutex).
#pragma once

#include <atomic>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "ferry/types.h"

namespace ferry::core {

class AddrTable {
 public:
  AddrTable();
  AddrTable(const AddrTable&) = delete;
  AddrTable& operator=(const AddrTable&) = delete;

  // The table's copy of `addr` (equal bytes). Any thread; `addr` not empty.
  const NetAddr* intern(const NetAddr& addr) {
    // A thread that names one peer again and again (a ping-pong, a layer's
    // writes to one decoder) names it through the same descriptor: the same
    // bytes in memory, which the cached copy keeps alive, so comparing where
    // they lie is comparing them. That skips the probe's chain of loads and
    // the bytes' comparison.
    LastLookup& last = t_last;
    if (last.table == id_ && last.addr.bytes().data() == addr.bytes().data()) return last.entry;
    const NetAddr* e = lookup(addr);
    last.table = id_;
    last.addr = addr;
    last.entry = e;
    return e;
  }

  size_t size() const;

 private:
  struct Array {
    size_t mask = 0;
    std::unique_ptr<std::atomic<const NetAddr*>[]> slots;
  };
  struct LastLookup {
    uint64_t table = 0;  // id_ of the table `entry` belongs to
    NetAddr addr;
    const NetAddr* entry = nullptr;
  };
  static thread_local LastLookup t_last;

  const NetAddr* lookup(const NetAddr& addr) {
    const Array* a = current_.load(std::memory_order_acquire);
    for (size_t i = addr.hash() & a->mask;; i = (i + 1) & a->mask) {
      const NetAddr* e = a->slots[i].load(std::memory_order_acquire);
      if (e == nullptr) break;
      if (*e == addr) return e;
    }
    return insert(addr);
  }
  const NetAddr* insert(const NetAddr& addr);
  static std::unique_ptr<Array> make_array(size_t capacity);
  static void place(Array& a, const NetAddr* e);

  // Never reused, unlike the table's address: a thread's cached lookup of a
  // table that died cannot match its successor.
  const uint64_t id_;
  std::atomic<const Array*> current_{nullptr};
  mutable std::mutex mu_;
  std::deque<NetAddr> entries_;                 // stable: only ever appended to
  std::vector<std::unique_ptr<Array>> arrays_;  // every array published, the current last
};

}  // namespace ferry::core
