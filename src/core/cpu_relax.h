// The pause between polls of a spinning thread: it tells the core that this is
// a spin, which frees its pipeline for the sibling hyperthread and shortens the
// exit from the loop once the awaited store lands.
#pragma once

namespace ferry::core {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace ferry::core
