"""The key index of an upsert table: primary key -> where its live row is (data file, row position).

The bookkeeper is the table's only committer, so it can keep this index exactly: for every cycle it
looks up the previous row of each key the cycle's monikers touch, commits position deletes for
those rows, and then records where the keys' new rows are. No writer ever reads the table.

Keys are 128-bit words (`hi`, `lo`): a single integer key is its own value (exact, `lo` = 0);
other keys are a 128-bit hash (see `row_keys.py`). The index is three parallel numpy arrays
sorted by `hi` (24 bytes per key), not a Python dict: a dict of 10M tuple keys costs ~150 bytes
per key and ~1 µs per operation, while sorted arrays are searched and updated a whole cycle at a
time in C. A removed key keeps its slot with location `ABSENT` until compaction, so deletes and
re-inserts never move memory. Keys new to the index go to a second, small sorted set (`recent`),
merged into the main arrays once it holds a 32nd of them: inserting into 10M-key arrays every
cycle copied 240 MB a cycle (a second or more on a busy machine), now it happens every few dozen
cycles. Slots number the main arrays first, then the recent ones.

Locations pack a file ordinal and a row position into one unsigned 64-bit word; the ordinals name
entries of `files`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from icekeeper.bookkeeper.position_deletes import DataFileRef

ABSENT = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
"""Location of a key with no live row (deleted), and of a delete event in a cycle."""
_POSITION_BITS = 32
_POSITION_MASK = np.uint64((1 << _POSITION_BITS) - 1)


def pack(file_ordinal: int, positions: np.ndarray) -> np.ndarray:
    """Locations of rows `positions` of file `file_ordinal`."""
    return (np.uint64(file_ordinal) << np.uint64(_POSITION_BITS)) | positions.astype(np.uint64)


def unpack(locations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(file ordinals, row positions) of `locations`."""
    return (locations >> np.uint64(_POSITION_BITS)).astype(np.int64), (
        locations & _POSITION_MASK
    ).astype(np.int64)


@dataclass
class CycleChanges:
    """What one commit cycle does to the index, planned before the commit and applied after it.

    `replaced` are the locations of rows that stop being live (the position deletes to commit).
    `hi`/`lo`/`location` are each touched key's final location (`ABSENT` when its last change is
    a delete) and `slot` its slot in the index as planned (-1 for a key the index lacks).
    """

    replaced: np.ndarray
    hi: np.ndarray
    lo: np.ndarray
    location: np.ndarray
    slot: np.ndarray
    index_version: int


def _find_in(
    keys_hi: np.ndarray, keys_lo: np.ndarray, hi: np.ndarray, lo: np.ndarray
) -> np.ndarray:
    """The slot of each key (hi, lo) in the sorted set
    (`keys_hi`, `keys_lo`), or -1 where it has none."""
    size = len(keys_hi)
    if size == 0 or len(hi) == 0:
        return np.full(len(hi), -1, np.int64)
    start = np.searchsorted(keys_hi, hi, side="left")
    clipped = np.minimum(start, size - 1)
    same_hi = (start < size) & (keys_hi[clipped] == hi)
    found = same_hi & (keys_lo[clipped] == lo)
    slots = np.where(found, clipped, -1).astype(np.int64)
    # Two keys whose hashes share the upper 64 bits (about 1 in 10^5 at 10M keys) sit next to
    # each other in any order: the few such look-ups walk their run.
    for query in np.nonzero(same_hi & ~found)[0]:
        slot = int(start[query])
        while slot < size and keys_hi[slot] == hi[query]:
            if keys_lo[slot] == lo[query]:
                slots[query] = slot
                break
            slot += 1
    return slots


