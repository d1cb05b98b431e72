"""Traces of writes and reads for bench/cost_replay.py: the loader (SkyStore's CSV format)
and the synthetic ML trace generator; the shipped traces are the CSV files here."""
