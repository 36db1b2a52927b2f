# model: the forward pass against llama.cpp (logits, greedy text), through the
# sl_model_tool helper; skipped without llama_cpp or the model.
add_executable(sl_model_tool tools/model_tool.c)
target_include_directories(sl_model_tool PRIVATE src)
target_link_libraries(sl_model_tool PRIVATE sluice_core)
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND)
  add_test(NAME test_model_vs_llamacpp
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -s
                   ${CMAKE_SOURCE_DIR}/tests/py/test_model_vs_llamacpp.py)
  set_tests_properties(test_model_vs_llamacpp PROPERTIES
    TIMEOUT 1200 SKIP_REGULAR_EXPRESSION "(^|\n)[0-9]+ skipped in"
    ENVIRONMENT "SLUICE_MODEL_TOOL=$<TARGET_FILE:sl_model_tool>;SLUICE_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endif()

if(Python3_FOUND)
  add_test(NAME test_model_bytes
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -s
                   ${CMAKE_SOURCE_DIR}/tests/py/test_model_bytes.py)
  set_tests_properties(test_model_bytes PROPERTIES
    TIMEOUT 300 SKIP_REGULAR_EXPRESSION "(^|\n)[0-9]+ skipped in"
    ENVIRONMENT "SLUICE_MODEL_TOOL=$<TARGET_FILE:sl_model_tool>;SLUICE_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endif()

# The engine's threads run under TSan too (the kernels' per-ISA entries get the
# same labels in cmake/kern_cpu.cmake).
foreach(t test_engine test_engine_guard test_engine_store test_engine_share
          test_engine_embed test_pool)
  if(TEST ${t})
    # the engine test runs the real model: minutes under TSan
    set_tests_properties(${t} PROPERTIES LABELS "c;threaded" TIMEOUT 1800)
  endif()
endforeach()
