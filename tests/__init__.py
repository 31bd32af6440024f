# Makes tests/ a package so that a test package such as tests/core/ is imported as
# "tests.core" and can never shadow the engine's own top-level "core" package.
