# Topology unit tests; included from tests/CMakeLists.txt. Fixture sysfs
# trees are generated at run time (topo_fixtures.cpp), nothing is read from
# the source tree.
if(NOT TARGET GTest::gtest_main)
  find_package(GTest REQUIRED)
endif()
include(GoogleTest)

add_executable(topo_test
  ${CMAKE_CURRENT_LIST_DIR}/topo_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cuda_visible_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/placement_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/topo_fixtures.cpp)
target_compile_options(topo_test PRIVATE ${FERRY_WARNINGS})
target_include_directories(topo_test PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}            # topo_fixtures.h
  ${CMAKE_CURRENT_LIST_DIR}/../../src  # topo/topology.h (internal header)
  ${CMAKE_CURRENT_LIST_DIR}/..)        # support/scoped_env.h
target_link_libraries(topo_test PRIVATE ferry::ferry GTest::gtest_main)
gtest_discover_tests(topo_test DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit)
