# repack: a CPU run with the matrices repacked at load against SLUICE_REPACK=0
# on llama.cpp's requantized copies of the default model (Q4_0, Q8_0, Q5_0,
# IQ4_NL); skipped without llama_cpp, numpy or the model. sl_model_tool comes
# from cmake/model.cmake.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND TARGET sl_model_tool)
  add_test(NAME test_repack_model_py
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -s
                   ${CMAKE_SOURCE_DIR}/tests/py/test_repack.py)
  set_tests_properties(test_repack_model_py PROPERTIES
    TIMEOUT 900 LABELS py SKIP_REGULAR_EXPRESSION "(^|\n)[0-9]+ skipped in"
    ENVIRONMENT "SLUICE_MODEL_TOOL=$<TARGET_FILE:sl_model_tool>;SLUICE_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endif()
