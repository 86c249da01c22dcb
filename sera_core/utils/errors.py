"""The error of input the user must fix, told apart from a bug.

``sera`` prints a :class:`UserInputError` as one JSON line and exits 2; any other exception
is a bug in the workbook and exits 1 with its traceback (:func:`sera_core.cli.main`).
"""

from __future__ import annotations


class UserInputError(ValueError):
    """What the user gave is wrong: a config file or key, a task file or record, a command-line
    argument, a run, checkpoint or evaluation folder; the message names the file, key or
    argument. A ``ValueError``, so callers that catch those keep working."""
