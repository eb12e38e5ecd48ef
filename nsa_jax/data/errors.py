"""The one exception type of the data pipeline."""
from __future__ import annotations


class DataError(ValueError):
    """Bad data input; the message is one line naming the config key or the file path."""
