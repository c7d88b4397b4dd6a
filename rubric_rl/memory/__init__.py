"""HarnessRL's memory: time and semantic indexes in ChromaDB (``store``), the offline embedder
(``embedder``) and the calibration of its cosine floor (``calibrate``)."""
