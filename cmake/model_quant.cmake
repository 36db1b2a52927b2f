# model_quant: the forward pass against llama.cpp on copies of the default
# model that llama.cpp quantizes to Q5_0, Q5_1 and IQ4_NL (from the F32 copy
# of model_f32, cached next to it); skipped without llama_cpp, gguf or the
# model. sl_model_tool comes from cmake/model.cmake (included first).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND TARGET sl_model_tool)
  add_test(NAME test_model_quant_vs_llamacpp
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -s
                   ${CMAKE_SOURCE_DIR}/tests/py/test_model_quant_vs_llamacpp.py)
  # three models, each ~3 min on 2 shared cores (plus ~15 s per first copy)
  set_tests_properties(test_model_quant_vs_llamacpp PROPERTIES
    TIMEOUT 2400 LABELS py SKIP_REGULAR_EXPRESSION "(^|\n)[0-9]+ skipped in"
    ENVIRONMENT "SLUICE_MODEL_TOOL=$<TARGET_FILE:sl_model_tool>;SLUICE_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endif()
