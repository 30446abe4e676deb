"""Find a training job's newest complete checkpoint in its checkpoint directory,
for jobs that save with their framework's own code rather than ``libs.sdk``.

``scan`` is the only I/O: one level of the directory, a fixed set of marker
files probed in each candidate subdirectory, and the small tracker files read
with a size cap. It never raises on a bad directory; what it could not read
goes into ``Listing.problems``. ``newest`` and ``in_progress`` decide over that
snapshot and do no I/O, so every rule below can be tested on plain data.

Layouts and what makes a checkpoint complete (the writer's own order of writes):

* megatron — ``latest_checkpointed_iteration.txt`` holds an iteration number or
  ``release``; checkpoints are ``iter_0000100/`` (7 digits) or ``release/``.
  Megatron writes the tracker only after every rank finished (a barrier, or the
  async save's finalize step), so the tracked iteration is the complete one and
  a higher ``iter_*`` is still being written. Its loader refuses other tracker
  text. (NVIDIA/Megatron-LM megatron/training/checkpointing.py:
  get_checkpoint_name, get_checkpoint_tracker_filename, read_metadata,
  save_checkpoint's iter_finalize_fn; a release checkpoint loads as iteration 0.)
* deepspeed — ``latest`` holds a tag (default ``global_step<N>``), written after
  the tag's files. (microsoft/DeepSpeed deepspeed/runtime/engine.py:
  save_checkpoint writes ``latest`` last; load_checkpoint reads it and strips.)
* torchtitan — ``step-<N>/`` saved with DCP; complete when ``.metadata`` (or,
  for an HF-format export, ``model.safetensors.index.json``) is in it, which is
  exactly what its loader accepts. (pytorch/torchtitan
  torchtitan/components/checkpoint.py: _create_checkpoint_id, _find_load_step.)
* dcp — any other step-named directory (``global_step100``, ``iter_0000100``,
  ``checkpoint-100``, ``step_100``) holding ``.metadata``: DCP writes it last,
  via ``.metadata.tmp`` then a rename, after every rank's data is written.
  (pytorch/pytorch torch/distributed/checkpoint/filesystem.py
  FileSystemWriter.finish; state_dict_saver.py _save_state_dict.)
* hf — Hugging Face Trainer ``checkpoint-<N>/``; ``trainer_state.json`` is
  written after the model, optimizer, scheduler and RNG state.
  (huggingface/transformers src/transformers/trainer.py _save_checkpoint.)
* sdk — this platform's ``step-<NNNNNNNN>/rank-<r>.pt`` (libs/sdk.py
  save_checkpoint, latest_complete_checkpoint): complete when every rank's file
  is there. The world size is not on disk, so this layout is judged only when
  the caller passes ``world_size``.

When a tracker file exists it alone decides for the directories it governs
(``iter_*`` for Megatron, ``global_step*`` for DeepSpeed): a ``.metadata`` in an
untracked ``iter_0000300`` does not make it loadable by Megatron.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
DEEPSPEED_TRACKER = "latest"
TRACKERS = (MEGATRON_TRACKER, DEEPSPEED_TRACKER)

DCP_METADATA = ".metadata"
HF_TRAINER_STATE = "trainer_state.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"
MARKERS = (DCP_METADATA, HF_TRAINER_STATE, SAFETENSORS_INDEX)

# A tracker holds a number or a short tag; anything bigger is not one.
TEXT_CAP_BYTES = 4096

# Anchored, so HF's transient ``tmp-checkpoint-N`` and the like never match.
_MEGATRON_DIR = re.compile(r"iter_(\d+)")
_DEEPSPEED_DIR = re.compile(r"global_step(\d+)")
_STEP_DASH_DIR = re.compile(r"step-(\d+)")
_HF_DIR = re.compile(r"checkpoint-(\d+)")
_OTHER_STEP_DIR = re.compile(r"step_(\d+)")
_STEP_PATTERNS = (_MEGATRON_DIR, _DEEPSPEED_DIR, _STEP_DASH_DIR, _HF_DIR, _OTHER_STEP_DIR)
_SDK_RANK_FILE = re.compile(r"rank-(\d+)\.pt")

# Which layout wins a tie on step: a tracker is the writer's own word.
_PRIORITY = ("megatron", "deepspeed", "sdk", "torchtitan", "hf", "dcp")


@dataclass(frozen=True)
class Subdir:
    """One candidate subdirectory: which marker files are regular files in it."""

    name: str
    markers: frozenset[str] = frozenset()
    ranks: frozenset[int] = frozenset()  # r of each rank-<r>.pt (the SDK layout)
    ranks_listed: bool = True  # False when the rank listing was cut short


@dataclass(frozen=True)
class Listing:
    """A snapshot of a checkpoint directory; plain data, built by ``scan``."""

    directory: str  # absolute
    files: frozenset[str] = frozenset()  # regular files at the top level
    subdirs: tuple[Subdir, ...] = ()
    texts: dict[str, str] = field(default_factory=dict)  # tracker name -> its text
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Found:
    layout: str  # one of _PRIORITY
    step: int | None  # None for a Megatron "release" or a step-less DeepSpeed tag
    path: str  # the checkpoint's directory (absolute)
    complete: bool


# ---------------------------------------------------------------------- decision (pure)


def _step_of(name: str, pattern: re.Pattern[str]) -> int | None:
    m = pattern.fullmatch(name)
    return int(m.group(1)) if m else None


def _candidates(listing: Listing, world_size: int | None) -> tuple[list[Found], list[str]]:
    """Every checkpoint the listing shows, complete or not, and why some were not."""
    found: list[Found] = []
    why: list[str] = []
    dirs = {d.name: d for d in listing.subdirs}

    def path(name: str) -> str:
        return os.path.join(listing.directory, name)

    # Megatron: the tracker decides; iter_* dirs above it are being written.
    megatron_governs = MEGATRON_TRACKER in listing.files
    tracked: int | None = None
    if megatron_governs:
        text = listing.texts.get(MEGATRON_TRACKER)
        meta = text.strip() if text is not None else None
        if meta is None:
            why.append(f"{MEGATRON_TRACKER}: unreadable")
        elif meta == "release":
            if "release" in dirs:
                found.append(Found("megatron", None, path("release"), True))
            else:
                why.append(f"{MEGATRON_TRACKER}: names release/, which is missing")
        elif re.fullmatch(r"\d+", meta):
            tracked = int(meta)
            name = f"iter_{tracked:07d}"
            if name in dirs:
                found.append(Found("megatron", tracked, path(name), True))
            else:
                why.append(f"{MEGATRON_TRACKER}: names {name}/, which is missing")
        else:
            why.append(f"{MEGATRON_TRACKER}: not an iteration: {meta[:40]!r}")

    # DeepSpeed: the `latest` tag decides; global_step* dirs are its.
    deepspeed_governs = DEEPSPEED_TRACKER in listing.files
    tag_dir: str | None = None
    if deepspeed_governs:
        text = listing.texts.get(DEEPSPEED_TRACKER)
        tag = text.strip() if text is not None else None
        if tag is None:
            why.append(f"{DEEPSPEED_TRACKER}: unreadable")
        elif not tag or tag in (".", "..") or "/" in tag or "\0" in tag or "\\" in tag:
            why.append(f"{DEEPSPEED_TRACKER}: not a directory name: {tag[:40]!r}")
        elif tag not in dirs:
            why.append(f"{DEEPSPEED_TRACKER}: names {tag[:40]}/, which is missing")
        else:
            tag_dir = tag
            digits = re.findall(r"\d+", tag)
            found.append(Found("deepspeed", int(digits[-1]) if digits else None, path(tag), True))

    for d in listing.subdirs:
        if d.name == tag_dir:
            continue
        if megatron_governs and (step := _step_of(d.name, _MEGATRON_DIR)) is not None:
            if tracked is not None and step > tracked:
                found.append(Found("megatron", step, path(d.name), False))
            continue
        if deepspeed_governs and (step := _step_of(d.name, _DEEPSPEED_DIR)) is not None:
            found.append(Found("deepspeed", step, path(d.name), False))
            continue
        has = d.markers.__contains__
        if (step := _step_of(d.name, _STEP_DASH_DIR)) is not None:
            if has(DCP_METADATA) or has(SAFETENSORS_INDEX):
                found.append(Found("torchtitan", step, path(d.name), True))
            elif d.ranks or not d.ranks_listed:
                if world_size is None:
                    why.append(f"{d.name}: SDK rank files, but no world_size to judge them")
                complete = (world_size is not None and d.ranks_listed
                            and d.ranks.issuperset(range(world_size)))
                found.append(Found("sdk", step, path(d.name), complete))
            else:
                found.append(Found("torchtitan", step, path(d.name), False))
            continue
        if (step := _step_of(d.name, _HF_DIR)) is not None:
            if has(HF_TRAINER_STATE):
                found.append(Found("hf", step, path(d.name), True))
            elif has(DCP_METADATA):  # a custom loop's DCP save; the Trainer nests its own
                found.append(Found("dcp", step, path(d.name), True))
            else:
                found.append(Found("hf", step, path(d.name), False))
            continue
        for pattern in _STEP_PATTERNS:
            if (step := _step_of(d.name, pattern)) is not None:
                found.append(Found("dcp", step, path(d.name), has(DCP_METADATA)))
                break
    return found, why


def _rank(f: Found) -> tuple[int, int, int, str]:
    # A step-less checkpoint (release) only wins when nothing else is complete.
    return (f.step is not None, f.step or 0, -_PRIORITY.index(f.layout), f.path)


def newest(listing: Listing, *, world_size: int | None = None) -> Found | None:
    """The newest complete checkpoint across layouts (by step), or None."""
    complete = [f for f in _candidates(listing, world_size)[0] if f.complete]
    return max(complete, key=_rank, default=None)


def in_progress(listing: Listing, *, world_size: int | None = None) -> list[Found]:
    """Incomplete checkpoints newer than the newest complete one, newest first:
    most likely being written now (or abandoned by a crash mid-save)."""
    found, _ = _candidates(listing, world_size)
    best = newest(listing, world_size=world_size)
    floor = best.step if best is not None and best.step is not None else -1
    late = [f for f in found if not f.complete and f.step is not None and f.step > floor]
    return sorted(late, key=_rank, reverse=True)


def problems(listing: Listing, *, world_size: int | None = None) -> list[str]:
    """What could not be read (from ``scan``) and what did not add up (trackers
    naming missing directories, garbage tracker text)."""
    return [*listing.problems, *_candidates(listing, world_size)[1]]


def resume_step(found: Found | None) -> int | None:
    """The step a job resuming from ``found`` continues after: its step, or 0 for
    a Megatron release checkpoint (Megatron loads those as iteration 0)."""
    if found is None or not found.complete:
        return None
    if found.layout == "megatron" and found.step is None:
        return 0
    return found.step


# ---------------------------------------------------------------------- the I/O


def _is_candidate(name: str) -> bool:
    return name == "release" or any(p.fullmatch(name) for p in _STEP_PATTERNS)


def _read_capped(path: str) -> tuple[str | None, str | None]:
    """(text, problem): a regular file's text if it is at most TEXT_CAP_BYTES."""
    try:
        # O_NONBLOCK: a FIFO planted under the tracker's name must not hang us.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return None, f"{os.path.basename(path)}: {e.strerror}"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, f"{os.path.basename(path)}: not a regular file"
        data = os.read(fd, TEXT_CAP_BYTES + 1)
    except OSError as e:
        return None, f"{os.path.basename(path)}: {e.strerror}"
    finally:
        os.close(fd)
    if len(data) > TEXT_CAP_BYTES:
        return None, f"{os.path.basename(path)}: over {TEXT_CAP_BYTES} bytes"
    return data.decode("utf-8", errors="replace"), None


