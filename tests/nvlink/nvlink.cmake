# NVLink domain and GPU registration in the libfabric domain (docs/NVLINK.md).
# Included from tests/CMakeLists.txt.

# No GPU needed: address codec, shared-memory mailbox, region table.
add_executable(nvlink_unit_tests nvlink/nvlink_unit_test.cpp)
target_include_directories(nvlink_unit_tests PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(nvlink_unit_tests PRIVATE ferry_test_support GTest::gtest_main fmt::fmt)
gtest_discover_tests(nvlink_unit_tests DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 120)

if(FERRY_HAS_CUDA)
  # Two GPU processes, nvlink and shm+FI_HMEM; SKIPPED without a GPU.
  add_executable(nvlink_tests nvlink/nvlink_test.cu)
  target_include_directories(nvlink_tests PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(nvlink_tests PRIVATE ferry_test_support GTest::gtest_main CUDA::cudart_static)
  gtest_discover_tests(nvlink_tests DISCOVERY_TIMEOUT 60 PROPERTIES LABELS cuda TIMEOUT 600)

  # Measurements (docs/PERFORMANCE.md, "NVLink domain"); not a CTest test.
  add_executable(ferry-nvlink-bench nvlink/nvlink_bench.cu)
  target_include_directories(ferry-nvlink-bench PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(ferry-nvlink-bench PRIVATE ferry_test_support CUDA::cudart_static)
  # Copy-kernel designs alone, GPU 0 -> GPU 1 (docs/PERFORMANCE.md); not a CTest test.
  add_executable(ferry-nvlink-probe nvlink/nvlink_probe.cu
                                   ${PROJECT_SOURCE_DIR}/src/nvlink/nvlink_kernels.cu)
  target_include_directories(ferry-nvlink-probe PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(ferry-nvlink-probe PRIVATE CUDA::cudart_static)
  set_target_properties(nvlink_tests ferry-nvlink-bench ferry-nvlink-probe PROPERTIES CUDA_STANDARD 20)
endif()
