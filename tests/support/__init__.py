"""What the tests share besides fixtures (those are in tests/fixtures/), one module per
purpose. Tests import from these modules, never from a conftest."""
