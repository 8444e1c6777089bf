"""One run's life from the operator's side: ``submit`` (its inputs uploaded, its RayJob written),
``status``/``logs``/``stop``/``list`` (``commands.py``), the records and model copied back
(``results.py``, a netcheck's table and plot too), and what is read from them afterwards:
``runs`` (``listing.py``), ``report`` and ``reproduce``."""
