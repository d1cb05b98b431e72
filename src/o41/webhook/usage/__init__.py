"""Usage: what each organization's jobs wrote and read, and where, counted in memory and
merged into the state store (``counters``), shown by the usage page and ``/v1/usage``
(``page``, drawn by ``html``, priced by ``prices``); and how many versions each Location
holds, shown in its status (``counts``)."""
