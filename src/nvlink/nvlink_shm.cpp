#include "nvlink/nvlink_shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include "nvlink/nvlink_liveness.h"

namespace ferry::nvlink {

namespace {
Status sys_error(const char* call, const std::string& name) {
  return Status(Code::kUnavailable,
                fmt::format("nvlink: {}('{}') failed: {}", call, name, std::strerror(errno)));
}

// A path in the file system, not the abstract namespace: processes in
// different network namespaces (one host) still reach it.
std::string wake_path(const std::string& segment) {
  return "/dev/shm" + segment + ".wake";
}

bool fill_addr(const std::string& path, sockaddr_un* a) {
  *a = sockaddr_un{};
  a->sun_family = AF_UNIX;
  if (path.size() >= sizeof(a->sun_path)) return false;
  std::memcpy(a->sun_path, path.data(), path.size());
  return true;
}

// Vyukov's bounded multi-producer ring, shared by the mailbox and the message
// ring, with the claim made in the slot itself: a producer takes the slot of
// position pos by one CAS of its state from (pos, no claimant) to (pos, its
// pid), then moves enqueue_pos past it. The pid is therefore in the slot from
// the instant it is taken, so the owner can skip the slot of a claimant that
// died before publishing (ShmSegment::skip_dead_claim). A producer finding
// the slot at enqueue_pos already taken for that position moves enqueue_pos
// on itself, so a claimant killed between its two steps blocks no producer.
// enqueue_pos passes a position only once its slot was taken, so the owner
// never waits at a slot nobody claimed while later ones fill.
// Returns the claimed slot, or null when the ring is full (the owner has not
// drained a lap behind). With `advance` false the caller leaves enqueue_pos
// alone (abandon_claim_for_test).
template <class Slot>
Slot* claim(std::atomic<uint64_t>& enqueue_pos, Slot* ring, uint32_t capacity, uint32_t pid,
            uint64_t* pos_out, bool advance = true) {
  uint64_t pos = enqueue_pos.load(std::memory_order_relaxed);
  for (;;) {
    Slot* slot = &ring[pos % capacity];
    uint64_t st = slot->state.load(std::memory_order_acquire);
    const int32_t dif = int32_t(state_seq(st) - uint32_t(pos));
    if (dif < 0) return nullptr;
    if (dif == 0 && state_claimant(st) == 0) {
      // Acquire: the owner's reads of the lap before happened before its
      // release of the slot, so our writes into it cannot race them.
      if (slot->state.compare_exchange_weak(st, slot_state(uint32_t(pos), pid),
                                            std::memory_order_acquire, std::memory_order_relaxed)) {
        *pos_out = pos;
        // Fails when another producer already moved it on for us.
        if (advance) enqueue_pos.compare_exchange_strong(pos, pos + 1, std::memory_order_relaxed);
        return slot;
      }
      continue;  // lost the slot to another producer: look again
    }
    // Taken for pos (claimed, filled or already drained), or pos is stale:
    // move enqueue_pos past it if nobody has; either way pos is now current.
    if (enqueue_pos.compare_exchange_strong(pos, pos + 1, std::memory_order_relaxed)) ++pos;
  }
}

// Claimant's last step: the slot claimed at pos becomes filled. False only
// when the owner skipped the slot, having found this process dead (a pid it
// cannot see, e.g. of another pid namespace): the caller reports back-pressure
// and its next attempt takes a new slot.
template <class Slot>
bool publish_slot(Slot& slot, uint64_t pos, uint32_t pid) {
  uint64_t st = slot_state(uint32_t(pos), pid);
  return slot.state.compare_exchange_strong(st, slot_state(uint32_t(pos + 1), 0),
                                            std::memory_order_release, std::memory_order_relaxed);
}

// Whether the slot of position pos holds what a producer published there.
template <class Slot>
bool filled(const Slot& slot, uint64_t pos, std::memory_order order) {
  return state_seq(slot.state.load(order)) == uint32_t(pos + 1);
}

// Owner: frees the drained slot of position pos for the producer a lap later.
template <class Slot>
void release_slot(Slot& slot, uint64_t pos, uint32_t capacity) {
  slot.state.store(slot_state(uint32_t(pos + capacity), 0), std::memory_order_release);
}

// The owner's wake socket; none when it cannot be made (the owner naps instead).
core::UniqueFd bind_wake_socket(const std::string& path) {
  sockaddr_un a;
  if (!fill_addr(path, &a)) return {};
  core::UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return {};
  ::unlink(path.c_str());  // a file left by a killed process of a reused pid
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return {};
  return fd;
}
}  // namespace

std::unique_ptr<ShmSegment> ShmSegment::create(const std::string& name, uint32_t pid, int device,
                                               Status* error) {
  const core::UniqueFd fd(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600));
  if (!fd.valid()) {
    *error = sys_error("shm_open", name);
    return nullptr;
  }
  auto s = std::make_unique<ShmSegment>(Key{});
  s->name_ = name;
  s->owner_ = true;  // unlinks from here on, also on failure below
  s->self_pid_ = uint32_t(::getpid());
  if (::ftruncate(fd.get(), kShmBytes) != 0) {
    *error = sys_error("ftruncate", name);
    return nullptr;
  }
  void* p = ::mmap(nullptr, kShmBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    *error = sys_error("mmap", name);
    return nullptr;
  }
  s->base_ = p;
  // ftruncate zero-filled the segment; constructing the atomics in place
  // keeps it well-defined C++.
  auto* h = new (p) ShmHeader{};
  h->version = kShmVersion;
  h->pid = pid;
  h->device = device;
  h->mailbox_capacity = kMailboxCapacity;
  h->region_capacity = kRegionCapacity;
  h->enqueue_pos.store(0, std::memory_order_relaxed);
  h->dequeue_pos = 0;
  h->sleeping.store(0, std::memory_order_relaxed);
  h->msg_enqueue_pos.store(0, std::memory_order_relaxed);
  h->msg_dequeue_pos = 0;
  MailboxCell* cells = s->cells();
  for (uint32_t i = 0; i < kMailboxCapacity; ++i) {
    new (&cells[i]) MailboxCell{};
    cells[i].state.store(slot_state(i, 0), std::memory_order_relaxed);
  }
  RegionEntry* regs = s->regions();
  for (uint32_t i = 0; i < kRegionCapacity; ++i) new (&regs[i]) RegionEntry{};
  // Only the slots' headers: their data pages stay untouched until used.
  MsgSlot* msgs = s->msgs();
  for (uint32_t i = 0; i < kMsgSlots; ++i) {
    new (&msgs[i].state) std::atomic<uint64_t>(slot_state(i, 0));
    new (&msgs[i].len) std::atomic<uint32_t>(0);
  }
  s->wake_fd_ = bind_wake_socket(wake_path(name));
  if (s->wake_fd_.valid()) s->wake_path_ = wake_path(name);
  // The magic last, released: a reader that sees it sees an initialised segment.
  std::atomic_ref<uint64_t>(h->magic).store(kShmMagic, std::memory_order_release);
  *error = Status::ok();
  return s;
}

