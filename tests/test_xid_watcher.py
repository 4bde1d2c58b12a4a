"""The XID watcher thread against NVML's event stream (fake at the pynvml boundary)."""

from __future__ import annotations

from gpufleet.gpu.fake import FakeNvml
from gpufleet.gpu.nvml_call import CallErrors
from gpufleet.gpu.reader import NvmlReader
from gpufleet.gpu.xid import XidLedger, XidWatcher
from gpufleet.lab.processes import wait_until


def start_watcher(
    nvml: FakeNvml, *, registered: bool = True
) -> tuple[NvmlReader, XidLedger, XidWatcher, CallErrors]:
    """A reader and a watcher on ``nvml``, waited for until it watches (``registered``)."""
    errors = CallErrors()
    reader = NvmlReader(nvml, "node-a", errors=errors)
    reader.open()
    ledger = XidLedger()
    watcher = XidWatcher(nvml, reader.handles, ledger, errors, poll_ms=50)
    watcher.start()
    if registered:
        wait_until(lambda: ledger.view().watching, 5, what="watcher registered")
    return reader, ledger, watcher, errors


def test_xid_events_are_counted_per_gpu_and_code(fake_nvml: FakeNvml) -> None:
    reader, ledger, watcher, errors = start_watcher(fake_nvml)
    try:
        for index, xid in ((2, 79), (2, 79), (5, 48), (2, 13)):
            fake_nvml.inject_xid(index, xid)
        wait_until(lambda: ledger.version >= 5, 5, what="four XIDs recorded")
        view = ledger.view()
        uuids = [identity.uuid for _, identity in reader.handles]
        assert view.by_uuid[uuids[2]].counts == {79: 2, 13: 1}
        assert view.by_uuid[uuids[2]].last_xid == 13
        assert view.by_uuid[uuids[5]].counts == {48: 1}
        assert set(view.by_uuid) == {uuids[2], uuids[5]}
        assert errors.snapshot() == {}
    finally:
        watcher.stop()
    assert not ledger.view().watching


def test_an_xid_on_a_lost_gpu_is_still_attributed(fake_nvml: FakeNvml) -> None:
    reader, ledger, watcher, _ = start_watcher(fake_nvml)
    try:
        fake_nvml.lose_gpu(7)  # XID 79: the GPU fell off the bus; NVML can no longer name it
        fake_nvml.inject_xid(7, 79)
        wait_until(lambda: ledger.view().by_uuid, 5, what="XID recorded")
        uuid = reader.handles[7][1].uuid
        assert ledger.view().by_uuid[uuid].counts == {79: 1}
    finally:
        watcher.stop()


def test_gpus_without_event_support_are_skipped(fake_nvml: FakeNvml) -> None:
    fake_nvml.set_value(0, "nvmlDeviceRegisterEvents", {"nvml_error": "NVML_ERROR_NOT_SUPPORTED"})
    reader, ledger, watcher, errors = start_watcher(fake_nvml)
    try:
        fake_nvml.inject_xid(1, 94)
        wait_until(lambda: ledger.view().by_uuid, 5, what="XID recorded")
        assert ledger.view().by_uuid[reader.handles[1][1].uuid].counts == {94: 1}
        assert errors.snapshot() == {}  # not supported is not an error
    finally:
        watcher.stop()


def test_no_event_support_at_all_leaves_xids_unwatched(fake_nvml: FakeNvml) -> None:
    for index in range(8):
        fake_nvml.set_value(
            index, "nvmlDeviceRegisterEvents", {"nvml_error": "NVML_ERROR_NOT_SUPPORTED"}
        )
    _, ledger, watcher, _ = start_watcher(fake_nvml, registered=False)
    watcher.stop()
    assert not ledger.view().watching
    assert fake_nvml.calls["nvmlEventSetFree"] == 1
