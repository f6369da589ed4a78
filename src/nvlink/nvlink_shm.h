// The shared-memory half of the NVLink domain (plain C++, no CUDA): each
// domain owns one POSIX shm segment that peers on the same host map. It holds
//   - the mailbox: a bounded multi-producer ring of immediate runs (an
//     immediate and how many writes carried it) that writers push after their
//     data is complete and the owner's poll() drains;
//   - the region table: for each registration, the CUDA IPC handle of its
//     allocation, indexed by the slot in the rkey;
//   - the message ring: two-sided messages (send/recv), copied in by the
//     sender and out into a posted receive buffer by the owner.
// Descriptors (MrDesc) only carry rkey and base, so the 64-byte IPC handle
// cannot travel in them; the table makes the rkey enough.
#pragma once

#include <sys/un.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "core/unique_fd.h"
#include "ferry/status.h"

namespace ferry::nvlink {

inline constexpr uint64_t kShmMagic = 0x4b4e4c564e595246ull;  // "FRYNVLNK"
inline constexpr uint32_t kShmVersion = 5;
// Messages: slots of this many bytes (the engine's default send buffer); the
// pages of a slot are only touched when a message that long is sent.
inline constexpr uint32_t kMsgSlots = 64;
inline constexpr size_t kMsgBytes = 64 << 10;
inline constexpr uint32_t kMailboxCapacity = 1u << 16;  // power of two
inline constexpr uint32_t kRegionCapacity = 4096;
inline constexpr size_t kIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)
// The owner finding the oldest cell (or message slot) claimed but not
// published asks whether its claimant still runs after this long, and again
// every period while it stays so; a dead claimant's slot is skipped.
inline constexpr std::chrono::milliseconds kDeadClaimCheck{10};

// Atomics in the segment must be address-free to work across processes.
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// A cell's or message slot's state word: the low half is Vyukov's sequence
// (pos = free for the producer at pos, pos + 1 = filled), the high half the
// pid of the producer that claimed the slot and has not published it yet
// (0 otherwise). A producer claims by one CAS of the whole word, so a slot is
// never claimed without its claimant's pid: the owner can tell a claimant
// that is still filling the slot from one that was killed doing so.
inline constexpr uint64_t slot_state(uint32_t seq, uint32_t claimant) {
  return uint64_t(claimant) << 32 | seq;
}
inline constexpr uint32_t state_seq(uint64_t state) {
  return uint32_t(state);
}
inline constexpr uint32_t state_claimant(uint64_t state) {
  return uint32_t(state >> 32);
}

// One cell per run: a paged write of 1 024 pages is one cell, not 1 024, so
// the writer and the owner trade one cache line per transfer instead of 128
// (measured: a cell per immediate held 4 KiB pages to ~160 GB/s).
struct MailboxCell {
  std::atomic<uint64_t> state;  // slot_state(seq, claimant)
  std::atomic<uint32_t> imm;
  std::atomic<uint32_t> count;
};
static_assert(sizeof(MailboxCell) == 16);

// What a pop returns: `count` writes arrived carrying `imm`.
struct ImmRun {
  uint32_t imm;
  uint32_t count;
};

// A seqlock on the generation: the owner (one writer, under the domain's
// lock) zeroes `gen`, stores the fields, then stores the new generation;
// writers of other processes copy the fields between two loads of `gen` and
// keep the copy only when both saw the generation of their rkey. Every field
// is an atomic (release stores, acquire loads), so a copy taken during a
// rewrite is a detected retry, never a data race (ShmSegment::lookup).
struct RegionEntry {
  // 0 = free or being rewritten; else the generation in the rkey's top half.
  std::atomic<uint64_t> gen;
  std::atomic<uint64_t> ptr;  // owner's address of byte 0 of the registration
  std::atomic<uint64_t> len;
  std::atomic<uint64_t> alloc_offset;  // ptr - base of the CUDA allocation the handle covers
  std::atomic<uint64_t> handle[kIpcHandleBytes / 8];
  uint8_t pad[32];
};
static_assert(sizeof(RegionEntry) == 128);

// A consistent copy of a published RegionEntry.
struct RegionInfo {
  uint64_t ptr = 0;
  uint64_t len = 0;
  uint64_t alloc_offset = 0;
  uint8_t handle[kIpcHandleBytes] = {};
};

struct MsgSlot {
  std::atomic<uint64_t> state;  // slot_state(seq, claimant), as in the mailbox
  std::atomic<uint32_t> len;
  uint8_t pad[52];
  uint8_t data[kMsgBytes];
};
static_assert(sizeof(MsgSlot) == 64 + kMsgBytes);

struct ShmHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t pid;
  int32_t device;
  uint32_t mailbox_capacity;
  uint32_t region_capacity;
  uint32_t pad0;
  alignas(64) std::atomic<uint64_t> enqueue_pos;
  alignas(64) uint64_t dequeue_pos;  // owner only
  // 1 while the owner's worker blocks on its wake socket: the next writer to
  // push clears it and sends one datagram (see ShmSegment::prepare_to_sleep).
  alignas(64) std::atomic<uint32_t> sleeping;
  alignas(64) std::atomic<uint64_t> msg_enqueue_pos;
  alignas(64) uint64_t msg_dequeue_pos;  // owner only
};

