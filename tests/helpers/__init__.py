"""Code the tests share: model builders and loaders, runners driven by hand, engine runs, server
processes and stand-ins, fault hooks, raw HTTP, and shared test data. Fixtures live in the
conftest.py files; test modules import from here, never from each other or from a conftest."""