std::unique_ptr<ShmSegment> ShmSegment::open(const std::string& name, Status* error) {
  const core::UniqueFd fd(::shm_open(name.c_str(), O_RDWR, 0));
  if (!fd.valid()) {
    *error = Status(errno == ENOENT ? Code::kUnavailable : Code::kFailedPrecondition,
                    fmt::format("nvlink: peer segment '{}' cannot be opened ({}): the peer "
                                "exited or runs as another user",
                                name, std::strerror(errno)));
    return nullptr;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || size_t(st.st_size) < kShmBytes) {
    *error = Status(Code::kInvalidArgument,
                    fmt::format("nvlink: peer segment '{}' is {} bytes, expected {}", name,
                                size_t(st.st_size), kShmBytes));
    return nullptr;
  }
  void* p = ::mmap(nullptr, kShmBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    *error = sys_error("mmap", name);
    return nullptr;
  }
  auto s = std::make_unique<ShmSegment>(Key{});
  s->name_ = name;
  s->base_ = p;
  s->self_pid_ = uint32_t(::getpid());
  s->wake_path_ = wake_path(name);
  s->wake_fd_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (sockaddr_un a; fill_addr(s->wake_path_, &a)) s->wake_addr_ = a;
  const ShmHeader& h = s->header();
  if (std::atomic_ref<const uint64_t>(h.magic).load(std::memory_order_acquire) != kShmMagic ||
      h.version != kShmVersion || h.mailbox_capacity != kMailboxCapacity ||
      h.region_capacity != kRegionCapacity) {
    *error = Status(
        Code::kInvalidArgument,
        fmt::format("nvlink: '{}' is not a ferry NVLink segment of version {}", name, kShmVersion));
    return nullptr;
  }
  *error = Status::ok();
  return s;
}

ShmSegment::~ShmSegment() {
  if (base_ != nullptr) ::munmap(base_, kShmBytes);
  if (owner_) {
    ::shm_unlink(name_.c_str());
    if (!wake_path_.empty()) ::unlink(wake_path_.c_str());
  }
}

