# kern/cpu extras: the dequant tool for the Python cross-check against the
# gguf package, and the matvec/matmul bandwidth benchmark.
add_executable(sl_dequant_tool tools/sl_dequant_tool.c)
target_link_libraries(sl_dequant_tool PRIVATE sluice_core)

add_executable(bench_kern tools/bench_kern.c)
target_include_directories(bench_kern PRIVATE src)
target_link_libraries(bench_kern PRIVATE sluice_core)

find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME py_dequant_vs_gguf
           COMMAND ${Python3_EXECUTABLE} -m pytest -q
                   ${CMAKE_SOURCE_DIR}/tests/py/test_dequant_vs_gguf.py)
  set_tests_properties(py_dequant_vs_gguf PROPERTIES
    TIMEOUT 600
    # sl_model_tool (cmake/model.cmake) says which ISA levels this CPU runs
    ENVIRONMENT "SLUICE_SOURCE_DIR=${CMAKE_SOURCE_DIR};SL_DEQUANT_TOOL=$<TARGET_FILE:sl_dequant_tool>;SLUICE_MODEL_TOOL=$<TARGET_FILE:sl_model_tool>")
endif()

# Kernel tests once per ISA level (SLUICE_ISA=scalar|avx2|avx512|avxvnni|avx512vnni): each entry
# exits 77 (skipped) where this CPU cannot run its level. Labels "c;threaded"
# so the sanitizer stages of scripts/test.sh (-L c, -L threaded) pick them.
foreach(name ${SL_TESTS_PER_ISA})
  foreach(isa scalar avx2 avx512 avxvnni avx512vnni)
    add_test(NAME ${name}_${isa} COMMAND ${name})
    set_tests_properties(${name}_${isa} PROPERTIES
      SKIP_RETURN_CODE 77 TIMEOUT 1800 LABELS "c;threaded"
      ENVIRONMENT "SLUICE_SOURCE_DIR=${CMAKE_SOURCE_DIR};SLUICE_ISA=${isa}")
  endforeach()
endforeach()
