# model_moe: mixture-of-experts files (qwen3moe, Mixtral-class llama) with
# random weights, written by tools/make_random_model.py and quantized by
# llama.cpp, against llama.cpp and the float64 reference; a sequence alone
# and in a batch of 16; metadata errors. Skipped without llama_cpp, gguf or
# the default model (its tokenizer). sl_model_tool comes from
# cmake/model.cmake (included first).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND TARGET sl_model_tool)
  add_test(NAME test_model_moe_vs_llamacpp
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -s
                   ${CMAKE_SOURCE_DIR}/tests/py/test_model_moe_vs_llamacpp.py)
  # about 2 min on 2 shared cores at two ISA levels
  set_tests_properties(test_model_moe_vs_llamacpp PROPERTIES
    TIMEOUT 1200 LABELS py SKIP_REGULAR_EXPRESSION "(^|\n)[0-9]+ skipped in"
    ENVIRONMENT "SLUICE_MODEL_TOOL=$<TARGET_FILE:sl_model_tool>;SLUICE_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endif()