inline constexpr size_t kShmBytes = sizeof(ShmHeader) + sizeof(MailboxCell) * kMailboxCapacity +
                                    sizeof(RegionEntry) * kRegionCapacity +
                                    sizeof(MsgSlot) * kMsgSlots;

// RAII mapping of a segment. The owner creates (and on destruction unlinks)
// it; writers open an existing one by name.
class ShmSegment {
  struct Key {
    explicit Key() = default;
  };

 public:
  // Only create() and open() can name Key: a segment is made by them alone.
  explicit ShmSegment(Key) {}
  static std::unique_ptr<ShmSegment> create(const std::string& name, uint32_t pid, int device,
                                            Status* error);
  static std::unique_ptr<ShmSegment> open(const std::string& name, Status* error);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  ShmHeader& header() { return *static_cast<ShmHeader*>(base_); }
  MailboxCell* cells() {
    return reinterpret_cast<MailboxCell*>(static_cast<uint8_t*>(base_) + sizeof(ShmHeader));
  }
  RegionEntry* regions() {
    return reinterpret_cast<RegionEntry*>(reinterpret_cast<uint8_t*>(cells()) +
                                          sizeof(MailboxCell) * kMailboxCapacity);
  }
  MsgSlot* msgs() {
    return reinterpret_cast<MsgSlot*>(reinterpret_cast<uint8_t*>(regions()) +
                                      sizeof(RegionEntry) * kRegionCapacity);
  }
  const std::string& name() const { return name_; }

  // Any process: `count` (>= 1) writes carrying `imm`, as one cell; false
  // when the ring is full (back-pressure; retry later). Wakes a sleeping owner.
  bool push_run(uint32_t imm, uint32_t count);
  bool push_imm(uint32_t imm) { return push_run(imm, 1); }
  // Owner only: up to out.size() runs in push order. A cell whose claimant
  // died before publishing it is skipped (lost_runs()) once kDeadClaimCheck
  // has passed and the claimant is found dead; a live claimant is waited for.
  size_t pop_runs(std::span<ImmRun> out);

  // Any process: copies a message of len <= kMsgBytes into the ring; false
  // when the ring is full (back-pressure). Wakes a sleeping owner.
  bool push_msg(const void* data, size_t len);
  // Owner only: copies the oldest message (at most cap bytes) to dst and frees
  // its slot; returns its full length, or -1 when there is none. Skips the
  // slot of a dead claimant as pop_runs does (lost_msgs()).
  int64_t pop_msg(void* dst, size_t cap);

  // Owner only: cells and message slots skipped because their claimant died
  // between claiming and publishing them; the pid of the last such claimant.
  uint64_t lost_runs() const { return lost_runs_; }
  uint64_t lost_msgs() const { return lost_msgs_; }
  uint32_t last_lost_claimant() const { return last_lost_claimant_; }

  // Tests only: claims the next mailbox cell (or message slot) and leaves it
  // unpublished, as a writer killed between the two steps does; with
  // `advance` false, also before moving the enqueue position past it (a
  // writer killed right after its claim). False when the ring is full.
  bool abandon_claim_for_test(bool message, bool advance);

  // Owner only: a datagram socket that becomes readable when a writer pushes
  // while the owner sleeps, so an idle worker can block in poll(2) instead of
  // napping; -1 when it could not be made (the worker naps then).
  int wake_fd() const { return wake_fd_.get(); }
  // Owner only: announces the owner is about to block; false (and not
  // announced) when the mailbox already holds a run, or, with
  // `messages_count`, the message ring a message.
  bool prepare_to_sleep(bool messages_count = false);
  // Owner only: after blocking: withdraws the announcement, drains the socket.
  void woken();

  // Owner only: publishes a region; returns its rkey (generation << 32 | slot)
  // or 0 when the table is full.
  uint64_t publish(uint64_t ptr, uint64_t len, uint64_t alloc_offset,
                   const uint8_t (&handle)[kIpcHandleBytes]);
  void unpublish(uint64_t rkey);
  // Any process: a consistent copy of the entry of `rkey`; false when it is
  // not (or no longer) published.
  bool lookup(uint64_t rkey, RegionInfo* out);

 private:
  // Owner: the oldest slot of a ring, found claimed but not published.
  struct Stall {
    uint64_t pos = ~0ull;
    std::chrono::steady_clock::time_point check_at{};
  };
  void wake_owner();
  template <class Slot>
  bool skip_dead_claim(Slot& slot, uint64_t pos, uint64_t state, uint32_t capacity, Stall& stall);
  std::string name_;
  void* base_ = nullptr;
  bool owner_ = false;
  core::UniqueFd wake_fd_;                // owner: bound socket; writer: unbound, to send from
  std::string wake_path_;                 // the owner's socket, a file beside the segment
  std::optional<sockaddr_un> wake_addr_;  // writer: wake_path_ as an address
  uint32_t next_free_ = 0;                // owner: slots never used yet start here
  uint32_t free_list_[kRegionCapacity];
  uint32_t free_count_ = 0;
  uint64_t next_gen_ = 1;
  uint32_t self_pid_ = 0;  // recorded as the claimant of the slots this process claims
  Stall run_stall_, msg_stall_;
  uint64_t lost_runs_ = 0, lost_msgs_ = 0;
  uint32_t last_lost_claimant_ = 0;
};

}  // namespace ferry::nvlink
