"""Small shared helpers: static-shape buckets, the name -> object registry, library log lines, and
tcmalloc for XLA:CPU (stdlib only)."""
