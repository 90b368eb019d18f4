"""Which KV-cache pages each sequence holds, and which full pages of earlier prompts can be reused.

Pages are counted references: a sequence holds its own, and a full page of a prompt, once written,
is also kept in a prefix index under the hash of every token up to its end, so a later prompt with
the same beginning (a system prompt, an earlier turn of a chat) takes those pages instead of
computing them again. A page nobody holds stays in the index until its room is needed (oldest
first). Only whole pages are shared, and a sequence never writes into a page it did not allocate.
"""
from __future__ import annotations

from collections import OrderedDict


class PagePool:
    def __init__(self, n_pages: int, page: int):
        self.page, self.n_pages = page, n_pages
        self.free = list(range(n_pages - 1, -1, -1))        # pop() hands out low ids first
        self.refs = [0] * n_pages
        self.index: dict = {}                 # prefix hash -> page
        self.key_of: dict = {}                # page -> its prefix hash
        self.idle: OrderedDict = OrderedDict()   # indexed pages nobody holds, oldest first
        self.reserved = 0                     # pages promised to admitted sequences, not yet taken

    @property
    def available(self) -> int:
        """Pages that can still be promised: free, or indexed but held by nobody."""
        return len(self.free) + len(self.idle) - self.reserved

    @property
    def used(self) -> int:
        return self.n_pages - len(self.free) - len(self.idle)

    def _keys(self, ids: list[int]) -> list:
        """The prefix hash of each full page of ids."""
        keys, h, P = [], 0, self.page
        for end in range(P, len(ids) + 1, P):
            h = hash((h, tuple(ids[end - P:end])))
            keys.append(h)
        return keys

    def match(self, ids: list[int]) -> list[int]:
        """The indexed pages that hold a prefix of ids (whole pages, leaving at least one token of
        ids to compute, whose logits start the generation), now held by the caller."""
        out = []
        for key in self._keys(ids[:len(ids) - 1]):
            page = self.index.get(key)
            if page is None:
                break
            out.append(page)
        for page in out:
            self._hold(page)
        return out

    def _hold(self, page: int):
        if self.refs[page] == 0:
            self.idle.pop(page, None)
        self.refs[page] += 1

    def reserve(self, n: int) -> bool:
        """Promise n pages to a sequence (taken later by allocate); False if the pool cannot."""
        if n > self.available:
            return False
        self.reserved += n
        return True

    def allocate(self, n: int) -> list[int]:
        """n pages out of a reservation, now held by the caller."""
        out = []
        for _ in range(n):
            if not self.free:                 # reuse the oldest page nobody holds
                page, _ = self.idle.popitem(last=False)
                del self.index[self.key_of.pop(page)]
                self.free.append(page)
            page = self.free.pop()
            self.refs[page] = 1
            out.append(page)
        self.reserved -= n
        return out

    def unreserve(self, n: int):
        self.reserved -= n

    def register(self, ids: list[int], pages: list[int]):
        """ids' full pages (written: their K/V are on the GPU) are in the index from now on."""
        for key, page in zip(self._keys(ids), pages):
            if key not in self.index and page not in self.key_of:
                self.index[key] = page
                self.key_of[page] = key

    def release(self, pages: list[int]):
        """The caller no longer holds these pages."""
        for page in pages:
            self.refs[page] -= 1
            if self.refs[page] == 0:
                if page in self.key_of:
                    self.idle[page] = None
                else:
                    self.free.append(page)
