"""Constructs that model one thing each: the node groups, the add-ons, the Pod Identity roles."""
