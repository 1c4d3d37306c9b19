# The libFuzzer build (tests/fuzz/README.md): the main build configures this source tree
# again in <build>/fuzz with clang and BALLAST_FUZZ_BUILD=ON, which instruments every C file
# for libFuzzer's coverage, AddressSanitizer and UndefinedBehaviorSanitizer, and builds only
# the fuzz targets (tests/fuzz/CMakeLists.txt).
option(BALLAST_FUZZ_BUILD "Internal: this is the libFuzzer build that tests/fuzz configures" OFF)
if(BALLAST_FUZZ_BUILD)
  add_compile_options("$<$<COMPILE_LANGUAGE:C>:-fsanitize=fuzzer-no-link,address,undefined;-fno-sanitize-recover=undefined;-fno-omit-frame-pointer;-Wno-pass-failed>")
  add_link_options(-fsanitize=address,undefined)
endif()
