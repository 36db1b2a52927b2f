# kv: the paged KV block pool (src/kv/) in sluice_core, hashed with xxHash
# (XXH3); test_kv reads the pool's statistics from another thread, so the
# TSan configuration runs it ("threaded").
file(GLOB SL_KV_SRC CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/kv/*.c)
target_sources(sluice_core PRIVATE ${SL_KV_SRC})
pkg_check_modules(XXHASH REQUIRED libxxhash)
target_include_directories(sluice_core PRIVATE ${XXHASH_INCLUDE_DIRS})
target_link_libraries(sluice_core PUBLIC ${XXHASH_LINK_LIBRARIES})
if(TEST test_kv)
  set_tests_properties(test_kv PROPERTIES LABELS "c;threaded")
endif()