bool ShmSegment::push_run(uint32_t imm, uint32_t count) {
  uint64_t pos;
  MailboxCell* cell = claim(header().enqueue_pos, cells(), kMailboxCapacity, self_pid_, &pos);
  if (cell == nullptr) return false;
  cell->imm.store(imm, std::memory_order_relaxed);
  cell->count.store(count, std::memory_order_relaxed);
  if (!publish_slot(*cell, pos, self_pid_)) return false;
  wake_owner();
  return true;
}

bool ShmSegment::abandon_claim_for_test(bool message, bool advance) {
  uint64_t pos;
  if (message) return claim(header().msg_enqueue_pos, msgs(), kMsgSlots, self_pid_, &pos, advance);
  return claim(header().enqueue_pos, cells(), kMailboxCapacity, self_pid_, &pos, advance);
}

// The owner found the slot of position pos (the oldest) in `state`: claimed,
// not published. Waits kDeadClaimCheck, then asks whether the claimant runs
// (pidfd, else kill(pid, 0)), again each period while it stays so; true once
// the claimant was found dead and the slot freed for the next lap, so the
// caller moves past it. A claimant that publishes meanwhile wins the CAS.
template <class Slot>
bool ShmSegment::skip_dead_claim(Slot& slot, uint64_t pos, uint64_t state, uint32_t capacity,
                                 Stall& stall) {
  const auto now = std::chrono::steady_clock::now();
  if (stall.pos != pos) {
    stall.pos = pos;
    stall.check_at = now + kDeadClaimCheck;
    return false;
  }
  if (now < stall.check_at) return false;
  stall.check_at = now + kDeadClaimCheck;
  const uint32_t claimant = state_claimant(state);
  if (PeerLiveness(pid_t(claimant)).alive()) return false;
  if (!slot.state.compare_exchange_strong(state, slot_state(uint32_t(pos + capacity), 0),
                                          std::memory_order_acq_rel, std::memory_order_relaxed))
    return false;
  stall.pos = ~0ull;
  last_lost_claimant_ = claimant;
  return true;
}

// After a cell or message is published. Pairs with the fence in
// prepare_to_sleep: either the owner sees what was published before it
// blocks, or this sees its announcement and wakes it.
void ShmSegment::wake_owner() {
  ShmHeader& h = header();
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (h.sleeping.load(std::memory_order_relaxed) == 0 ||
      h.sleeping.exchange(0, std::memory_order_relaxed) == 0 || !wake_fd_.valid() || !wake_addr_)
    return;
  const char b = 1;
  // Best effort: a full socket buffer means the owner is being woken anyway,
  // a gone owner needs no waking; its poll has a 2 ms timeout.
  (void)::sendto(wake_fd_.get(), &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL,
                 reinterpret_cast<const sockaddr*>(&*wake_addr_), sizeof(sockaddr_un));
}

bool ShmSegment::push_msg(const void* data, size_t len) {
  if (len > kMsgBytes) return false;
  uint64_t pos;
  MsgSlot* slot = claim(header().msg_enqueue_pos, msgs(), kMsgSlots, self_pid_, &pos);
  if (slot == nullptr) return false;
  if (len > 0) std::memcpy(slot->data, data, len);  // an empty message may come with no buffer
  slot->len.store(uint32_t(len), std::memory_order_relaxed);
  if (!publish_slot(*slot, pos, self_pid_)) return false;
  wake_owner();
  return true;
}

int64_t ShmSegment::pop_msg(void* dst, size_t cap) {
  ShmHeader& h = header();
  for (;;) {
    const uint64_t pos = h.msg_dequeue_pos;
    MsgSlot& slot = msgs()[pos % kMsgSlots];
    const uint64_t st = slot.state.load(std::memory_order_acquire);
    if (state_seq(st) != uint32_t(pos + 1)) {
      if (state_seq(st) != uint32_t(pos) || state_claimant(st) == 0 ||
          !skip_dead_claim(slot, pos, st, kMsgSlots, msg_stall_))
        return -1;
      ++lost_msgs_;
      h.msg_dequeue_pos = pos + 1;
      continue;
    }
    const size_t len = slot.len.load(std::memory_order_relaxed);
    // A length beyond the slot is a writer's fault: never read past the slot.
    if (const size_t n = std::min({len, cap, kMsgBytes}); n > 0) std::memcpy(dst, slot.data, n);
    release_slot(slot, pos, kMsgSlots);
    h.msg_dequeue_pos = pos + 1;
    return int64_t(len);
  }
}

