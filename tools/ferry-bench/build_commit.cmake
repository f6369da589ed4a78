# Writes OUT (build_commit.h) with the commit SRC is checked out at, "-dirty"
# when tracked files differ from it; rewritten only when that changes, so an
# unchanged tree rebuilds nothing.
execute_process(COMMAND git -C "${SRC}" rev-parse --short HEAD
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
execute_process(COMMAND git -C "${SRC}" status --porcelain --untracked-files=no
                OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(commit STREQUAL "")
  set(commit "unknown")
elseif(NOT dirty STREQUAL "")
  string(APPEND commit "-dirty")
endif()
set(text "#pragma once\n#define FERRY_BENCH_BUILD_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
