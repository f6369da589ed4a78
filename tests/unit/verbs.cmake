# verbs domain unit tests: the protocol logic (handshake, WR chains,
# completion accounting, GID choice, completion-channel bookkeeping, provider
# "auto") runs without an RDMA device.
# Included from tests/CMakeLists.txt.
if(NOT TARGET GTest::gtest_main)
  find_package(GTest REQUIRED)
endif()
include(GoogleTest)

add_executable(verbs_tests
  ${CMAKE_CURRENT_LIST_DIR}/verbs_handshake_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/verbs_chain_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/verbs_completion_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/verbs_devinfo_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/verbs_domain_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/verbs_notify_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/verbs_auto_provider_test.cpp)
target_compile_options(verbs_tests PRIVATE ${FERRY_WARNINGS})
target_include_directories(verbs_tests PRIVATE ${PROJECT_SOURCE_DIR}/src
  ${CMAKE_CURRENT_LIST_DIR}/..)  # support/scoped_env.h
# The hardware test calls ibv_get_device_list itself.
target_link_libraries(verbs_tests PRIVATE ferry::ferry GTest::gtest_main fmt::fmt spdlog::spdlog ${IBVERBS})
gtest_discover_tests(verbs_tests DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit)
