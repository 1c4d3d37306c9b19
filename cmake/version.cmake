# Writes OUT (a C file) with the project version VERSION and `git describe` of the source tree
# SRC, replacing OUT only when they changed (so a build after a commit relinks, and one
# without does not). Run at every build: cmake -DSRC=... -DVERSION=... -DOUT=... -P version.cmake
set(describe "")
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SRC} describe --always --dirty --tags
                  OUTPUT_VARIABLE describe ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    set(describe "")
  endif()
endif()
file(WRITE ${OUT}.tmp
     "/* made by cmake/version.cmake */\n"
     "const char *const ballast_version = \"${VERSION}\";\n"
     "const char *const ballast_git_describe = \"${describe}\";\n")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different ${OUT}.tmp ${OUT})
file(REMOVE ${OUT}.tmp)
