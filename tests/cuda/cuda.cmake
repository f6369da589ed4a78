# GPU signalling (docs/GPU.md): UVM watchers and GPU-visible immediate counters.
# Included from tests/CMakeLists.txt.

# Without CUDA or a GPU: the slot allocator, the watcher thread over plain host
# memory, the ImmTable's GPU-flag entries, the API in a host-only build.
add_executable(gpu_signal_unit_tests cuda/slot_allocator_test.cpp cuda/watcher_host_test.cpp)
target_include_directories(gpu_signal_unit_tests PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(gpu_signal_unit_tests PRIVATE ferry_test_support GTest::gtest_main
  spdlog::spdlog fmt::fmt)
gtest_discover_tests(gpu_signal_unit_tests DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 120)

if(FERRY_HAS_CUDA)
  # Kernels against the engine; each test reports SKIPPED where no GPU answers.
  add_executable(cuda_tests cuda/gpu_signal_test.cu cuda/device_order_test.cpp)
  target_include_directories(cuda_tests PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(cuda_tests PRIVATE ferry_test_support GTest::gtest_main CUDA::cudart_static)
  gtest_discover_tests(cuda_tests DISCOVERY_TIMEOUT 60 PROPERTIES LABELS cuda TIMEOUT 120)

  # Latency and CPU measurements (docs/PERFORMANCE.md); not a CTest test.
  add_executable(ferry-gpu-latency cuda/gpu_latency.cu)
  target_include_directories(ferry-gpu-latency PRIVATE ${PROJECT_SOURCE_DIR}/src ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(ferry-gpu-latency PRIVATE ferry::ferry CUDA::cudart_static spdlog::spdlog
    fmt::fmt)
  set_target_properties(cuda_tests ferry-gpu-latency PROPERTIES CUDA_STANDARD 20)
endif()
