"""What a request may hold: the checks that the API, the CLI and the jobs file share.

Light on purpose (no torch): the CLI runs them before its heavy imports, so a mistake is reported
at once. Every check raises :class:`InputError`, naming the argument and what to change; the API
raises it as is, the CLI prints it as one line and exits with status 2, the UI shows it as one status
message. It is the one exception type for a request a user can fix: the more specific errors of
the layers above (a bad config, missing weights, parallel degrees that cannot run) derive from it.
"""

from __future__ import annotations

import json
import math
import numbers
import stat
import sys
import unicodedata
from pathlib import Path
from typing import Any, cast

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class InputError(ValueError):
    """A request that cannot be made; the message names the argument and what to change."""


MAX_SEED = 2**63 - 1
"""Seeds are mixed into 64-bit generator seeds: 0 .. 2**63 - 1."""
MAX_INT = 2**31 - 1
"""Bound of the other integer arguments (sizes, steps, fps): anything above is a typo."""
MAX_GUIDANCE = 100.0
"""Largest classifier-free guidance scale (published models use 1-15; far above, the samples
overflow into a black video)."""
MAX_FILE_BYTES = 1 << 20
"""Largest storyboard or config file read (1 MiB: thousands of scenes)."""
MAX_JSON_DEPTH = 16
"""Deepest nesting a storyboard may have (a list of scenes of lists: 3)."""


def check_number(
    name: str,
    value: Any,
    *,
    integer: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
    positive: bool = False,
) -> Any:
    """``value`` if it is a finite number (an integer with ``integer``: 3.0 is 3) within the bounds, else
    :class:`InputError`. Booleans are not numbers; ``positive``: > 0."""
    kind = "integer" if integer else "number"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        article = "an" if integer else "a"
        raise InputError(f"{name} must be {article} {kind}, got {type(value).__name__} {value!r}")
    if (
        not isinstance(value, numbers.Integral)
        and not math.isfinite(value)
        or (not integer and isinstance(value, numbers.Integral) and abs(int(value)) > sys.float_info.max)
    ):
        raise InputError(f"{name} must be a finite {kind}, got {_short(value)}")
    if integer and not isinstance(value, numbers.Integral):
        if not float(value).is_integer():
            raise InputError(f"{name} must be an integer, got {value}")
        value = int(cast(Any, value))  # a Real whose float is whole: int() takes any Real
    if positive and not value > 0:
        raise InputError(f"{name} must be a positive {kind}, got {_short(value)}")
    if minimum is not None and value < minimum:
        raise InputError(f"{name} must be at least {_short(minimum)}, got {_short(value)}")
    if maximum is not None and value > maximum:
        raise InputError(f"{name} must be at most {_short(maximum)}, got {_short(value)}")
    return value


def check_guidance(name: str, value: Any) -> float:
    return check_number(name, value, positive=True, maximum=MAX_GUIDANCE)


def check_seed(name: str, value: Any) -> int:
    return check_number(name, value, integer=True, minimum=0, maximum=MAX_SEED)


def check_text(name: str, value: Any) -> str:
    """A string that encodes as UTF-8 (a command line's undecodable bytes arrive as surrogates)."""
    if not isinstance(value, str):
        raise InputError(f"{name} must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{name} is not valid UTF-8 text: write it in UTF-8") from None
    return value


def check_regular_file(file: Path, what: str) -> None:
    """:class:`InputError` unless ``file`` is a regular file (a link to one is): a folder, a device
    (``/dev/zero``), a FIFO or a socket is refused by its kind, never by reading it."""
    try:
        mode = file.stat().st_mode
    except FileNotFoundError:
        raise InputError(f"{what} file not found: {file}") from None
    except OSError as err:
        raise InputError(f"{what} {file} cannot be read: {err.strerror}") from None
    if stat.S_ISDIR(mode):
        raise InputError(f"{what} {file} is a folder, not a file")
    if not stat.S_ISREG(mode):
        kind = (
            "device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "FIFO"
            if stat.S_ISFIFO(mode)
            else "socket"
        )
        raise InputError(f"{what} {file} is a {kind}, not a file")


