"""The benchmark scripts. Each runs as ``python bench/NAME.py`` and prints one JSON line; as the
package ``bench`` (importable from the checkout's root) the tests and the other scripts import their
pieces: ``from bench import roofline``."""
