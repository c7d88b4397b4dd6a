"""Library log lines that are not the run's: quiet by default, for the launcher and for a script
that builds a ``Trainer`` itself.

orbax logs several INFO lines per checkpoint save, optax one for every constant schedule it
builds from a zero-length warm-up, httpx one per HTTP request (the SGLang engine's); at INFO they
drown the run's one summary line per step. ``quiet_library_info`` drops the INFO (and DEBUG)
records logged from inside those packages; warnings and errors always pass.
``set_library_info(enabled)`` installs it (``enabled=False``, the default of
``config.logging.library_info``) or removes it (True) on the loggers those libraries log through
(absl's ``absl`` logger and the root logger) and on absl's handler, so it applies whichever
handler prints the records: absl's (the launcher) or the script's own.
"""

from __future__ import annotations

import logging
import os

from absl import logging as absl_logging

# Path fragments of the packages whose INFO lines are dropped (matched on the record's file).
# httpx logs one INFO line per HTTP request: with the SGLang engine, five per step and server.
QUIET_LIBRARIES = (f"{os.sep}orbax{os.sep}", f"{os.sep}optax{os.sep}", f"{os.sep}httpx{os.sep}")


def quiet_library_info(record: logging.LogRecord) -> bool:
    """A logging filter: False for the INFO (and DEBUG) records of ``QUIET_LIBRARIES``."""
    return record.levelno >= logging.WARNING or not any(
        p in record.pathname for p in QUIET_LIBRARIES
    )


def _filterers() -> tuple[logging.Filterer, ...]:
    # Logger filters see the records created on that logger (absl.logging.* calls: the "absl"
    # logger; logging.info(...): the root logger) before any handler; the handler filter covers
    # records propagated to absl's handler from any other logger.
    return (logging.getLogger("absl"), logging.getLogger(), absl_logging.get_absl_handler())


def set_library_info(enabled: bool = False) -> None:
    """``enabled=False``: drop the INFO lines of ``QUIET_LIBRARIES`` (installing twice adds one
    filter); True: let them through again (``config.logging.library_info``)."""
    for f in _filterers():
        if enabled:
            f.removeFilter(quiet_library_info)
        elif quiet_library_info not in f.filters:
            f.addFilter(quiet_library_info)


def library_info_enabled() -> bool:
    """Whether library INFO lines pass (no filter installed on absl's handler)."""
    return quiet_library_info not in absl_logging.get_absl_handler().filters


__all__ = ["QUIET_LIBRARIES", "library_info_enabled", "quiet_library_info", "set_library_info"]
