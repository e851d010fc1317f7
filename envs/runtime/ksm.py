"""KSM (the kernel's same-page merging) for runs whose workspaces opt in: ksmd tuned while they live, the host's own
settings given back after.

Owns: the machine-wide record (``RECORD``, changed under ``LOCK``) of the host's own ksmd settings and of the runs
that hold the tuning; tuning ksmd when the first holder comes (``run=1`` and a scan rate fit for browsers, which
start and change fast: the kernel's default of 100 pages every 20 ms would take minutes to find one Chromium's
duplicates) and writing the saved settings back when the last holder goes. Every change first drops the holds of
runs whose engine is dead, so an engine killed with SIGKILL gives the settings back at the next start of any engine
(``cleanup.remove_stale_runs`` calls ``recover``). ``KsmHold`` is one run's hold, taken when its first opting-in
workspace starts (``AppSpec.merge_memory``), given back when the run closes.
Must never: change the settings while another live run holds them, lose the host's own values, or unmerge pages
(``run`` goes back to the host's value, never to 2).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

KSM_DIR = Path("/sys/kernel/mm/ksm")
STATE_DIR = Path("/run/bunshin")  # tmpfs: emptied at boot, when ksmd is back to the kernel's defaults anyway
RECORD = "ksm.json"
LOCK = "ksm.lock"
KNOBS = ("run", "pages_to_scan", "sleep_millisecs")  # what a hold changes, saved before and written back after


@dataclass(frozen=True)
class KsmTuning:
    """ksmd's scan rate while a run holds it: ``pages_to_scan`` pages every ``sleep_millisecs`` (5000 every 20 ms:
    what merged 11% of four Chromium workspaces within a minute on a two-core machine; ksmd's CPU is a cost, and
    ``bench memory`` reports it)."""

    pages_to_scan: int = 5000
    sleep_millisecs: int = 20

    def settings(self) -> dict[str, str]:
        return {"run": "1", "pages_to_scan": str(self.pages_to_scan), "sleep_millisecs": str(self.sleep_millisecs)}


def available(ksm_dir: Path = KSM_DIR) -> bool:
    """Whether this kernel has KSM (its sysfs directory)."""
    return (ksm_dir / "run").exists()


def read_settings(ksm_dir: Path = KSM_DIR) -> dict[str, str]:
    """The current value of every knob of ``KNOBS``."""
    return {k: (ksm_dir / k).read_text().strip() for k in KNOBS}


def read_counters(ksm_dir: Path = KSM_DIR) -> dict[str, int]:
    """ksmd's counters (pages_shared, pages_sharing, full_scans...): every integer file of its directory."""
    out = {}
    for entry in ksm_dir.iterdir():
        with contextlib.suppress(OSError, ValueError):
            out[entry.name] = int(entry.read_text().strip())
    return out


def holders(state_dir: Path = STATE_DIR) -> list[str]:
    """The runs holding the tuning now, as the record says (read without the lock: for reports)."""
    try:
        return list(json.loads((state_dir / RECORD).read_text()).get("holders", []))
    except (OSError, ValueError, AttributeError):
        return []


def _write_settings(ksm_dir: Path, values: dict[str, str]) -> None:
    # ``run`` last when tuning (ksmd starts with the new rate), first when giving back (it stops before the rate
    # changes): the order of ``values`` says which
    for k, v in values.items():
        (ksm_dir / k).write_text(v)


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[dict]:
    """The record under the machine-wide lock; what the block leaves in the dict is written back (an empty dict:
    the record is removed)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = state_dir / RECORD
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            record = {}
        except ValueError:  # written whole through a rename: a corrupt one is not ours to trust; keep it aside
            path.rename(path.with_suffix(".corrupt"))
            record = {}
        yield record
        if record:
            staging = path.with_name(f".{RECORD}")
            staging.write_text(json.dumps(record))
            staging.rename(path)
        else:
            path.unlink(missing_ok=True)
    finally:
        os.close(fd)


def _settle(record: dict, live: set[str], ksm_dir: Path) -> bool:
    """Drop the holds of runs not in ``live``; with none left, give the saved settings back and empty the record.
    Whether settings were given back."""
    holders = [h for h in record.get("holders", []) if h in live]
    if holders:
        record["holders"] = holders
        return False
    saved = record.get("saved")
    record.clear()
    if saved:
        _write_settings(ksm_dir, {k: saved[k] for k in ("run", *KNOBS[1:]) if k in saved})
        return True
    return False


def hold(run_id: str, live_runs: Callable[[], set[str]], tuning: KsmTuning, *, ksm_dir: Path = KSM_DIR,
         state_dir: Path = STATE_DIR) -> None:
    """Register ``run_id`` as a holder; the first holder saves the host's settings and tunes ksmd. ``live_runs``:
    the ids of runs whose engine is alive (``cleanup.registered_live_runs``)."""
    with _locked(state_dir) as record:
        _settle(record, live_runs() | {run_id}, ksm_dir)
        if not record:
            record["saved"] = read_settings(ksm_dir)
            record["tuned"] = tuning.settings()
            record["holders"] = []
            values = tuning.settings()
            _write_settings(ksm_dir, {**{k: values[k] for k in KNOBS[1:]}, "run": values["run"]})
        if run_id not in record["holders"]:
            record["holders"].append(run_id)


def release(run_id: str | None, live_runs: Callable[[], set[str]], *, ksm_dir: Path = KSM_DIR,
            state_dir: Path = STATE_DIR) -> bool:
    """Drop ``run_id``'s hold (None: only the dead runs'); the last one gives the host's settings back. Whether
    they were given back now."""
    if not (state_dir / RECORD).exists():
        return False
    with _locked(state_dir) as record:
        return _settle(record, live_runs() - {run_id}, ksm_dir)


def recover(live_runs: Callable[[], set[str]], *, ksm_dir: Path = KSM_DIR, state_dir: Path = STATE_DIR) -> bool:
    """At an engine's start: the holds of dead runs dropped, the host's settings given back if none is left."""
    return release(None, live_runs, ksm_dir=ksm_dir, state_dir=state_dir)


class KsmHold:
    """One run's hold on ksmd's tuning: ``take`` (blocking, idempotent; nothing where the kernel has no KSM) when an
    opting-in workspace starts, ``give_back`` when the run closes."""

    def __init__(self, run_id: str, live_runs: Callable[[], set[str]], tuning: KsmTuning | None = None, *,
                 ksm_dir: Path = KSM_DIR, state_dir: Path = STATE_DIR):
        self.run_id, self.live_runs = run_id, live_runs
        self.tuning = tuning or KsmTuning()
        self.ksm_dir, self.state_dir = ksm_dir, state_dir
        self.held = False

    def take(self) -> bool:
        """Hold the tuning for this run; whether it is held (False: this kernel has no KSM)."""
        if not self.held and available(self.ksm_dir):
            hold(self.run_id, self.live_runs, self.tuning, ksm_dir=self.ksm_dir, state_dir=self.state_dir)
            self.held = True
        return self.held

    def give_back(self) -> None:
        if self.held:
            self.held = False
            release(self.run_id, self.live_runs, ksm_dir=self.ksm_dir, state_dir=self.state_dir)
