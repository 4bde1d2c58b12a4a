"""Ledger reasons from what Kubernetes and Slurm say: short, lower case, an XID as ``xid79``.

A reason is a label value of ``gpufleet_fleet_exclusions_total``, so each source turns its
free text (a condition type, a taint key, a Slurm node ``Reason``) into a few stable words.
"""

from __future__ import annotations

import re

# "Xid 79", "XID: 79", "xid79", the kernel's "Xid (PCI:0000:cb:00): 79"; not "SXID 12".
_XID = re.compile(r"(?<![a-z])xid(?:\s*\([^)]*\))?[\s:=#_-]*(\d{1,3})(?!\d)", re.IGNORECASE)
# NVSentinel's condition messages carry the error codes: "[79] ..." or "ErrorCode:79 ...".
_CODE = re.compile(r"(?:^|\[|error\s*code\s*[:=])\s*(\d{1,3})(?!\d)", re.IGNORECASE)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NOT_REASON = re.compile(r"[^a-z0-9_.:-]+")


def xid_reason(text: str, codes_are_xids: bool = False) -> str | None:
    """``xid79`` for an XID named in ``text``; with ``codes_are_xids``, also a leading code."""
    found = _XID.search(text) or (_CODE.search(text) if codes_are_xids else None)
    return f"xid{int(found.group(1))}" if found else None


def reason_from_key(name: str) -> str:
    """A ledger reason from a condition type or taint key: ``GpuMemWatch`` ->
    ``gpu_mem_watch``, ``nvidia.com/gpu-xid-error`` -> ``gpu-xid-error``."""
    tail = name.rsplit("/", 1)[-1]
    text = _NOT_REASON.sub("_", _CAMEL.sub("_", tail).lower()).strip("_.:-")
    return text[:64] or "tainted"


_TOKEN = re.compile(r"[a-z0-9]+")
# Ticket numbers, dates, addresses: a new value for each event, and the ledger counts
# distinct reasons (its cap). They stay in the exclusion's note.
_NUMBERISH = re.compile(r"(?:\d+|0x[0-9a-f]+|[0-9a-f]{8,})")
_SET_BY = re.compile(r"\s*\[[^\]]*@[^\]]*\]\s*$")  # scontrol's "[root@2026-12-04T18:57:44]"


def reason_from_text(text: str, fallback: str) -> str:
    """The ledger reason for a Slurm node ``Reason``: an XID named in it as ``xid79``,
    else its words in lower case joined by ``_`` ("Kill task failed" ->
    ``kill_task_failed``, "NHC: GPU check failed" -> ``nhc_gpu_check_failed``), numbers
    dropped, at most 64 characters; ``fallback`` (the state) when no word is left."""
    text = _SET_BY.sub("", text)
    xid = xid_reason(text)
    if xid:
        return xid
    words = [word for word in _TOKEN.findall(text.lower()) if not _NUMBERISH.fullmatch(word)]
    reason = ""
    for word in words:
        joined = f"{reason}_{word}" if reason else word
        if len(joined) > 64:
            break
        reason = joined
    return reason or fallback
