"""Constructs that model one thing each (EFA launch template, GPU node group, add-ons, ...)."""
