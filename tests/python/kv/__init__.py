"""ferry.kv tests (a package, so that its conftest does not take the name of tests/python/conftest.py)."""
