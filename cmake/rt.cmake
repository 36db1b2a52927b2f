# rt: the CPU stress and race tests again, under the runtime debug checker
# (I8); and the label that the TSan configuration runs.
add_test(NAME test_rt_debug COMMAND test_rt --debug)
set_tests_properties(test_rt_debug PROPERTIES TIMEOUT 600 LABELS "c;threaded")
foreach(t test_rt test_rt_violations test_seed test_memsync_est)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES LABELS "c;threaded")
  endif()
endforeach()
