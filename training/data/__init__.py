"""Training data (placeholder docstring; the interface is documented below once complete)."""