def is_blank(text: str) -> bool:
    """True when ``text`` shows nothing: only whitespace, control and format characters (zero-width
    spaces and joiners, direction marks), which a tokenizer drops or reads as nothing."""
    return all(unicodedata.category(ch)[0] in "ZC" for ch in text)


def read_text_file(path: str | Path, what: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """A UTF-8 text file of at most ``max_bytes``, else :class:`InputError` naming ``what``."""
    file = Path(path)
    check_regular_file(file, what)
    size = file.stat().st_size
    if size > max_bytes:
        raise InputError(f"{what} {path} is {size} bytes, more than the {max_bytes} a {what} file may have")
    data = file.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{what} {path} is not UTF-8 text (byte {err.start}): save it as UTF-8") from None
    if "\x00" in text:
        raise InputError(f"{what} {path} is a binary file, not text")
    return text


def parse_json(text: str, source: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """JSON with finite numbers only and at most ``max_depth`` levels of nesting."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:  # the nesting is counted before parsing: json recurses once per level
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > max_depth:
                raise InputError(f"{source}: nested deeper than {max_depth} levels")
        elif ch in "]}":
            depth -= 1

    def no_constant(name: str) -> None:
        raise InputError(f"{source}: {name} is not a number JSON allows; write a finite number")

    try:
        data = json.loads(text, parse_constant=no_constant)
    except ValueError as err:
        if isinstance(err, InputError):
            raise
        raise InputError(f"cannot parse {source}: {err}") from None
    return data


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """TOML, or :class:`InputError` naming ``source``: a syntax error, or nesting so deep that the
    parser would recurse past Python's limit (it recurses once per level of arrays and tables)."""
    try:
        return tomllib.loads(text)
    except ValueError as err:
        raise InputError(f"{source}: not valid TOML: {err}") from None
    except RecursionError:
        raise InputError(f"cannot parse {source}: nested too deeply") from None


def parse_storyboard(text: str, source: str, toml: bool) -> list[tuple[float, str]]:
    """``[[scene]] start = 0  prompt = "..."`` (TOML) or ``[{"start": 0, "prompt": "..."}]`` /
    ``[[0, "..."], ...]`` (JSON) -> ``[(start_seconds, prompt), ...]``, times checked finite."""
    data: Any
    if toml:
        table = parse_toml(text, source)
        data = table.get("scene", table.get("scenes"))
    else:
        data = parse_json(text, source)
        if isinstance(data, dict):
            data = data.get("scenes", data.get("scene"))
    if not isinstance(data, list) or not data:
        raise InputError(f"{source} must hold a list of scenes with start and prompt")
    board = []
    for i, entry in enumerate(data):
        if isinstance(entry, dict):
            start, prompt = entry.get("start"), entry.get("prompt")
        elif isinstance(entry, list) and len(entry) == 2:
            start, prompt = entry
        else:
            raise InputError(f"{source}: scene {i} needs a numeric start and a prompt string")
        start = check_number(f"{source}: scene {i} start", start, minimum=0)
        if not isinstance(prompt, str):
            raise InputError(f"{source}: scene {i} needs a numeric start and a prompt string")
        board.append((float(start), check_text(f"{source}: scene {i} prompt", prompt)))
    return board


def read_storyboard(path: str | Path) -> list[tuple[float, str]]:
    """A storyboard file: TOML (``.toml``) or JSON, as :func:`parse_storyboard` reads them; a file
    that is not one (binary, too big, too deep, times that are not finite numbers) is an
    :class:`InputError`."""
    text = read_text_file(path, "storyboard")
    return parse_storyboard(text, f"storyboard {path}", toml=Path(path).suffix == ".toml")


def _short(value: Any) -> str:
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"
