"""Masking: a failure's message as a key that is the same whichever run met it.

A finding's signature (:mod:`harness.conformance.findings.signatures`) holds the failure's
message with what differs between two runs of the same bug masked: addresses, random parts
of names, paths, device meshes, shapes, precisions and dtypes, a comparison's tolerance, and
numbers. A suite's report of a nested value that differs is keyed by that difference alone
(:func:`difference`), whichever check, family, format or rank met it.
"""

from __future__ import annotations

import re

from harness.report.words import shorten

__all__ = ["difference", "first_line_of", "mask"]

#: terminal colour codes some libraries put in their messages (torch's weights-only error)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_MASKS = (
    (re.compile(r"0x[0-9a-fA-F]+"), "0x?"),
    # random parts of names: one leftover file is one finding whichever name it drew
    (re.compile(r"\b[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}\b"), "UUID"),
    (
        re.compile(r"(?<=[A-Za-z][-_.])(?:[0-9a-f]{8}|[0-9a-f]{32}|(?=[0-9a-f]*\d)[0-9a-f]{6,})\b"),
        "HEX",
    ),
    (re.compile(r"\btmp[a-z0-9_]{8}\b"), "TMPDIR"),
    # counters glued to words (torch's collective fingerprints: "SequenceNumber=30OpType")
    (re.compile(r"(?<==)\d+(?=[A-Za-z])|\b\d+(?=vs\b)"), "N"),
    # a device mesh's printed shape and names: "meshes differ" is one error whichever meshes
    (re.compile(r"DeviceMesh\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)"), "MESH"),
    (re.compile(r"(?:/[\w.@+-]+){2,}/?"), "PATH"),
    # a precision and its dtypes: the same raise (or wrong answer) under bf16-mixed and
    # 16-mixed is one finding ("a gradient with dtype BFloat16" / "... Half")
    (re.compile(r"\b(?:bf)?(?:16|32|64)-(?:mixed|true)\b"), "PRECISION"),
    (re.compile(r"\btorch\.(?:b?float(?:16|32|64)|half|float|double)\b"), "DTYPE"),
    (re.compile(r"\b(?:BFloat16|Half|Float|Double)\b"), "DTYPE"),
    # a comparison's tolerance and its reason (suites' assert_close): the same wrong value is
    # one finding whichever precision's tolerance it went past
    (re.compile(r"\(rtol=.*$"), "(TOLERANCE)"),
    (re.compile(r"torch\.Size\(\[[^\]]*\]\)"), "SHAPE"),
    (re.compile(r"\[[\d,\s]+\]"), "SHAPE"),
    # a list of three names or more (parameters, keys): the same wrong answer whichever
    # model showed it (shorter lists are what is wrong: a leftover file, a missing key)
    (re.compile(r"\[(?:'[^']*', ){2,}'[^']*'\]"), "[NAMES]"),
    (re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?!\w)"), "N"),
)
_KEY_CHARS = 160
#: a suite's report of a nested value that differs, after the words that say where:
#: ``... loaded at world size 2 (fsdp): optimizer['state']['fc.bias']['exp_avg']: 3 of 4 ...``
_NESTED = re.compile(r"(?<![\w\]])(\w+)((?:\[[^\[\]]*\])+): (.+)$")
_SUBSCRIPT = re.compile(r"\[[^\[\]]*\]")
#: a list of quoted names, of any length: ``['exp_avg', 'step']``, ``['momentum_buffer']``
_QUOTED_NAMES = re.compile(r"\[(?:'[^']*', )*'[^']*'\]")
#: the words of a checkpoint judged as written (``the sharded checkpoint as written holds``)
_AS_WRITTEN = "checkpoint as written "


def first_line_of(message: str) -> str:
    """The first non-blank line of ``message``, without terminal colour codes."""
    text = _ANSI.sub("", message)
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def mask(message: str) -> str:
    """The first line of ``message`` with addresses, paths, shapes, device meshes and numbers
    masked."""
    first = first_line_of(message)
    for pattern, replacement in _MASKS:
        first = pattern.sub(replacement, first)
    return shorten(first, _KEY_CHARS, mark="")


def difference(first_line: str) -> str:
    """The masked nested difference a suite's assertion reports, without the words before it
    that say where it was seen; deeper keys than the first are folded (``[…]``); or ``""``."""
    match = _NESTED.search(first_line)
    if match is None:
        return ""
    subscripts = _SUBSCRIPT.findall(match.group(2))
    deeper = "[…]" if len(subscripts) > 1 else ""
    # one wrong file is one finding whichever of its entries a check read first: a save
    # that writes rank 0's shard of every parameter shows ``model['fc1.bias']`` to one
    # check and ``model['attn.in_proj_bias']`` to another (the optimizer's parameter name
    # is its second subscript, folded above)
    if _AS_WRITTEN in first_line[: match.start()] and len(subscripts) == 1:
        subscripts = ["[…]"]
    # the entry names what is wrong: a list after it is what an entry holds (Adam's moments,
    # SGD's momentum buffer), one finding whichever optimizer showed it
    what = _QUOTED_NAMES.sub("[NAMES]", match.group(3))
    return mask(f"{match.group(1)}{subscripts[0]}{deeper}: {what}")