bool ShmSegment::prepare_to_sleep(bool messages_count) {
  if (!wake_fd_.valid()) return false;
  ShmHeader& h = header();
  h.sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const uint64_t pos = h.dequeue_pos, mpos = h.msg_dequeue_pos;
  const bool run = filled(cells()[pos % kMailboxCapacity], pos, std::memory_order_relaxed);
  const bool msg =
      messages_count && filled(msgs()[mpos % kMsgSlots], mpos, std::memory_order_relaxed);
  if (run || msg) {
    h.sleeping.store(0, std::memory_order_relaxed);
    return false;
  }
  return true;
}

void ShmSegment::woken() {
  header().sleeping.store(0, std::memory_order_relaxed);
  char buf[64];
  while (wake_fd_.valid() && ::recv(wake_fd_.get(), buf, sizeof(buf), MSG_DONTWAIT) > 0) {
  }
}

size_t ShmSegment::pop_runs(std::span<ImmRun> out) {
  ShmHeader& h = header();
  MailboxCell* c = cells();
  size_t n = 0;
  while (n < out.size()) {
    const uint64_t pos = h.dequeue_pos;
    MailboxCell& cell = c[pos % kMailboxCapacity];
    const uint64_t st = cell.state.load(std::memory_order_acquire);
    if (state_seq(st) != uint32_t(pos + 1)) {
      if (state_seq(st) != uint32_t(pos) || state_claimant(st) == 0 ||
          !skip_dead_claim(cell, pos, st, kMailboxCapacity, run_stall_))
        break;
      ++lost_runs_;
      h.dequeue_pos = pos + 1;
      continue;
    }
    out[n++] = ImmRun{cell.imm.load(std::memory_order_relaxed),
                      cell.count.load(std::memory_order_relaxed)};
    release_slot(cell, pos, kMailboxCapacity);
    h.dequeue_pos = pos + 1;
  }
  return n;
}

uint64_t ShmSegment::publish(uint64_t ptr, uint64_t len, uint64_t alloc_offset,
                             const uint8_t (&handle)[kIpcHandleBytes]) {
  uint32_t slot;
  if (free_count_ > 0) {
    slot = free_list_[--free_count_];
  } else if (next_free_ < kRegionCapacity) {
    slot = next_free_++;
  } else {
    return 0;
  }
  RegionEntry& e = regions()[slot];
  const uint64_t gen = next_gen_++;
  // Seqlock write (one writer): gen 0 first, then the fields with release
  // stores, so a reader whose acquire load of any field sees a new value also
  // sees gen no longer its own when it loads gen again; then the new gen,
  // released after the fields.
  e.gen.store(0, std::memory_order_relaxed);
  e.ptr.store(ptr, std::memory_order_release);
  e.len.store(len, std::memory_order_release);
  e.alloc_offset.store(alloc_offset, std::memory_order_release);
  for (size_t i = 0; i < kIpcHandleBytes / 8; ++i) {
    uint64_t w;
    std::memcpy(&w, handle + 8 * i, 8);
    e.handle[i].store(w, std::memory_order_release);
  }
  e.gen.store(gen, std::memory_order_release);
  return gen << 32 | slot;
}

void ShmSegment::unpublish(uint64_t rkey) {
  const uint32_t slot = uint32_t(rkey);
  if (slot >= kRegionCapacity) return;
  RegionEntry& e = regions()[slot];
  if (e.gen.load(std::memory_order_relaxed) != rkey >> 32) return;
  e.gen.store(0, std::memory_order_release);
  free_list_[free_count_++] = slot;
}

bool ShmSegment::lookup(uint64_t rkey, RegionInfo* out) {
  const uint32_t slot = uint32_t(rkey);
  const uint64_t gen = rkey >> 32;
  if (slot >= kRegionCapacity || gen == 0) return false;
  RegionEntry& e = regions()[slot];
  // Seqlock read: the rkey's generation before and after brackets a stable
  // copy. No retry: generations are never reused, so a slot rewritten since
  // the first load will never hold this rkey again.
  if (e.gen.load(std::memory_order_acquire) != gen) return false;
  RegionInfo r;
  r.ptr = e.ptr.load(std::memory_order_acquire);
  r.len = e.len.load(std::memory_order_acquire);
  r.alloc_offset = e.alloc_offset.load(std::memory_order_acquire);
  for (size_t i = 0; i < kIpcHandleBytes / 8; ++i) {
    const uint64_t w = e.handle[i].load(std::memory_order_acquire);
    std::memcpy(r.handle + 8 * i, &w, 8);
  }
  if (e.gen.load(std::memory_order_relaxed) != gen) return false;
  *out = r;
  return true;
}

}  // namespace ferry::nvlink
