"""The one exception profiler.torch's library code raises: a message for the user and the exit
status the command line ends with (2: bad input or usage, 1: a failure while profiling)."""

INPUT = 2
FAIL = 1


class ProfileError(Exception):
    def __init__(self, message, code=INPUT):
        super().__init__(message)
        self.code = code
