# sluice — the chat-template engine: the sl_render_template helper (jansson,
# which sluice_core itself does not use) and the pytest that compares sluice's
# renderings with Python jinja2's, byte for byte.
pkg_check_modules(JANSSON jansson)
if(JANSSON_FOUND)
  add_executable(sl_render_template tools/render_template.c)
  target_include_directories(sl_render_template PRIVATE src
                             ${JANSSON_INCLUDE_DIRS})
  target_link_libraries(sl_render_template PRIVATE sluice_core
                        ${JANSSON_LINK_LIBRARIES})
  add_test(NAME test_chat_templates_py
           COMMAND python3 -m pytest -q tests/py/test_chat_templates.py
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_chat_templates_py PROPERTIES TIMEOUT 600
    ENVIRONMENT "SLUICE_RENDER_TEMPLATE=$<TARGET_FILE:sl_render_template>;SLUICE_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
else()
  message(STATUS "sluice: jansson not found; sl_render_template and the "
                 "chat-template pytest are not built")
endif()
