"""The import preludes the published RL code sets assume: Python source run before a program, in its namespace.

Code-R1 (and Klear-Reasoner, which trains on its data) prepends ``BASE_IMPORTS`` and ``BASE_LEETCODE_IMPORTS`` to
every functional and pytest program, and rllm does the same for its LeetCode, KodCode and HumanEval+ rows, so
programs in those sets call ``Counter``, ``List`` or ``ListNode`` without importing them. A suite's ``prelude``
(`klear.rewards.code_tests`) is where these go; the sandbox runs it in the program's namespace before the program
(compiled on its own, so the program's line numbers and its ``from __future__`` imports are unaffected).

- `BASE_PRELUDE`: the names of Code-R1's ``BASE_IMPORTS``, written out again without its duplicates, with the
  same final bindings (``bisect``, ``copy``, ``random`` are the modules, ``time`` is the function
  ``time.time``, ``re_search`` is ``re.search``). ``np`` and ``pd`` stand for numpy and pandas, imported on
  their first use (an attribute of ``np``), so a program that never touches them never pays for them, and a
  machine without them still runs every program that does not use them (one that does fails its tests with an
  ImportError).
- `LEETCODE_PRELUDE`: ``ListNode``, ``TreeNode``, ``list_node`` and ``tree_node`` (build them from LeetCode's
  level-order lists, ``None`` for a missing child), ``is_same_list`` and ``is_same_tree``, what LeetCode test
  programs call. Self-contained: it runs with or without `BASE_PRELUDE` before it.

What the prelude costs, measured in the sandbox (namespaces, 512 MB address-space limit, one forked child per
test, a warm file cache): the standard-library part ~5 ms per test; a program that uses numpy pays ~50 ms more,
pandas ~220 ms more, when it first touches them (imported up front, they cost every test of every program that
much: 0.28 s x 32 tests per completion on rllm's rows). Both import under the default ``memory_mb=512``, but they
take a share of the limit: with pandas imported about 350 MB of address space is in use, which leaves a program
~150 MB (pandas does not import at ``memory_mb=256``; numpy alone not at 128); a MemoryError there is deliberately
not caught. Code-R1 runs its programs with 1 GB (``--rlimit-as=1024m``), which ``memory_mb=1024`` matches.
"""

from __future__ import annotations

BASE_PRELUDE = """\
from itertools import accumulate, chain, combinations, count, cycle, groupby, islice, pairwise, permutations
from itertools import product, repeat, zip_longest
from copy import deepcopy
from string import ascii_lowercase, ascii_uppercase
from math import atan2, ceil, comb, factorial, floor, gcd, inf, isqrt, log, log2, log10, pi, prod, sqrt
from collections import Counter, OrderedDict, defaultdict, deque
from bisect import bisect, bisect_left, bisect_right, insort
from heapq import heapify, heappop, heappush, heapreplace, merge, nlargest, nsmallest
from functools import cache, cmp_to_key, lru_cache, partial, reduce
from random import randrange, shuffle
from operator import iand, itemgetter, or_, sub, xor
from re import search as re_search
from os.path import commonprefix
from typing import Any, Callable, Deque, Dict, Generator, Iterable, Iterator, List, Optional, Set, Tuple, Union
import bisect, collections, copy, datetime, functools, heapq, io, itertools, math, operator, os, random, re
import string, sys
from time import time


class _LazyModule:  # np / pd: imported on first use, so programs that never touch them never pay for them

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attribute):
        import importlib

        return getattr(importlib.import_module(self._name), attribute)


np = _LazyModule("numpy")
pd = _LazyModule("pandas")
"""

LEETCODE_PRELUDE = """\
import collections as _collections


class ListNode:
    def __init__(self, val=0, next=None):
        self.val = val
        self.next = next


class TreeNode:
    def __init__(self, val=0, left=None, right=None):
        self.val = val
        self.left = left
        self.right = right


def list_node(values):
    head = None
    for value in reversed(list(values)):
        head = ListNode(value, head)
    return head


def is_same_list(a, b):
    while a is not None and b is not None:
        if a.val != b.val:
            return False
        a, b = a.next, b.next
    return a is None and b is None


def tree_node(values):
    values = list(values)
    if not values or values[0] is None:
        return None
    root = TreeNode(values[0])
    parents, index = _collections.deque([root]), 1
    while parents and index < len(values):
        parent = parents.popleft()
        for side in ("left", "right"):
            if index < len(values) and values[index] is not None:
                child = TreeNode(values[index])
                setattr(parent, side, child)
                parents.append(child)
            index += 1
    return root


def is_same_tree(a, b):
    if a is None or b is None:
        return a is b
    return a.val == b.val and is_same_tree(a.left, b.left) and is_same_tree(a.right, b.right)
"""
