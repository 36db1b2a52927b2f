# server: the HTTP layer (libmicrohttpd + jansson) behind `sluice serve`.
#   sluice_server_parse  request parsing, JSON and UTF-8 helpers (no engine,
#                        no HTTP): linked by the parser test and fuzz harness
#   sluice_server        HTTP, OpenAI / Anthropic / admin APIs, SSE
# plus the pytest suite that drives the real binary with the openai and
# anthropic SDKs (skipped without the model or the SDKs).
pkg_check_modules(SL_MHD libmicrohttpd)
pkg_check_modules(SL_JANSSON jansson)
if(NOT SL_MHD_FOUND OR NOT SL_JANSSON_FOUND)
  message(STATUS "sluice: libmicrohttpd or jansson missing; no `sluice serve`")
  return()
endif()

add_library(sluice_server_parse STATIC src/server/json.c src/server/parse.c
                                       src/server/prompt.c)
target_include_directories(sluice_server_parse PUBLIC src
                           ${SL_JANSSON_INCLUDE_DIRS})
target_link_libraries(sluice_server_parse PUBLIC sluice_core
                      ${SL_JANSSON_LINK_LIBRARIES})

add_library(sluice_server STATIC src/server/http.c src/server/openai.c
                                 src/server/anthropic.c src/server/admin.c
                                 src/server/sockwatch.c)
target_include_directories(sluice_server PUBLIC ${SL_MHD_INCLUDE_DIRS})
target_link_libraries(sluice_server PUBLIC sluice_server_parse sluice_core
                      ${SL_MHD_LINK_LIBRARIES})
target_sources(sluice PRIVATE ${CMAKE_SOURCE_DIR}/src/cli/cmd_serve.c)
target_compile_definitions(sluice PRIVATE SLUICE_HAVE_SERVER=1)
target_link_libraries(sluice PRIVATE sluice_server)

if(TARGET test_server_parse)
  target_link_libraries(test_server_parse PRIVATE sluice_server_parse)
endif()
if(TARGET fuzz_server_json)
  target_link_libraries(fuzz_server_json PRIVATE sluice_server_parse)
endif()

find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND TARGET sluice AND NOT SLUICE_FUZZ)
  add_test(NAME test_server
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -s
                   ${CMAKE_SOURCE_DIR}/tests/py/test_server.py)
  set_tests_properties(test_server PROPERTIES
    TIMEOUT 900 LABELS py SKIP_REGULAR_EXPRESSION "(^|\n)[0-9]+ skipped in"
    ENVIRONMENT "SLUICE_BIN=$<TARGET_FILE:sluice>;SLUICE_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
  # HTTP framing over raw sockets: smuggling headers, garbage request lines
  add_test(NAME test_http
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -s
                   ${CMAKE_SOURCE_DIR}/tests/py/test_http.py)
  set_tests_properties(test_http PROPERTIES
    TIMEOUT 300 LABELS py SKIP_REGULAR_EXPRESSION "(^|\n)[0-9]+ skipped in"
    ENVIRONMENT "SLUICE_BIN=$<TARGET_FILE:sluice>;SLUICE_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endif()
