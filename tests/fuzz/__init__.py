"""Differential fuzzing of the HTTP front against uvicorn (docs/http.md, "Fuzzed against
uvicorn"): the same bytes to uvicorn ``--http httptools`` and to the toolkit on both of its
paths, and the outcomes compared."""
