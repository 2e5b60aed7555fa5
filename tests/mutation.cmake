# The off-by-one mutant (docs/METHOD.md, "a mask is a comparison of two index grids"):
# data/visibility.c with its causal comparison `k <= q` turned into `k < q`, which drops
# the diagonal. test_mask_layouts built against it must fail, on the random samples and
# on the shipped data: the proof that the oracle tests catch this mistake.
file(READ ${CMAKE_SOURCE_DIR}/data/visibility.c ONEPASS_VISIBILITY)
string(REPLACE "k <= q" "k < q" ONEPASS_VISIBILITY_MUTANT "${ONEPASS_VISIBILITY}")
if(ONEPASS_VISIBILITY_MUTANT STREQUAL ONEPASS_VISIBILITY)
  message(FATAL_ERROR "tests/mutation.cmake: data/visibility.c has no `k <= q` to mutate; update the mutant")
endif()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/data/visibility.c)
file(WRITE ${CMAKE_BINARY_DIR}/mutants/visibility_off_by_one.c "${ONEPASS_VISIBILITY_MUTANT}")
# The mutant's layout_visibility_from_tags is linked before the data library, whose
# visibility.o is then not pulled in.
add_executable(test_mask_layouts_off_by_one tests/test_mask_layouts.c
               ${CMAKE_BINARY_DIR}/mutants/visibility_off_by_one.c)
target_link_libraries(test_mask_layouts_off_by_one PRIVATE ${ONEPASS_LIBS})
set_target_properties(test_mask_layouts_off_by_one PROPERTIES LINKER_LANGUAGE CXX)
add_test(NAME mutant_off_by_one COMMAND test_mask_layouts_off_by_one
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
# Passes only when the shipped-data check fails for every layout; a crash fails it.
set_tests_properties(mutant_off_by_one PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2"
  PASS_REGULAR_EXPRESSION "train.jsonl, npass: [1-9][0-9]* .*train.jsonl, mask_only: [1-9][0-9]* .*train.jsonl, duplicate: [1-9][0-9]* .*shared_prefix.jsonl, npass: [1-9][0-9]* .*shared_prefix.jsonl, shared_prefix: [1-9][0-9]* .* [1-9][0-9]* failed"
  FAIL_REGULAR_EXPRESSION "Sanitizer|runtime error")
