"""The mfuscope test suite (`tests.support` holds the shared builders and fakes)."""
