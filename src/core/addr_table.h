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
    const Array* a = current_.load(std::memory_order_acquire);
    for (size_t i = addr.hash() & a->mask;; i = (i + 1) & a->mask) {
      const NetAddr* e = a->slots[i].load(std::memory_order_acquire);
      if (e == nullptr) break;
      if (*e == addr) return e;
    }
    return insert(addr);
  }

  size_t size() const;

 private:
  struct Array {
    size_t mask = 0;
    std::unique_ptr<std::atomic<const NetAddr*>[]> slots;
  };
  const NetAddr* insert(const NetAddr& addr);
  static std::unique_ptr<Array> make_array(size_t capacity);
  static void place(Array& a, const NetAddr* e);

  std::atomic<const Array*> current_{nullptr};
  mutable std::mutex mu_;
  std::deque<NetAddr> entries_;                 // stable: only ever appended to
  std::vector<std::unique_ptr<Array>> arrays_;  // every array published, the current last
};

}  // namespace ferry::core
