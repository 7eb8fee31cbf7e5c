"""Helpers shared by the test suites (tests/ is on sys.path: ``from support.x import y``)."""
