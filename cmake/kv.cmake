# kv: the paged KV block pool (src/kv/, the sluice_kv layer of
# CMakeLists.txt); test_kv reads the pool's statistics from another thread, so
# the TSan configuration runs it ("threaded").
if(TEST test_kv)
  set_tests_properties(test_kv PROPERTIES LABELS "c;threaded")
endif()
# test_kv_tier_ram races gets and lent blocks against evicting puts.
if(TEST test_kv_tier_ram)
  set_tests_properties(test_kv_tier_ram PROPERTIES LABELS "c;threaded")
endif()
