# MoE dispatch/combine (docs/MOE.md). Included from tests/CMakeLists.txt.

# No GPU: the layout against a model, the proxy against a host-memory GPU
# stand-in over real engines.
add_executable(moe_unit_tests moe/routing_test.cpp moe/proxy_test.cpp)
target_link_libraries(moe_unit_tests PRIVATE ferry::moe ferry_test_support GTest::gtest_main)
gtest_discover_tests(moe_unit_tests DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 120)

if(FERRY_HAS_CUDA)
  # The C++ API on one GPU and one rank; SKIPPED without a GPU.
  add_executable(moe_gpu_tests moe/moe_gpu_test.cpp)
  target_link_libraries(moe_gpu_tests PRIVATE ferry::moe ferry_test_support GTest::gtest_main
    CUDA::cudart_static)
  gtest_discover_tests(moe_gpu_tests DISCOVERY_TIMEOUT 60 PROPERTIES LABELS cuda TIMEOUT 120)
endif()