def _is_file(path: str) -> tuple[bool, str | None]:
    try:
        return stat.S_ISREG(os.stat(path).st_mode), None
    except FileNotFoundError:
        return False, None
    except OSError as e:
        if e.errno == errno.ENOTDIR:
            return False, None
        return False, f"{path}: {e.strerror}"


def scan(directory: Path, *, max_entries: int = 10000) -> Listing:
    """Snapshot ``directory`` for ``newest``: its top-level names, the marker
    files of each step-named subdirectory, and the tracker files' text. At most
    ``max_entries`` directory entries are read in all; never raises."""
    root = os.path.abspath(directory)
    notes: list[str] = []
    files: set[str] = set()
    dir_names: list[str] = []
    seen = 0
    try:
        with os.scandir(root) as it:
            for entry in it:
                seen += 1
                if seen > max_entries:
                    notes.append(f"stopped after {max_entries} entries")
                    break
                try:
                    if entry.is_file():  # follows symlinks; a loop raises ELOOP
                        files.add(entry.name)
                    elif entry.is_dir():
                        dir_names.append(entry.name)
                except OSError as e:
                    notes.append(f"{entry.name}: {e.strerror}")
    except OSError as e:
        return Listing(directory=root, problems=(f"{root}: {e.strerror}",))

    texts: dict[str, str] = {}
    for name in TRACKERS:
        if name in files:
            text, problem = _read_capped(os.path.join(root, name))
            if text is not None:
                texts[name] = text
            if problem:
                notes.append(problem)

    wanted = set(filter(_is_candidate, dir_names))
    tag = texts.get(DEEPSPEED_TRACKER, "").strip()
    if tag in dir_names:  # a DeepSpeed tag may be any name
        wanted.add(tag)

    subdirs: list[Subdir] = []
    for name in sorted(wanted):
        sub = os.path.join(root, name)
        markers = set()
        for marker in MARKERS:
            ok, problem = _is_file(os.path.join(sub, marker))
            if ok:
                markers.add(marker)
            if problem:
                notes.append(problem)
        ranks: set[int] = set()
        listed = True
        if _STEP_DASH_DIR.fullmatch(name) and not markers:
            # The SDK's step dirs hold one rank-<r>.pt per rank: list them, within budget.
            try:
                with os.scandir(sub) as it:
                    for entry in it:
                        seen += 1
                        if seen > max_entries:
                            listed = False
                            notes.append(f"{name}: listing stopped after {max_entries} entries")
                            break
                        if (m := _SDK_RANK_FILE.fullmatch(entry.name)) is not None:
                            ranks.add(int(m.group(1)))
            except OSError as e:
                listed = False
                notes.append(f"{name}: {e.strerror}")
        subdirs.append(Subdir(name, frozenset(markers), frozenset(ranks), listed))

    return Listing(directory=root, files=frozenset(files), subdirs=tuple(subdirs),
                   texts=texts, problems=tuple(notes))


def discover(directory: Path, *, world_size: int | None = None) -> Found | None:
    """The newest complete checkpoint under ``directory`` (scan + newest)."""
    return newest(scan(directory), world_size=world_size)
