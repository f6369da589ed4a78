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
// ring: a slot's sequence is pos when free for the producer at pos, pos + 1
// once filled. Claims the slot of the next position, or null when the ring is
// full (the owner has not drained a lap behind).
template <class Slot>
Slot* claim(std::atomic<uint64_t>& enqueue_pos, Slot* ring, uint32_t capacity, uint64_t* pos_out) {
  uint64_t pos = enqueue_pos.load(std::memory_order_relaxed);
  for (;;) {
    Slot* slot = &ring[pos % capacity];
    const int32_t dif = int32_t(slot->seq.load(std::memory_order_acquire) - uint32_t(pos));
    if (dif < 0) return nullptr;
    if (dif == 0 && enqueue_pos.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
      *pos_out = pos;
      return slot;
    }
    if (dif > 0) pos = enqueue_pos.load(std::memory_order_relaxed);
  }
}

// Whether the slot of position pos holds what a producer published there.
template <class Slot>
bool filled(const Slot& slot, uint64_t pos, std::memory_order order) {
  return slot.seq.load(order) == uint32_t(pos + 1);
}

// The owner's wake socket; -1 when it cannot be made (the owner naps instead).
int bind_wake_socket(const std::string& path) {
  sockaddr_un a;
  if (!fill_addr(path, &a)) return -1;
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  ::unlink(path.c_str());  // a file left by a killed process of a reused pid
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}
}  // namespace

std::unique_ptr<ShmSegment> ShmSegment::create(const std::string& name, uint32_t pid, int device,
                                               Status* error) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    *error = sys_error("shm_open", name);
    return nullptr;
  }
  std::unique_ptr<ShmSegment> s(new ShmSegment());
  s->name_ = name;
  s->owner_ = true;  // unlinks from here on, also on failure below
  if (::ftruncate(fd, kShmBytes) != 0) {
    *error = sys_error("ftruncate", name);
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, kShmBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
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
    cells[i].seq.store(i, std::memory_order_relaxed);
  }
  RegionEntry* regs = s->regions();
  for (uint32_t i = 0; i < kRegionCapacity; ++i) new (&regs[i]) RegionEntry{};
  // Only the slots' headers: their data pages stay untouched until used.
  MsgSlot* msgs = s->msgs();
  for (uint32_t i = 0; i < kMsgSlots; ++i) {
    new (&msgs[i].seq) std::atomic<uint32_t>(i);
    new (&msgs[i].len) std::atomic<uint32_t>(0);
  }
  s->wake_fd_ = bind_wake_socket(wake_path(name));
  if (s->wake_fd_ >= 0) s->wake_path_ = wake_path(name);
  // The magic last, released: a reader that sees it sees an initialised segment.
  std::atomic_ref<uint64_t>(h->magic).store(kShmMagic, std::memory_order_release);
  *error = Status::ok();
  return s;
}

std::unique_ptr<ShmSegment> ShmSegment::open(const std::string& name, Status* error) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    *error = Status(errno == ENOENT ? Code::kUnavailable : Code::kFailedPrecondition,
                    fmt::format("nvlink: peer segment '{}' cannot be opened ({}): the peer "
                                "exited or runs as another user",
                                name, std::strerror(errno)));
    return nullptr;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || size_t(st.st_size) < kShmBytes) {
    ::close(fd);
    *error = Status(Code::kInvalidArgument,
                    fmt::format("nvlink: peer segment '{}' is {} bytes, expected {}", name,
                                size_t(st.st_size), kShmBytes));
    return nullptr;
  }
  void* p = ::mmap(nullptr, kShmBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    *error = sys_error("mmap", name);
    return nullptr;
  }
  std::unique_ptr<ShmSegment> s(new ShmSegment());
  s->name_ = name;
  s->base_ = p;
  s->wake_path_ = wake_path(name);
  s->wake_fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
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
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (owner_) {
    ::shm_unlink(name_.c_str());
    if (!wake_path_.empty()) ::unlink(wake_path_.c_str());
  }
}

