# rt/cuda: extra CMake for the CUDA backend (src/rt/cuda, src/kern/cuda).
if(TARGET sluice_cuda)
  # The backend's objects call back into sluice_core (stream.c, memsync.c,
  # util), and sluice_core calls into them: declare the cycle so that CMake
  # repeats both static libraries on the link line.
  target_link_libraries(sluice_cuda PRIVATE sluice_core)

  target_compile_options(sluice_cuda PRIVATE
                         "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror>")
endif()

# The CUDA tests again with runtime debug mode (I8) on; skips like the plain
# run where there is no GPU.
if(TARGET test_rt_cuda)
  add_test(NAME test_rt_cuda_debug COMMAND test_rt_cuda --debug)
  set_tests_properties(test_rt_cuda_debug PROPERTIES SKIP_RETURN_CODE 77
                       TIMEOUT 600)
endif()
