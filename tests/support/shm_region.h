// What tests need to know of libfabric 1.17's shm regions (/dev/shm/<pid>:<n>:<m>).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <string_view>

namespace ferry::test {

// A killed process leaves its regions behind: removes those of `pid`.
inline void remove_shm_regions_of(pid_t pid) {
  const std::string prefix = std::to_string(pid) + ":";
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* ent = ::readdir(d)) {
      if (std::string_view(ent->d_name).starts_with(prefix))
        ::unlink(("/dev/shm/" + std::string(ent->d_name)).c_str());
    }
    ::closedir(d);
  }
}

// The spinlock at offset 24 of a region, which every sender takes for each
// post and the receiver holds while it copies the writes queued to it.
// taken() is false when the region cannot be read.
class ShmRegionLock {
 public:
  // `name`: the endpoint name, "fi_shm://<pid>:<n>:<m>" (NUL-terminated or not).
  explicit ShmRegionLock(std::string_view name) {
    constexpr std::string_view kScheme = "fi_shm://";
    name = name.substr(0, name.find('\0'));
    if (name.starts_with(kScheme)) name.remove_prefix(kScheme.size());
    const int fd = ::open(("/dev/shm/" + std::string(name)).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    void* p = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p != MAP_FAILED) head_ = static_cast<const int*>(p);
    pthread_spinlock_t l;
    pthread_spin_init(&l, PTHREAD_PROCESS_SHARED);
    std::memcpy(&unlocked_, const_cast<const void*>(static_cast<volatile void*>(&l)), sizeof(int));
    pthread_spin_destroy(&l);
  }
  ~ShmRegionLock() {
    if (head_ != nullptr) ::munmap(const_cast<int*>(head_), 4096);
  }
  ShmRegionLock(const ShmRegionLock&) = delete;
  ShmRegionLock& operator=(const ShmRegionLock&) = delete;

  bool taken() const {
    return head_ != nullptr && __atomic_load_n(head_ + 6, __ATOMIC_ACQUIRE) != unlocked_;
  }

 private:
  const int* head_ = nullptr;
  int unlocked_ = 1;
};

}  // namespace ferry::test
