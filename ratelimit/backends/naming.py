"""How a store names one identifier, shared by every store that keeps it by name (Redis
keys, the Postgres table's ``key`` column)::

    rl:{<namespace>:<key>}                      a rule without a selector
    rl:{<namespace>:<key>}:<selector>=<value>   a rule with a selector
    ...!<unit>                                  a rule that counts a unit (``tokens``)

Every part is percent-encoded (only ``A-Z a-z 0-9 _ . - / @ +`` stay as they are), so
``:``, ``{``, ``}``, ``=``, ``#``, spaces, NUL or lone surrogates in a value cannot make two
identifiers share a name, break Redis's hash tag or be refused by a database. A part longer
than 64 characters once encoded becomes ``#`` and a 128-bit BLAKE2b digest of its UTF-8
bytes, so names stay short whatever the values are. Front ends never build names.
"""

from __future__ import annotations

import functools
import hashlib
import re
from urllib.parse import quote

from ratelimit.core.plan import Identifier

PREFIX = "rl"
MAX_PART = 64
_SAFE = re.compile(r"[A-Za-z0-9_.\-/@+]*\Z")


def encode_part(text: str) -> str:
    """Encode one part of a key exactly when short, else as a 128-bit digest."""
    encoded = text if _SAFE.match(text) else quote(text, safe="/@+", errors="surrogatepass")
    if len(encoded) <= MAX_PART:
        return encoded
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16)
    return "#" + digest.hexdigest()


@functools.lru_cache(maxsize=4096)
def tag(namespace: str, key: str) -> str:
    """The key prefix, with its hash tag, shared by every key of one (namespace, key)."""
    return f"{PREFIX}:{{{encode_part(namespace)}:{encode_part(key)}}}"


selector_part = functools.lru_cache(maxsize=1024)(encode_part)
""":func:`encode_part` of a selector name: a limit's few names, encoded once."""


def identifier_key(identifier: Identifier) -> str:
    """The Redis key of one identifier."""
    name = tag(identifier.namespace, identifier.key)
    if identifier.selector is not None and identifier.value is not None:
        name = f"{name}:{selector_part(identifier.selector)}={encode_part(identifier.value)}"
    # "!" is encoded in every part, and a unit is a word: no value can end like this
    return name if identifier.unit is None else f"{name}!{identifier.unit}"
