# layout: the include graph against the declared layer order (no upward
# include, no include cycle) and the file-level call cycles of the layer
# libraries' objects (tools/check_layers.py; it runs after the build).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND)
  add_test(NAME check_layers
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tools/check_layers.py
                   --objects ${CMAKE_BINARY_DIR}
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(check_layers PROPERTIES TIMEOUT 120 LABELS lint)
endif()
