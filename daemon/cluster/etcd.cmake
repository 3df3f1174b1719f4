# etcd v3 membership: a small client over etcd's JSON gateway and cluster membership on top of it.
add_library(kvtier_etcd STATIC etcd_client.cc etcd_membership.cc)
target_include_directories(kvtier_etcd PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(kvtier_etcd PUBLIC kvtier_daemon CapnProto::capnp-json CapnProto::kj-http)

# Its tests start a real etcd (/usr/bin/etcd; they skip without one). This directory is processed
# before the top level's find_package(GTest) and include(GoogleTest), so it does both itself.
if(KVTIER_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
  enable_testing()
  add_executable(kvtier_etcd_test ${CMAKE_CURRENT_SOURCE_DIR}/etcd_client_test.cc)
  target_link_libraries(kvtier_etcd_test PRIVATE kvtier_etcd GTest::gtest_main)
  gtest_discover_tests(kvtier_etcd_test DISCOVERY_TIMEOUT 60 PROPERTIES LABELS cluster TIMEOUT 120)
endif()
