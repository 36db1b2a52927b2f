# kern/cuda extras: the CUDA dequantization units (src/kern/cuda/dequant.cuh)
# built for the host and compared with the CPU dequantizers. Needs a C++
# compiler, neither nvcc nor a GPU, so it runs wherever the tests run.
include(CheckLanguage)
check_language(CXX)
if(CMAKE_CXX_COMPILER)
  enable_language(CXX)
  add_executable(test_kern_cuda_dequant_host
                 tests/test_kern_cuda_dequant_host.cpp)
  target_include_directories(test_kern_cuda_dequant_host PRIVATE src tests)
  target_compile_features(test_kern_cuda_dequant_host PRIVATE cxx_std_17)
  # one rounding per __fmul_rn / __fadd_rn, as on the device
  target_compile_options(test_kern_cuda_dequant_host PRIVATE
    -Wall -Wextra -Werror -Wno-unused-parameter -Wno-unknown-pragmas
    -ffp-contract=off)
  target_link_libraries(test_kern_cuda_dequant_host PRIVATE sluice_core)
  add_test(NAME test_kern_cuda_dequant_host
           COMMAND test_kern_cuda_dequant_host)
  set_tests_properties(test_kern_cuda_dequant_host PROPERTIES
    TIMEOUT 600 LABELS c
    ENVIRONMENT "SLUICE_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endif()
