"""The router's CPU cost of scraping stock vLLM engines' ``/metrics``: ``bench`` (the
measurement, the parse costs, the table), ``standin`` (the engines it scrapes, a separate
process)."""
