"""Imported by heldout.py from its own directory, as `python3 heldout.py`
puts that directory first on sys.path."""


def parse_factor(s):
    return float(s)
