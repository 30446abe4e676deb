"""libs.checkpoint_layouts: each framework's real on-disk layout, built in
tmp_path with the file names the framework writes, and the garbage around it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from libs.checkpoint_layouts import (
    TEXT_CAP_BYTES,
    Found,
    Listing,
    Subdir,
    discover,
    in_progress,
    newest,
    problems,
    resume_step,
    scan,
)


def _touch(path: Path, text: str = "x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def megatron(root: Path, iteration: int, *, tracked: bool = True) -> Path:
    d = root / f"iter_{iteration:07d}"
    _touch(d / "mp_rank_00" / "model_optim_rng.pt")
    if tracked:
        (root / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return d


def dcp(d: Path, *, done: bool = True) -> Path:
    _touch(d / "__0_0.distcp")
    _touch(d / "__1_0.distcp")
    if done:
        _touch(d / ".metadata")
    else:
        _touch(d / ".metadata.tmp")
    return d


def hf(root: Path, step: int, *, done: bool = True) -> Path:
    d = root / f"checkpoint-{step}"
    for name in ("config.json", "model.safetensors", "optimizer.pt", "scheduler.pt",
                 "rng_state.pth"):
        _touch(d / name)
    if done:
        _touch(d / "trainer_state.json", f'{{"global_step": {step}}}')
    return d


def deepspeed(root: Path, step: int, *, latest: bool = True) -> Path:
    d = root / f"global_step{step}"
    _touch(d / "mp_rank_00_model_states.pt")
    _touch(d / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    if latest:
        (root / "latest").write_text(f"global_step{step}")
    return d


def sdk(root: Path, step: int, ranks: range) -> Path:
    d = root / f"step-{step:08d}"
    for r in ranks:
        _touch(d / f"rank-{r}.pt")
    return d


# ---------------------------------------------------------------------- one layout each


def test_megatron_tracker_wins_over_a_newer_untracked_iter(tmp_path: Path) -> None:
    megatron(tmp_path, 100)
    megatron(tmp_path, 200)
    megatron(tmp_path, 300, tracked=False)  # being written: no tracker update yet
    listing = scan(tmp_path)
    assert newest(listing) == Found("megatron", 200, str(tmp_path / "iter_0000200"), True)
    assert in_progress(listing) == [
        Found("megatron", 300, str(tmp_path / "iter_0000300"), False)]


def test_megatron_untracked_iter_with_dcp_metadata_is_still_not_loadable(
        tmp_path: Path) -> None:
    megatron(tmp_path, 200)
    dcp(megatron(tmp_path, 300, tracked=False))  # torch_dist format; finalize pending
    assert discover(tmp_path).step == 200  # type: ignore[union-attr]


def test_megatron_release(tmp_path: Path) -> None:
    _touch(tmp_path / "release" / "mp_rank_00" / "model_optim_rng.pt")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("release\n")
    found = discover(tmp_path)
    assert found == Found("megatron", None, str(tmp_path / "release"), True)
    assert resume_step(found) == 0  # Megatron loads a release checkpoint as iteration 0


def test_megatron_tracker_naming_a_missing_dir(tmp_path: Path) -> None:
    megatron(tmp_path, 100)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("200")
    listing = scan(tmp_path)
    assert newest(listing) is None
    assert any("iter_0000200/" in p for p in problems(listing))


def test_hf_checkpoint_without_trainer_state_falls_back(tmp_path: Path) -> None:
    hf(tmp_path, 250)
    hf(tmp_path, 500, done=False)
    hf(tmp_path, 50)
    listing = scan(tmp_path)
    assert newest(listing) == Found("hf", 250, str(tmp_path / "checkpoint-250"), True)
    assert [f.step for f in in_progress(listing)] == [500]


def test_hf_ignores_the_trainers_temporary_dir(tmp_path: Path) -> None:
    hf(tmp_path, 10)
    _touch(tmp_path / "tmp-checkpoint-20" / "trainer_state.json")
    assert discover(tmp_path).step == 10  # type: ignore[union-attr]


def test_torchtitan_needs_metadata(tmp_path: Path) -> None:
    dcp(tmp_path / "step-10")
    dcp(tmp_path / "step-20", done=False)
    listing = scan(tmp_path)
    assert newest(listing) == Found("torchtitan", 10, str(tmp_path / "step-10"), True)
    assert in_progress(listing) == [Found("torchtitan", 20, str(tmp_path / "step-20"), False)]


def test_torchtitan_hf_export_counts(tmp_path: Path) -> None:
    _touch(tmp_path / "step-30" / "model.safetensors.index.json")
    assert discover(tmp_path) == Found("torchtitan", 30, str(tmp_path / "step-30"), True)


def test_deepspeed_latest_tag(tmp_path: Path) -> None:
    deepspeed(tmp_path, 100)
    deepspeed(tmp_path, 200, latest=False)  # written, `latest` not yet updated
    listing = scan(tmp_path)
    assert newest(listing) == Found("deepspeed", 100, str(tmp_path / "global_step100"), True)
    assert [f.step for f in in_progress(listing)] == [200]


def test_deepspeed_latest_naming_a_missing_dir(tmp_path: Path) -> None:
    deepspeed(tmp_path, 100)
    (tmp_path / "latest").write_text("global_step200")
    listing = scan(tmp_path)
    assert newest(listing) is None
    assert any("global_step200/" in p for p in problems(listing))


def test_deepspeed_custom_tag(tmp_path: Path) -> None:
    _touch(tmp_path / "epoch3-run" / "mp_rank_00_model_states.pt")
    (tmp_path / "latest").write_text("epoch3-run")
    assert discover(tmp_path) == Found("deepspeed", 3, str(tmp_path / "epoch3-run"), True)


@pytest.mark.parametrize("tag", ["../etc", "a/b", "", "   "])
def test_deepspeed_tag_that_is_no_dir_name(tmp_path: Path, tag: str) -> None:
    (tmp_path / "latest").write_text(tag)
    _touch(tmp_path / "etc" / "x")
    assert discover(tmp_path) is None


@pytest.mark.parametrize("name", ["global_step100", "iter_0000100", "checkpoint-100",
                                  "step_100"])
def test_plain_dcp_dirs(tmp_path: Path, name: str) -> None:
    dcp(tmp_path / name)
    dcp(tmp_path / name.replace("100", "200"), done=False)
    found = discover(tmp_path)
    assert found is not None
    assert (found.layout, found.step, found.path) == ("dcp", 100, str(tmp_path / name))


def test_sdk_layout_needs_world_size_and_every_rank(tmp_path: Path) -> None:
    sdk(tmp_path, 100, range(4))
    sdk(tmp_path, 200, range(3))  # rank 3 still writing
    listing = scan(tmp_path)
    assert newest(listing) is None  # the world size is not on disk
    assert any("world_size" in p for p in problems(listing))
    found = newest(listing, world_size=4)
    assert found == Found("sdk", 100, str(tmp_path / "step-00000100"), True)
    assert newest(listing, world_size=3).step == 200  # type: ignore[union-attr]


# ---------------------------------------------------------------------- across layouts


def test_mixed_layouts_newest_complete_wins(tmp_path: Path) -> None:
    megatron(tmp_path, 300)
    hf(tmp_path, 400)
    hf(tmp_path, 900, done=False)
    dcp(tmp_path / "step-350")
    deepspeed(tmp_path, 250)
    assert discover(tmp_path) == Found("hf", 400, str(tmp_path / "checkpoint-400"), True)
    assert [f.step for f in in_progress(scan(tmp_path))] == [900]


def test_release_loses_to_any_numbered_checkpoint(tmp_path: Path) -> None:
    _touch(tmp_path / "release" / "x")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("release")
    hf(tmp_path, 0)  # even step 0: a release has no step, it is not step 0
    assert discover(tmp_path).layout == "hf"  # type: ignore[union-attr]


def test_tie_goes_to_the_tracker_layout() -> None:
    listing = Listing(
        directory="/ck",
        files=frozenset({"latest_checkpointed_iteration.txt"}),
        texts={"latest_checkpointed_iteration.txt": "100"},
        subdirs=(Subdir("iter_0000100"), Subdir("checkpoint-100",
                                                frozenset({"trainer_state.json"}))),
    )
    assert newest(listing) == Found("megatron", 100, "/ck/iter_0000100", True)


# ---------------------------------------------------------------------- the pure core, table-driven

_T = "latest_checkpointed_iteration.txt"


@pytest.mark.parametrize(("files", "texts", "subdirs", "expected"), [
    ((), {}, (), None),
    ((_T,), {_T: "200"}, ("iter_0000200", "iter_0000300"), ("megatron", 200)),
    ((_T,), {_T: " 0000200 \n"}, ("iter_0000200",), ("megatron", 200)),
    ((_T,), {_T: "-5"}, ("iter_0000005",), None),
    ((_T,), {_T: "2e3"}, ("iter_0002000",), None),
    ((_T,), {}, ("iter_0000100",), None),  # tracker present but unreadable
    (("latest",), {"latest": "global_step7\n"}, ("global_step7",), ("deepspeed", 7)),
    (("latest",), {"latest": "global_step7"}, (), None),
    ((), {}, ("checkpoint-5",), None),
    ((), {}, ("not-a-step", "step-x", "iter_"), None),
])
def test_newest_table(files: tuple[str, ...], texts: dict[str, str],
                      subdirs: tuple[str, ...], expected: tuple[str, int] | None) -> None:
    listing = Listing(directory="/ck", files=frozenset(files), texts=texts,
                      subdirs=tuple(Subdir(n) for n in subdirs))
    found = newest(listing)
    assert (None if found is None else (found.layout, found.step)) == expected


def test_resume_step() -> None:
    assert resume_step(None) is None
    assert resume_step(Found("hf", 5, "/x", True)) == 5
    assert resume_step(Found("hf", 5, "/x", False)) is None
    assert resume_step(Found("deepspeed", None, "/x", True)) is None


# ---------------------------------------------------------------------- garbage never raises


def test_empty_dir(tmp_path: Path) -> None:
    listing = scan(tmp_path)
    assert newest(listing) is None and in_progress(listing) == [] and listing.problems == ()


def test_nonexistent_dir(tmp_path: Path) -> None:
    listing = scan(tmp_path / "nope")
    assert newest(listing) is None
    assert listing.problems and "No such file" in listing.problems[0]
    assert discover(tmp_path / "nope") is None


def test_a_file_instead_of_a_dir(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    assert discover(tmp_path / "f") is None


def test_garbage_tracker_text(tmp_path: Path) -> None:
    megatron(tmp_path, 100)
    (tmp_path / "latest_checkpointed_iteration.txt").write_bytes(b"\xff\xfe garbage \x00")
    listing = scan(tmp_path)
    assert newest(listing) is None
    assert any("not an iteration" in p for p in problems(listing))


def test_huge_tracker_is_capped(tmp_path: Path) -> None:
    megatron(tmp_path, 100)
    with open(tmp_path / "latest_checkpointed_iteration.txt", "wb") as fh:
        fh.write(b"1" * (10 * 1024 * 1024))
    listing = scan(tmp_path)
    assert _T not in listing.texts
    assert any(f"over {TEXT_CAP_BYTES} bytes" in p for p in listing.problems)
    assert newest(listing) is None  # Megatron itself could not use that tracker


def test_huge_tracker_does_not_hide_other_layouts(tmp_path: Path) -> None:
    (tmp_path / "latest").write_bytes(b"9" * (10 * 1024 * 1024))
    hf(tmp_path, 40)
    assert discover(tmp_path).step == 40  # type: ignore[union-attr]


def test_symlink_loops_and_dangling_links(tmp_path: Path) -> None:
    hf(tmp_path, 10)
    os.symlink(tmp_path / "loop-a", tmp_path / "loop-b")
    os.symlink(tmp_path / "loop-b", tmp_path / "loop-a")
    os.symlink(tmp_path / "checkpoint-20", tmp_path / "checkpoint-20")  # itself
    os.symlink(tmp_path / "gone", tmp_path / "latest")
    (tmp_path / "iter_0000500").mkdir()
    os.symlink(tmp_path / "iter_0000500" / ".metadata", tmp_path / "iter_0000500" / ".metadata")
    listing = scan(tmp_path)
    assert newest(listing) == Found("hf", 10, str(tmp_path / "checkpoint-10"), True)


def test_tracker_that_is_a_directory_or_fifo(tmp_path: Path) -> None:
    (tmp_path / "latest").mkdir()
    os.mkfifo(tmp_path / "latest_checkpointed_iteration.txt")
    hf(tmp_path, 3)
    assert discover(tmp_path).step == 3  # type: ignore[union-attr]  # and no hang


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads unreadable dirs")
def test_unreadable_dirs(tmp_path: Path) -> None:
    dcp(tmp_path / "step-5")
    sub = tmp_path / "step-9"
    sub.mkdir()
    sub.chmod(0)
    try:
        listing = scan(tmp_path)
        assert newest(listing).step == 5  # type: ignore[union-attr]
        tmp_path.chmod(0)
        assert newest(scan(tmp_path)) is None
    finally:
        tmp_path.chmod(0o755)
        sub.chmod(0o755)


def test_permission_denied_is_a_problem_not_a_crash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # chmod cannot stop root (CI often runs as root): refuse through the OS call instead.
    dcp(tmp_path / "step-5")
    sdk(tmp_path, 9, range(2))
    real_scandir, real_stat = os.scandir, os.stat
    denied = str(tmp_path / "step-00000009")

    def scandir(path):  # type: ignore[no-untyped-def]
        if str(path) in (denied, str(tmp_path / "locked")):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    def stat_(path, *a, **kw):  # type: ignore[no-untyped-def]
        if str(path).startswith(denied):
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *a, **kw)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "stat", stat_)
    listing = scan(tmp_path)
    assert newest(listing, world_size=2).step == 5  # type: ignore[union-attr]
    assert any("Permission denied" in p for p in listing.problems)
    locked = scan(tmp_path / "locked")
    assert newest(locked) is None and "Permission denied" in locked.problems[0]


def test_entry_budget_is_respected(tmp_path: Path) -> None:
    for i in range(50):
        (tmp_path / f"junk-{i}").write_text("")
    listing = scan(tmp_path, max_entries=10)
    assert len(listing.files) <= 10
    assert any("stopped after 10" in p for p in listing.problems)
