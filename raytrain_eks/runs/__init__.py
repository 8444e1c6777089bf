"""One run's life from the operator's side: ``submit`` (its inputs uploaded, its RayJob written),
``status``/``logs``/``stop``/``list`` (``commands.py``), the records and model copied back
(``results.py``), and what is read from them afterwards: ``runs`` (``listing.py``), ``report``,
``reproduce`` and a netcheck's table."""