bool ShmSegment::push_run(uint32_t imm, uint32_t count) {
  uint64_t pos;
  MailboxCell* cell = claim(header().enqueue_pos, cells(), kMailboxCapacity, &pos);
  if (cell == nullptr) return false;
  cell->imm.store(imm, std::memory_order_relaxed);
  cell->count.store(count, std::memory_order_relaxed);
  cell->seq.store(uint32_t(pos + 1), std::memory_order_release);
  wake_owner();
  return true;
}

// After a cell or message is published. Pairs with the fence in
// prepare_to_sleep: either the owner sees what was published before it
// blocks, or this sees its announcement and wakes it.
void ShmSegment::wake_owner() {
  ShmHeader& h = header();
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (h.sleeping.load(std::memory_order_relaxed) == 0 ||
      h.sleeping.exchange(0, std::memory_order_relaxed) == 0 || wake_fd_ < 0 || !wake_addr_)
    return;
  const char b = 1;
  // Best effort: a full socket buffer means the owner is being woken anyway,
  // a gone owner needs no waking; its poll has a 2 ms timeout.
  (void)::sendto(wake_fd_, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL,
                 reinterpret_cast<const sockaddr*>(&*wake_addr_), sizeof(sockaddr_un));
}

bool ShmSegment::push_msg(const void* data, size_t len) {
  if (len > kMsgBytes) return false;
  uint64_t pos;
  MsgSlot* slot = claim(header().msg_enqueue_pos, msgs(), kMsgSlots, &pos);
  if (slot == nullptr) return false;
  if (len > 0) std::memcpy(slot->data, data, len);  // an empty message may come with no buffer
  slot->len.store(uint32_t(len), std::memory_order_relaxed);
  slot->seq.store(uint32_t(pos + 1), std::memory_order_release);
  wake_owner();
  return true;
}

int64_t ShmSegment::pop_msg(void* dst, size_t cap) {
  ShmHeader& h = header();
  const uint64_t pos = h.msg_dequeue_pos;
  MsgSlot& slot = msgs()[pos % kMsgSlots];
  if (!filled(slot, pos, std::memory_order_acquire)) return -1;
  const size_t len = slot.len.load(std::memory_order_relaxed);
  // A length beyond the slot is a writer's fault: never read past the slot.
  if (const size_t n = std::min({len, cap, kMsgBytes}); n > 0) std::memcpy(dst, slot.data, n);
  slot.seq.store(uint32_t(pos + kMsgSlots), std::memory_order_release);
  h.msg_dequeue_pos = pos + 1;
  return int64_t(len);
}

bool ShmSegment::prepare_to_sleep(bool messages_count) {
  if (wake_fd_ < 0) return false;
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
  while (wake_fd_ >= 0 && ::recv(wake_fd_, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
  }
}

size_t ShmSegment::pop_runs(std::span<ImmRun> out) {
  ShmHeader& h = header();
  MailboxCell* c = cells();
  size_t n = 0;
  while (n < out.size()) {
    const uint64_t pos = h.dequeue_pos;
    MailboxCell& cell = c[pos % kMailboxCapacity];
    if (!filled(cell, pos, std::memory_order_acquire)) break;
    out[n++] = ImmRun{cell.imm.load(std::memory_order_relaxed),
                      cell.count.load(std::memory_order_relaxed)};
    cell.seq.store(uint32_t(pos + kMailboxCapacity), std::memory_order_release);
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
  e.gen.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  e.ptr = ptr;
  e.len = len;
  e.alloc_offset = alloc_offset;
  std::memcpy(e.handle, handle, kIpcHandleBytes);
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

bool ShmSegment::lookup(uint64_t rkey, RegionEntry* out) {
  const uint32_t slot = uint32_t(rkey);
  const uint64_t gen = rkey >> 32;
  if (slot >= kRegionCapacity || gen == 0) return false;
  RegionEntry& e = regions()[slot];
  // Seqlock read: the generation before and after brackets a stable copy.
  if (e.gen.load(std::memory_order_acquire) != gen) return false;
  out->ptr = e.ptr;
  out->len = e.len;
  out->alloc_offset = e.alloc_offset;
  std::memcpy(out->handle, e.handle, kIpcHandleBytes);
  std::atomic_thread_fence(std::memory_order_acquire);
  return e.gen.load(std::memory_order_relaxed) == gen;
}

}  // namespace ferry::nvlink
