# model_lowbit: the forward pass against llama.cpp on Q2_K, Q3_K_M, IQ4_XS
# (and pure Q2_K) quantizations of the default model, made by llama.cpp's
# quantizer from the F32 copy of model_f32 and cached outside the repository
# (SLUICE_CACHE_DIR, else ~/.cache/sluice); a file holding a type sluice has
# no kernel for is skipped with the loader's message. sl_model_tool comes
# from cmake/model.cmake (included first: the parts go in name order).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND TARGET sl_model_tool)
  add_test(NAME test_model_lowbit_vs_llamacpp
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -s
                   ${CMAKE_SOURCE_DIR}/tests/py/test_model_lowbit_vs_llamacpp.py)
  # ~4 min a file on 2 shared cores (the first run also quantizes, ~40 s a file)
  set_tests_properties(test_model_lowbit_vs_llamacpp PROPERTIES
    TIMEOUT 2400 LABELS py SKIP_REGULAR_EXPRESSION "(^|\n)[0-9]+ skipped in"
    ENVIRONMENT "SLUICE_MODEL_TOOL=$<TARGET_FILE:sl_model_tool>;SLUICE_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endif()
