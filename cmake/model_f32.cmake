# model_f32: the forward pass against llama.cpp on an all-F32 copy of the
# default model (built once by the test with the gguf package, cached next to
# the model), where no activation re-quantization amplifies last-bit
# differences; skipped without llama_cpp, gguf or the model. sl_model_tool
# comes from cmake/model.cmake (included first: the parts go in name order).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND TARGET sl_model_tool)
  add_test(NAME test_model_f32_vs_llamacpp
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -s
                   ${CMAKE_SOURCE_DIR}/tests/py/test_model_f32_vs_llamacpp.py)
  # ~3 min on 2 shared cores (the first run also writes the 540 MB copy)
  set_tests_properties(test_model_f32_vs_llamacpp PROPERTIES
    TIMEOUT 1200 LABELS py SKIP_REGULAR_EXPRESSION "(^|\n)[0-9]+ skipped in"
    ENVIRONMENT "SLUICE_MODEL_TOOL=$<TARGET_FILE:sl_model_tool>;SLUICE_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endif()
