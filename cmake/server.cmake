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

add_library(sluice_server_parse STATIC src/server/json.c src/server/json_scan.c
                                       src/server/head.c
                                       src/server/parse.c
                                       src/server/constrain.c
                                       src/server/prompt.c
                                       src/server/schema.c
                                       src/server/tools.c
                                       src/server/embed.c
                                       src/server/toolcall.c
                                       src/server/reasoning.c
                                       src/server/answer.c
                                       src/server/reasoning_req.c
                                       src/server/origin.c
                                       src/server/proxy.c)
target_include_directories(sluice_server_parse PUBLIC src
                           ${SL_JANSSON_INCLUDE_DIRS})
target_link_libraries(sluice_server_parse PUBLIC sluice_core
                      ${SL_JANSSON_LINK_LIBRARIES})

# the dashboard's page, built in (GET /admin)
set(SL_DASHBOARD_C ${CMAKE_BINARY_DIR}/generated/dashboard_html.c)
add_custom_command(OUTPUT ${SL_DASHBOARD_C}
  COMMAND ${CMAKE_COMMAND}
          -DIN=${CMAKE_SOURCE_DIR}/src/server/dashboard/index.html
          -DOUT=${SL_DASHBOARD_C} -DNAME=sl__srv_dashboard_html
          -P ${CMAKE_SOURCE_DIR}/tools/embed_file.cmake
  DEPENDS ${CMAKE_SOURCE_DIR}/src/server/dashboard/index.html
          ${CMAKE_SOURCE_DIR}/tools/embed_file.cmake
  COMMENT "embedding the dashboard page")
add_library(sluice_server STATIC src/server/http.c src/server/reply.c
                                 src/server/generate.c src/server/job.c
                                 src/server/openai.c
                                 src/server/anthropic.c src/server/admin.c
                                 src/server/sockwatch.c src/server/door.c
                                 src/server/detach.c
                                 src/server/routes.c ${SL_DASHBOARD_C})
target_include_directories(sluice_server PUBLIC ${SL_MHD_INCLUDE_DIRS})
target_link_libraries(sluice_server PUBLIC sluice_server_parse sluice_core
                      ${SL_MHD_LINK_LIBRARIES})
target_sources(sluice PRIVATE ${CMAKE_SOURCE_DIR}/src/cli/cmd_serve.c)
target_compile_definitions(sluice PRIVATE SLUICE_HAVE_SERVER=1)
target_link_libraries(sluice PRIVATE sluice_server)

foreach(t test_server_parse test_server_prompt test_server_json_scan
          test_server_toolcall test_server_reason test_server_origin
          test_server_head test_server_proxy)
  if(TARGET ${t})
    target_link_libraries(${t} PRIVATE sluice_server_parse)
  endif()
endforeach()
# the job without libmicrohttpd: aborts and the shutdown's cut against a
# real engine (its threads run under TSan too)
if(TARGET test_server_job)
  target_link_libraries(test_server_job PRIVATE sluice_server)
  set_tests_properties(test_server_job PROPERTIES LABELS "c;threaded")
endif()
foreach(t fuzz_server_json fuzz_toolcall fuzz_reason fuzz_origin
          fuzz_proxy)
  if(TARGET ${t})
    target_link_libraries(${t} PRIVATE sluice_server_parse)
  endif()
endforeach()

