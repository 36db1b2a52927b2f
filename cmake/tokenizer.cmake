# Tokenizer (the sluice_tokenizer layer of CMakeLists.txt, with PCRE2 for the
# pre-tokenizer regexes): the sl_tokenize_tool helper (JSON lines, jansson) and
# the comparison against llama.cpp (pytest, skipped without llama_cpp or model).

pkg_check_modules(JANSSON jansson)
if(JANSSON_FOUND)
  add_executable(sl_tokenize_tool tools/tokenize_tool.c)
  target_include_directories(sl_tokenize_tool PRIVATE src
                             ${JANSSON_INCLUDE_DIRS})
  target_link_libraries(sl_tokenize_tool PRIVATE sluice_core
                        ${JANSSON_LINK_LIBRARIES})

  find_package(Python3 COMPONENTS Interpreter)
  if(Python3_FOUND)
    add_test(NAME test_tokenizer_vs_llamacpp
             COMMAND ${Python3_EXECUTABLE} -m pytest -q -s
                     ${CMAKE_SOURCE_DIR}/tests/py/test_tokenizer_vs_llamacpp.py)
    # all tests skipped (no llama_cpp, no model): pytest's summary line is
    # "N skipped in ..." alone
    set_tests_properties(test_tokenizer_vs_llamacpp PROPERTIES
      TIMEOUT 600 SKIP_REGULAR_EXPRESSION "(^|\n)[0-9]+ skipped in"
      ENVIRONMENT "SLUICE_TOKENIZE_TOOL=$<TARGET_FILE:sl_tokenize_tool>;SLUICE_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
  endif()
else()
  message(STATUS "sluice: libjansson not found, sl_tokenize_tool not built")
endif()