def _merged(main: tuple[np.ndarray, ...], recent: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Two sorted sets of (hi, lo, location) arrays as one (new arrays; neither input changes)."""
    at = np.searchsorted(main[0], recent[0], side="left")
    return tuple(np.insert(whole, at, part) for whole, part in zip(main, recent))


@dataclass
class KeyIndex:
    """Primary key -> live row location, for one upsert table. See the module docstring."""

    exact: bool
    """True when keys are single integers (stored as themselves), False when they are hashes."""
    files: list[DataFileRef] = field(default_factory=list)
    """The data files locations point into, by ordinal."""
    snapshot_id: int | None = None
    """The table snapshot whose live rows this index describes."""
    hi: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))
    lo: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))
    location: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))
    """`hi`, `lo`, `location`: the main sorted arrays; keys added since the last merge are in the
    recent set, so whoever needs every key reads `arrays()`."""
    version: int = 0
    """Bumped by every change, so a plan made against an older state is refused."""

    recent_min: int = 65_536
    """Fewest recent keys that are merged into the main arrays (tests lower it)."""
    _recent_hi: np.ndarray = field(
        default_factory=lambda: np.empty(0, np.uint64), init=False, repr=False
    )
    _recent_lo: np.ndarray = field(
        default_factory=lambda: np.empty(0, np.uint64), init=False, repr=False
    )
    _recent_location: np.ndarray = field(
        default_factory=lambda: np.empty(0, np.uint64), init=False, repr=False
    )

    def __post_init__(self) -> None:
        self._file_ordinals = {ref.path: ordinal for ordinal, ref in enumerate(self.files)}

    # -- files ------------------------------------------------------------------------------------

    def file_ordinal(self, ref: DataFileRef) -> int:
        """The ordinal of data file `ref`, assigned on first use."""
        ordinal = self._file_ordinals.get(ref.path)
        if ordinal is None:
            ordinal = self._file_ordinals[ref.path] = len(self.files)
            self.files.append(ref)
        return ordinal

    def ordinal_of(self, path: str) -> int | None:
        """The ordinal of data file `path`; None if no live key points into it now or ever did
        (`prune_files` forgets files without live keys)."""
        return self._file_ordinals.get(path)

    def prune_files(self) -> int:
        """Forget the data files no live key points into, renumbering the others; returns how
        many were forgotten.

        Files only gain keys when they are new: a row whose key moved on is never live again, so
        a file without live keys is one the index never needs (its rows are position-deleted, or
        stale in a rewrite). Without this `files` grew by every data file ever committed, and all
        of it is saved with the index (100,000 commits: 100,000 paths, bench/results.md). Changes
        the ordinals in every location: a cycle planned before must be planned again (`version`).
        """
        keep = self.live_rows_per_file() > 0
        dropped = len(keep) - int(np.count_nonzero(keep))
        if not dropped:
            return 0
        # Old ordinal -> new one; ABSENT's ordinal (2**32 - 1) is clipped to the last slot, which
        # maps to itself, so absent keys stay ABSENT without a mask. `np.take`, not `[...]`:
        # measured 7x faster on 10M random ordinals.
        renumbered = np.empty(len(keep) + 1, np.uint64)
        renumbered[:-1] = np.cumsum(keep) - 1
        renumbered[-1] = ABSENT >> np.uint64(_POSITION_BITS)
        for locations in (self.location, self._recent_location):
            ordinals = (locations >> np.uint64(_POSITION_BITS)).view(np.int64)
            np.minimum(ordinals, len(keep), out=ordinals)
            new_ordinals = np.take(renumbered, ordinals)
            new_ordinals <<= np.uint64(_POSITION_BITS)
            locations &= _POSITION_MASK
            locations |= new_ordinals
        self.files = [ref for ref, kept in zip(self.files, keep.tolist()) if kept]
        self._file_ordinals = {ref.path: ordinal for ordinal, ref in enumerate(self.files)}
        self.version += 1
        return dropped

    # -- reading ----------------------------------------------------------------------------------

    @property
    def live_keys(self) -> int:
        return int(np.count_nonzero(self.location != ABSENT)) + int(
            np.count_nonzero(self._recent_location != ABSENT)
        )

    @property
    def nbytes(self) -> int:
        return sum(
            array.nbytes
            for array in (
                self.hi,
                self.lo,
                self.location,
                self._recent_hi,
                self._recent_lo,
                self._recent_location,
            )
        )

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every key as one sorted set (`hi`, `lo`, `location`), what is saved: copies when keys are
        in the recent set (merging in place would renumber slots a planned cycle still uses)."""
        if not len(self._recent_hi):
            return self.hi, self.lo, self.location
        return _merged(
            (self.hi, self.lo, self.location),
            (self._recent_hi, self._recent_lo, self._recent_location),
        )

    def live_locations(self) -> np.ndarray:
        """The location of every live row, in no particular order."""
        locations = np.concatenate([self.location, self._recent_location])
        return locations[locations != ABSENT]

    def live_rows_per_file(self) -> np.ndarray:
        """Live rows per file ordinal (length `len(files)`): what is left of each data file.

        Counted on the location arrays as they are, without gathering the live ones first (at 10M
        keys ~0.1 s either way, but no 80 MB copy): absent keys fall into one extra bucket."""
        counts = np.zeros(len(self.files) + 1, np.int64)
        for locations in (self.location, self._recent_location):
            ordinals = (locations >> np.uint64(_POSITION_BITS)).astype(np.int64)
            np.minimum(ordinals, len(self.files), out=ordinals)  # ABSENT's ordinal is 2**32 - 1
            counts += np.bincount(ordinals, minlength=len(self.files) + 1)
        return counts[:-1]

    def live_positions(self, ordinals: list[int]) -> dict[int, np.ndarray]:
        """The sorted row positions of the live rows of each of files `ordinals`."""
        wanted = np.asarray(ordinals, np.int64)
        found_ordinals, found_positions = [], []
        for locations in (self.location, self._recent_location):
            file_ordinals = (locations >> np.uint64(_POSITION_BITS)).astype(np.int64)
            mask = np.isin(file_ordinals, wanted) & (locations != ABSENT)
            found_ordinals.append(file_ordinals[mask])
            found_positions.append((locations[mask] & _POSITION_MASK).astype(np.int64))
        all_ordinals = np.concatenate(found_ordinals)
        all_positions = np.concatenate(found_positions)
        return {
            int(ordinal): np.sort(all_positions[all_ordinals == ordinal]) for ordinal in ordinals
        }

    def find(self, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        """The slot of each key (hi, lo), or -1 where the index has none."""
        slots = _find_in(self.hi, self.lo, hi, lo)
        if len(self._recent_hi):
            missing = np.flatnonzero(slots < 0)
            recent = _find_in(self._recent_hi, self._recent_lo, hi[missing], lo[missing])
            slots[missing] = np.where(recent >= 0, recent + len(self.hi), -1)
        return slots

    def locations_of(self, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        """The live row location of each key, `ABSENT` where it has none."""
        return self._locations_at(self.find(hi, lo))

    def _locations_at(self, slots: np.ndarray) -> np.ndarray:
        """The location at each slot, `ABSENT` for slot -1."""
        found = np.full(len(slots), ABSENT, np.uint64)
        main, recent = self._split(slots)
        found[main] = self.location[slots[main]]
        found[recent] = self._recent_location[slots[recent] - len(self.hi)]
        return found

    def _split(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Masks of `slots` in the main arrays and in the recent ones."""
        return (slots >= 0) & (slots < len(self.hi)), slots >= len(self.hi)

    # -- a cycle: plan, commit elsewhere, apply ----------------------------------------------------

    def plan(self, hi: np.ndarray, lo: np.ndarray, location: np.ndarray) -> CycleChanges:
        """Plan a cycle's events, given in commit order:
        each key's new location, or `ABSENT` for a delete.

        A key touched several times (two monikers of the cycle, say) replaces its row each time:
        the first event replaces the index's row, each later one the row of the event before it,
        even when that row is in a file of this same cycle.
        """
        count = len(hi)
        order = np.lexsort((np.arange(count), lo, hi))
        hi, lo, location = hi[order], lo[order], location[order]
        first = np.ones(count, bool)
        first[1:] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
        last = np.ones(count, bool)
        last[:-1] = first[1:]
        previous = np.empty(count, np.uint64)
        previous[1:] = location[:-1]
        slots = self.find(hi[first], lo[first])
        previous[first] = self._locations_at(slots)
        replaced = previous[previous != ABSENT]
        return CycleChanges(
            replaced=replaced,
            hi=hi[last],
            lo=lo[last],
            location=location[last],
            slot=slots,
            index_version=self.version,
        )

    def apply(self, changes: CycleChanges, snapshot_id: int | None) -> None:
        """Record a committed cycle: keys point at their new rows (or at none) as of
        `snapshot_id`."""
        if changes.index_version != self.version:
            raise RuntimeError("the key index changed after this cycle was planned; plan it again")
        main, recent = self._split(changes.slot)
        self.location[changes.slot[main]] = changes.location[main]
        self._recent_location[changes.slot[recent] - len(self.hi)] = changes.location[recent]
        new = (changes.slot < 0) & (changes.location != ABSENT)
        if new.any():
            self._insert(changes.hi[new], changes.lo[new], changes.location[new])
        self.snapshot_id = snapshot_id
        self.version += 1
        self._compact_if_sparse()

    def remove_locations(self, locations: np.ndarray) -> None:
        """Forget the keys whose live row is at one of `locations` (position deletes read back)."""
        if len(locations) and len(self.location) + len(self._recent_location):
            self.location[np.isin(self.location, locations)] = ABSENT
            self._recent_location[np.isin(self._recent_location, locations)] = ABSENT
            self.version += 1

    def _insert(self, hi: np.ndarray, lo: np.ndarray, location: np.ndarray) -> None:
        """Add keys the index lacks to the recent set; merge it once it is large enough."""
        order = np.argsort(hi, kind="stable")
        hi, lo, location = hi[order], lo[order], location[order]
        at = np.searchsorted(self._recent_hi, hi, side="left")
        self._recent_hi = np.insert(self._recent_hi, at, hi)
        self._recent_lo = np.insert(self._recent_lo, at, lo)
        self._recent_location = np.insert(self._recent_location, at, location)
        if len(self._recent_hi) >= max(self.recent_min, len(self.hi) // 32):
            self._merge_recent()

    def _merge_recent(self) -> None:
        """Move the recent keys into the main arrays (slots change: only while applying a cycle)."""
        if not len(self._recent_hi):
            return
        self.hi, self.lo, self.location = _merged(
            (self.hi, self.lo, self.location),
            (self._recent_hi, self._recent_lo, self._recent_location),
        )
        self._recent_hi, self._recent_lo, self._recent_location = (
            np.empty(0, np.uint64) for _ in range(3)
        )

    def _compact_if_sparse(self) -> None:
        """Drop removed keys once they are a quarter of the slots (their slots cost memory only)."""
        slots = len(self.location) + len(self._recent_location)
        absent = slots - self.live_keys
        if absent > 1024 and absent * 4 > slots:
            self._merge_recent()
            keep = self.location != ABSENT
            self.hi, self.lo, self.location = self.hi[keep], self.lo[keep], self.location[keep]