find_package(Python3 COMPONENTS Interpreter)
# One pytest file against the real `sluice serve` binary, as a ctest entry
# (all skipped: no model or SDK, reported as skipped).
# (extra arguments go to pytest, e.g. -k to run part of the file)
function(sl_server_pytest name file timeout)
  add_test(NAME ${name}
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -s
                   ${CMAKE_SOURCE_DIR}/tests/py/${file} ${ARGN})
  set_tests_properties(${name} PROPERTIES
    TIMEOUT ${timeout} LABELS py
    SKIP_REGULAR_EXPRESSION "(^|\n)[0-9]+ skipped in"
    ENVIRONMENT "SLUICE_BIN=$<TARGET_FILE:sluice>;SLUICE_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endfunction()
if(Python3_FOUND AND TARGET sluice AND NOT SLUICE_FUZZ)
  sl_server_pytest(test_server test_server.py 900)
  # what agents send beyond plain chat (issue 12)
  sl_server_pytest(test_api_agent test_api_agent.py 900)
  # tool calling through the SDKs, jinja2 and an agent framework
  sl_server_pytest(test_api_tools test_api_tools.py 900)
  # reasoning output (issue 45): <think> split out on both APIs, streamed
  # and not, Anthropic's thinking budget, through the SDKs
  sl_server_pytest(test_api_reasoning test_api_reasoning.py 900)
  # ... on real templates (DeepSeek-R1's) and forced real token streams
  sl_server_pytest(test_api_reasoning_real test_api_reasoning_real.py 600)
  # LangChain's ChatOpenAI and ChatAnthropic: answers, streams, tool calls,
  # a thinking model (issue 45)
  sl_server_pytest(test_api_langchain test_api_langchain.py 600)
  # /v1/embeddings against llama.cpp
  sl_server_pytest(test_api_embed test_api_embed.py 900)
  # speculative decoding (issue 47): drafts change no answer, through the
  # SDKs, alone and eight at once
  sl_server_pytest(test_api_speculative test_api_speculative.py 600)
  # the soak test, 60 s (tests/soak/soak.py; 10 minutes by hand): errors
  # of well-behaved clients, fd and thread leaks (RSS is recorded; its
  # flatness is judged on the long run, after warm-up)
  add_test(NAME test_soak_short
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/soak/soak.py
                   --seconds 60 --clients 32 --idle 32 --trickle 8
                   --rss-tolerance 10)
  set_tests_properties(test_soak_short PROPERTIES
    TIMEOUT 600 LABELS py SKIP_RETURN_CODE 77
    ENVIRONMENT "SLUICE_BIN=$<TARGET_FILE:sluice>;SLUICE_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
  # shutdown and the memory guard at their limits (issue 10, items 2, 3)
  sl_server_pytest(test_server_guard test_server_guard.py 900)
  # bodies built to exhaust memory: refused, and RSS back within 10%
  sl_server_pytest(test_server_limits test_server_limits.py 600)
  # HTTP framing over raw sockets: smuggling headers, garbage request lines
  sl_server_pytest(test_http test_http.py 300)
  # the front door: slowloris, limits, heads refused in JSON (needs
  # 127.0.0.2 and a few thousand fds; raises its own soft limit)
  sl_server_pytest(test_http_door test_http_door.py 600
                   -k "not half_close and not hangup")
  # clients that half-close (answered) and clients that hang up (aborted):
  # their own entry, so that mutants 30 and 110-113 run only this part
  sl_server_pytest(test_http_half_close test_http_door.py 300
                   -k "half_close or hangup")
  # behind a proxy (issue 43 stage 4): --trusted-proxy, PROXY v1/v2 and
  # X-Forwarded-For name the client the per-address limit counts
  sl_server_pytest(test_http_proxy test_http_proxy.py 300)
  # the SSD tier end to end: a restart restores a 4k-token prefix with the
  # cold run's text; bit flips recomputed or skipped; a full tmpfs (where
  # the test may mount one) turns the tier off; a missing directory
  sl_server_pytest(test_kv_ssd test_kv_ssd.py 1500)
  # sluice bench prefix end to end: counts only, no timing
  sl_server_pytest(test_bench_prefix test_bench_prefix.py 900)
  # the engine pool (issue 13): load on use, LRU, pin, TTL, one shared load
  sl_server_pytest(test_pool_py test_pool.py 900 -k "not load_holds")
  # a load parks its requests, not an HTTP thread (its own entry, so that
  # mutant 61 runs only this part)
  sl_server_pytest(test_pool_load_park test_pool.py 300 -k load_holds)
  # the dashboard in headless Chromium (skips where Chromium cannot start)
  sl_server_pytest(test_dashboard test_dashboard.py 600)
  # whom the server answers (issue 43): Host, Origin, JSON bodies, through
  # sockets and headless Chromium (a page of another origin, a rebound name)
  sl_server_pytest(test_http_origin test_http_origin.py 600)
endif()
if(TARGET fuzz_http)
  target_link_libraries(fuzz_http PRIVATE sluice_server)
endif()
