"""The training rows handed to TRL's trainers, as a `datasets.Dataset`.

Built with a fingerprint of its own: a `Dataset` made without one hashes its whole table
with dill, and with datasets 5.1.0-5.2.0 and pyarrow 25-26 that fails ("Can't pickle
<class 'MonthDayNano'>", from the pyarrow-table pickler datasets 5.1.0 registers), so no
TRL trainer could start (found 2026-11-27; datasets 5.0.0 works but pins an older fsspec
than `make venv`'s). The fingerprint only names the data for datasets' cache.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def trl_dataset(rows: list[dict[str, Any]]) -> Any:
    """`rows` (JSON-serialisable dicts of one shape) as a `datasets.Dataset`."""
    from datasets import Dataset
    from datasets.table import InMemoryTable

    digest = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:32]
    return Dataset(InMemoryTable.from_pylist(rows), fingerprint=digest)


__all__ = ["trl_dataset"]
