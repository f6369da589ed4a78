// The tools that time two engines run them in two processes joined by an
// AF_UNIX stream socketpair (addresses, go/stop, results). Each end is owned
// (core::UniqueFd) so that no path out of a tool, an exception included, leaves one
// open; an end left open in the parent would keep the child from ever seeing
// end-of-file on its side.
#pragma once

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>

#include "core/unique_fd.h"

namespace ferry::tools {

struct SocketPair {
  core::UniqueFd a, b;
  // False when the pair could not be made (errno says why).
  bool make() {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return false;
    a = core::UniqueFd(sv[0]);
    b = core::UniqueFd(sv[1]);
    return true;
  }
};

// Runs `child(fd)` in a forked process and `parent(fd)` here, each with its own
// end of a fresh socketpair. Returns the parent's exit code; where the parent
// succeeded but the child did not, `child_failed`. An exception out of either
// side is printed and fails it; the parent's also ends the child.
template <class Child, class Parent>
int run_forked_pair(Child&& child, Parent&& parent, int child_failed) {
  SocketPair sp;
  if (!sp.make()) {
    std::perror("socketpair");
    return 1;
  }
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("fork");
    return 1;
  }
  if (pid == 0) {
    sp.a.reset();
    int rc = 1;
    try {
      rc = child(sp.b.get());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "server: %s\n", e.what());
    }
    std::fflush(nullptr);
    ::_exit(rc);  // no destructors of the parent's objects in the child
  }
  sp.b.reset();
  int rc = 1;
  try {
    rc = parent(sp.a.get());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "client: %s\n", e.what());
    ::kill(pid, SIGTERM);
  }
  sp.a.reset();  // a child still reading sees end-of-file
  int st = 0;
  ::waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = rc ? rc : child_failed;
  return rc;
}

}  // namespace ferry::tools
