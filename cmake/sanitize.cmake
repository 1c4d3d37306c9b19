# BALLAST_SANITIZE: a comma-separated list of sanitizers for the whole build, e.g.
#   cmake -S . -B build-asan -DBALLAST_SANITIZE=address,undefined
# Undefined behaviour stops the program (-fno-sanitize-recover) so that a test fails on it
# instead of printing and passing. tests/CMakeLists.txt points LeakSanitizer at
# tests/sanitizers/lsan.supp (Open MPI's and OpenBLAS's own allocations that live until exit).
set(BALLAST_SANITIZE "" CACHE STRING "Sanitizers to build with (e.g. address,undefined); empty: none")
if(BALLAST_SANITIZE)
  set(sanitize_flags -fsanitize=${BALLAST_SANITIZE} -fno-omit-frame-pointer)
  if(BALLAST_SANITIZE MATCHES "undefined")
    list(APPEND sanitize_flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C>:${sanitize_flags}>")
  add_link_options(-fsanitize=${BALLAST_SANITIZE})
  message(STATUS "Ballast sanitizers: ${BALLAST_SANITIZE}")
endif()
