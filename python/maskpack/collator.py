"""maskpack.Collator: a ``collate_fn`` for a torch DataLoader that turns a list of examples into a
:class:`maskpack.Batch`, keeping every per-token key of the examples.

    loader = DataLoader(dataset, batch_size=8, collate_fn=maskpack.Collator(padding_free=True), num_workers=2)
    for bundle in loader:
        out = model(**bundle.hf_kwargs(labels=True))

Three shapes of batch: padded (one example per row, right padding to the longest, or to a multiple),
padding-free (every example in one packed row: cu_seqlens), and packed rows of a token budget
(``capacity=``: the planner places whole examples into rows of ``capacity`` tokens, several per row,
each row a doc-id mask row). The collator holds only plain values, so it pickles into worker processes.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ._errors import Error
from .batch import Batch, _per_token_key_set, prepare_batch

__all__ = ["Collator", "LengthBucketSampler"]


def _as_array(v: Any) -> Optional[np.ndarray]:
    """A per-token value of one example as a numpy array, or None when it is not array-like."""
    if isinstance(v, (str, bytes, dict)) or v is None:
        return None
    try:
        import torch

        if isinstance(v, torch.Tensor):
            return v.detach().cpu().numpy()
    except ImportError:  # pragma: no cover - torch is a test dependency
        pass
    try:
        a = np.asarray(v)
    except (TypeError, ValueError):
        return None
    return None if a.dtype == object or a.ndim == 0 else a


class Collator:
    """Examples (dicts with ``input_ids`` or ``inputs_embeds``, optional ``labels`` and any other keys)
    -> a :class:`Batch`. Every example is checked: ``input_ids`` a non-empty 1-D sequence of integer
    ids (``inputs_embeds`` [n, hidden]), errors naming the example's index. ``labels``,
    ``shift_labels`` and the keys named in ``per_token_keys=`` (passed on to prepare_batch) are
    per-token by name: every example that has one must have it, of its own token count, else
    :class:`maskpack.Error` naming the key and the example. Any other key whose value has the
    example's length as its first dimension in every example is per-token too. Per-token keys are
    padded/packed with the tokens (labels with ``ignore_index``, ``input_ids`` with ``pad_token_id``,
    others with 0); the rest (keys of any example) are gathered into lists, one entry per example (None
    where an example lacks the key), and pass through.

    padding_free: one packed row of all examples (cu_seqlens), else one padded row each.
    capacity: pack whole examples into rows of this many tokens with the planner (several per row;
    an example longer than the capacity is an error), padded rows of a doc-id mask.
    pad_to_multiple_of: the padded width (or, padding-free, the packed total) rounded up (FP8 and
    tensor-parallel kernels need multiples of 8 or 16).
    The remaining keyword arguments go to :func:`maskpack.prepare_batch` (backend, cp, cp_rank, tp, ...)."""

    def __init__(self, padding_free: bool = False, capacity: Optional[int] = None, pad_token_id: int = 0,
                 ignore_index: int = -100, pad_to_multiple_of: Optional[int] = None, return_tensors: str = "pt",
                 **prepare_kwargs: Any) -> None:
        if return_tensors not in ("pt", "np"):
            raise Error(f"return_tensors: expected 'pt' or 'np', found {return_tensors!r}",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument="return_tensors")
        if capacity is not None and (isinstance(capacity, bool) or int(capacity) < 1):
            raise Error(f"capacity: expected a token count >= 1, found {capacity!r}", "MASKPACK_ERR_INVALID_ARGUMENT",
                        argument="capacity")
        if pad_to_multiple_of is not None and int(pad_to_multiple_of) < 1:
            raise Error(f"pad_to_multiple_of: expected >= 1, found {pad_to_multiple_of!r}",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument="pad_to_multiple_of")
        self.padding_free = bool(padding_free)
        self.capacity = None if capacity is None else int(capacity)
        self.pad_token_id = int(pad_token_id)
        self.ignore_index = int(ignore_index)
        self.pad_to_multiple_of = None if pad_to_multiple_of is None else int(pad_to_multiple_of)
        self.return_tensors = return_tensors
        _per_token_key_set(prepare_kwargs.get("per_token_keys"))  # checked now, not at the first batch
        self.prepare_kwargs = dict(prepare_kwargs)

    def __repr__(self) -> str:
        return (f"Collator(padding_free={self.padding_free}, capacity={self.capacity}, "
                f"pad_to_multiple_of={self.pad_to_multiple_of}, {self.prepare_kwargs})")

    @staticmethod
    def _length(i: int, ex: Dict[str, Any], tok_key: str) -> int:
        """Example i's token count, its token key checked: input_ids a non-empty 1-D sequence of integer
        ids, inputs_embeds [n, hidden] with n >= 1."""
        v = ex.get(tok_key)
        a = _as_array(v)
        if a is None:
            raise Error(f"examples[{i}].{tok_key}: expected a sequence, found {type(v).__name__}",
                        "MASKPACK_ERR_SHAPE", argument=tok_key, index=(i,))
        want = 1 if tok_key == "input_ids" else 2
        if a.ndim != want:
            raise Error(f"examples[{i}].{tok_key}: expected {'[n] token ids' if want == 1 else '[n, hidden]'}, found "
                        f"shape {list(a.shape)}", "MASKPACK_ERR_SHAPE", argument=tok_key, index=(i,))
        if a.shape[0] == 0:
            raise Error(f"examples[{i}].{tok_key}: expected at least one token, found an empty example",
                        "MASKPACK_ERR_SHAPE", argument=tok_key, index=(i,))
        if tok_key == "input_ids" and a.dtype.kind not in "iu":
            raise Error(f"examples[{i}].input_ids: expected integer token ids, found dtype {a.dtype}",
                        "MASKPACK_ERR_DTYPE", argument="input_ids", index=(i,))
        return int(a.shape[0])

    def _pad_of(self, key: str) -> int:
        return self.ignore_index if key in ("labels", "shift_labels") else (self.pad_token_id if key == "input_ids"
                                                                             else 0)

    def _round(self, n: int) -> int:
        m = self.pad_to_multiple_of
        return n if not m else -(-n // m) * m

    def __call__(self, examples: Sequence[Dict[str, Any]]) -> Batch:
        if not examples:
            raise Error("examples: expected at least one example", "MASKPACK_ERR_SHAPE", argument="examples")
        tok_key = "input_ids" if "input_ids" in examples[0] else "inputs_embeds"
        if tok_key not in examples[0]:
            raise Error("examples[0]: expected an 'input_ids' or an 'inputs_embeds' entry", "MASKPACK_ERR_NOT_FOUND",
                        argument="input_ids")
        lengths = [self._length(i, ex, tok_key) for i, ex in enumerate(examples)]
        named = ("labels", "shift_labels") + _per_token_key_set(self.prepare_kwargs.get("per_token_keys"))
        keys: List[str] = []  # every key of any example, in order of first appearance
        for ex in examples:
            keys.extend(k for k in ex if k not in keys)
        per_token, other = {}, {}
        for k in keys:
            arrays = [_as_array(ex.get(k)) for ex in examples]
            fits = [a is not None and a.ndim >= 1 and a.shape[0] == n for a, n in zip(arrays, lengths)]
            if k in named and not all(fits):  # per-token by name: every example, its own length
                i = fits.index(False)
                j = next((j for j, ex in enumerate(examples) if ex.get(k) is not None), 0)
                if examples[i].get(k) is None:
                    raise Error(f"examples[{i}].{k}: missing, while examples[{j}] has {k} (a per-token key: every "
                                f"example needs one of its own length)", "MASKPACK_ERR_NOT_FOUND", argument=k,
                                index=(i,))
                a = arrays[i]
                found = "no sequence" if a is None else f"shape {list(a.shape)}"
                raise Error(f"examples[{i}].{k}: expected {lengths[i]} entries (the length of its {tok_key}), found "
                            f"{found}", "MASKPACK_ERR_SHAPE", argument=k, index=(i,))
            if all(fits):
                per_token[k] = arrays
            else:
                other[k] = [ex.get(k) for ex in examples]
        if self.capacity is not None:
            batch = self._rows(per_token, lengths)
        elif self.padding_free:
            batch = self._packed(per_token, lengths)
        else:
            batch = self._padded(per_token, lengths)
        if self.return_tensors == "pt":
            import torch

            batch = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}
        batch.update(other)
        kw = dict(self.prepare_kwargs)
        if self.capacity is not None:
            kw.setdefault("mask_convention", "doc_id")
        if self.padding_free and self.capacity is None:
            kw.setdefault("tail_padding", True)  # pad_to_multiple_of's tail belongs to no example
        return prepare_batch(batch, padding_free=self.padding_free, ignore_index=self.ignore_index,
                             pad_token_id=self.pad_token_id, **kw)

    def _padded(self, per_token: Dict[str, List[np.ndarray]], lengths: List[int]) -> Dict[str, np.ndarray]:
        S = self._round(max(lengths))
        out = {}
        for k, arrays in per_token.items():
            a0 = arrays[0]
            buf = np.full((len(arrays), S) + a0.shape[1:], self._pad_of(k), dtype=a0.dtype)
            for b, a in enumerate(arrays):
                buf[b, :a.shape[0]] = a
            out[k] = buf
        out["attention_mask"] = (np.arange(S)[None] < np.asarray(lengths)[:, None]).astype(np.int64)
        return out

    def _packed(self, per_token: Dict[str, List[np.ndarray]], lengths: List[int]) -> Dict[str, np.ndarray]:
        T = sum(lengths)
        Tp = self._round(T)
        out = {}
        for k, arrays in per_token.items():
            a = np.concatenate(arrays, axis=0)
            if Tp > T:  # the rounded tail is padding: a slot of no sequence
                a = np.concatenate([a, np.full((Tp - T,) + a.shape[1:], self._pad_of(k), dtype=a.dtype)], axis=0)
            out[k] = a[None]
        out["cu_seqlens"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        return out

    def _rows(self, per_token: Dict[str, List[np.ndarray]], lengths: List[int]) -> Dict[str, np.ndarray]:
        from ._plan import plan

        cap = self.capacity
        for i, n in enumerate(lengths):
            if n > cap:
                raise Error(f"examples[{i}]: {n} tokens do not fit a row of capacity {cap}", "MASKPACK_ERR_SHAPE",
                            argument="capacity", index=(i,))
        rows = [r for r in plan(lengths, capacity=cap).rows if r]
        W = self._round(cap)
        out = {}
        for k, arrays in per_token.items():
            a0 = arrays[0]
            buf = np.full((len(rows), W) + a0.shape[1:], self._pad_of(k), dtype=a0.dtype)
            for r, seqs in enumerate(rows):
                col = 0
                for s in seqs:
                    buf[r, col:col + lengths[s]] = arrays[s]
                    col += lengths[s]
            out[k] = buf
        doc = np.zeros((len(rows), W), dtype=np.int64)
        for r, seqs in enumerate(rows):
            col = 0
            for j, s in enumerate(seqs):
                doc[r, col:col + lengths[s]] = j + 1
                col += lengths[s]
        out["attention_mask"] = doc
        return out


class LengthBucketSampler:
    """Length buckets: a batch sampler (``DataLoader(dataset, batch_sampler=...)``) whose batches hold
    examples of similar lengths, so a padded batch wastes little on padding, as trainers' "group by
    length" options do.

    lengths: every example's token count. boundaries: increasing bucket edges; an example of length n
    goes to the first bucket whose edge is >= n (the last bucket takes the rest). None: buckets of
    equal example count (``n_buckets``, by sorted length). Each batch comes from one bucket and holds
    ``batch_size`` examples, or as many as fit ``max_tokens`` padded tokens (examples x longest), at
    least one. Shuffled within buckets and across batches by ``seed`` + epoch (``set_epoch``, as torch's
    DistributedSampler); every example appears exactly once per epoch (with ``batch_size``,
    ``drop_last`` drops each bucket's short last batch instead)."""

    def __init__(self, lengths: Sequence[int], batch_size: Optional[int] = None, max_tokens: Optional[int] = None,
                 boundaries: Optional[Sequence[int]] = None, n_buckets: int = 8, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False) -> None:
        self.lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
        if self.lengths.size and int(self.lengths.min()) < 1:
            i = int(np.argmin(self.lengths))
            raise Error(f"lengths[{i}]: expected >= 1, found {int(self.lengths[i])}", "MASKPACK_ERR_VALUE",
                        argument="lengths", index=(i,))
        if (batch_size is None) == (max_tokens is None):
            raise Error("batch_size, max_tokens: pass exactly one", "MASKPACK_ERR_INVALID_ARGUMENT",
                        argument="batch_size")
        for name, v in (("batch_size", batch_size), ("max_tokens", max_tokens), ("n_buckets", n_buckets)):
            if v is not None and (isinstance(v, bool) or int(v) < 1):
                raise Error(f"{name}: expected an integer >= 1, found {v!r}", "MASKPACK_ERR_INVALID_ARGUMENT",
                            argument=name)
        self.batch_size = None if batch_size is None else int(batch_size)
        self.max_tokens = None if max_tokens is None else int(max_tokens)
        if boundaries is not None:
            edges = [int(b) for b in boundaries]
            if any(b <= a for a, b in zip(edges, edges[1:])) or (edges and edges[0] < 1):
                raise Error(f"boundaries: expected increasing edges >= 1, found {edges}", "MASKPACK_ERR_VALUE",
                            argument="boundaries")
            self.bucket = np.searchsorted(np.asarray(edges, dtype=np.int64), self.lengths, side="left")
        else:
            order = np.argsort(self.lengths, kind="stable")
            self.bucket = np.empty(self.lengths.size, dtype=np.int64)
            self.bucket[order] = np.arange(self.lengths.size) * int(n_buckets) // max(1, self.lengths.size)
        self.shuffle, self.seed, self.drop_last, self.epoch = bool(shuffle), int(seed), bool(drop_last), 0

    def set_epoch(self, epoch: int) -> None:
        """Another order for another epoch (the same for every rank that shares the seed)."""
        self.epoch = int(epoch)

    def _batches(self) -> List[List[int]]:
        rng = np.random.default_rng((self.seed, self.epoch))
        batches: List[List[int]] = []
        for b in np.unique(self.bucket):
            idx = np.flatnonzero(self.bucket == b)
            if self.shuffle:
                idx = rng.permutation(idx)
            if self.max_tokens is None:
                cut = list(range(0, idx.size, self.batch_size))
                groups = [idx[c:c + self.batch_size] for c in cut]
                if self.drop_last and groups and groups[-1].size < self.batch_size:
                    groups.pop()
            else:  # greedy: add examples while examples x longest stays within the budget
                groups, cur, longest = [], [], 0
                for i in idx:
                    n = int(self.lengths[i])
                    if cur and (len(cur) + 1) * max(longest, n) > self.max_tokens:
                        groups.append(np.asarray(cur))
                        cur, longest = [], 0
                    cur.append(i)
                    longest = max(longest, n)
                if cur:
                    groups.append(np.asarray(cur))
            batches.extend([int(i) for i in g] for g in groups)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def __iter__(self):
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())
