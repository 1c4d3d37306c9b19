#!/bin/sh
# sanitizer_last.sh TESTS_CMAKELISTS: every test is registered before the sanitizer block,
# which applies LeakSanitizer's suppressions and the longer limits only to the tests above it.
awk '/^if\(BALLAST_SANITIZE\)/ { block = 1 }
     block && /^endif\(\)/ { done = 1; next }
     done && /^[ \t]*(ballast_add_test|ballast_add_mpi_test|add_test)\(/ {
       print FILENAME ":" NR ": registered after the sanitizer block: " $0; bad = 1 }
     END { if (!done) { print FILENAME ": no sanitizer block found"; bad = 1 }; exit bad }' "$1"
