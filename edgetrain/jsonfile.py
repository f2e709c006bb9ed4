"""Reading a JSON file that someone else may have written: a regular file, bounded, parsed.

Every JSON file edgetrain reads from disk (a manifest, a fleet spec, a fleet's merged
records) may be damaged or hostile: a link to `/dev/zero`, a FIFO, gigabytes of JSON, a
thousand nested lists. `read_json` refuses each before parsing, with the file, what is wrong
and the fix, as the caller's error class; what the JSON holds is the caller's to check.
"""
from __future__ import annotations

import json
import os
from pathlib import Path


def read_json(path: str | os.PathLike, max_bytes: int, what: str, fix: str,
              error: type[Exception] = ValueError):
    """The JSON value of `path`, a regular file (no link, device, FIFO) of at most max_bytes;
    else `error` naming `what` the file is and `fix`. A missing file is the caller's to say."""
    path = Path(path)
    if path.is_symlink():
        raise error(f"{what} {path} is a symbolic link (to {os.readlink(path)!r}); give the "
                    f"file itself. {fix}")
    if not path.is_file():
        raise error(f"{what} {path} is not a regular file (a device, FIFO or folder). {fix}")
    size = path.stat().st_size
    if size > max_bytes:
        raise error(f"{what} {path} is {size:,} bytes, more than the {max_bytes:,} such a file "
                    f"holds. {fix}")
    try:
        return json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise error(f"{what} {path} is not valid JSON ({str(e)[:200]}). {fix}") from None
