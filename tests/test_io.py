"""Whole-or-nothing output (bayes_safe.io): a write that fails leaves nothing behind."""

import pytest

from bayes_safe.io import atomic_output_dir, atomic_write, atomic_write_text


def test_atomic_write_keeps_the_suffix_and_replaces_whole(tmp_path):
    target = tmp_path / "sub" / "figure.png"
    seen = []

    def write(tmp):
        seen.append(tmp.suffix)
        tmp.write_bytes(b"new")

    atomic_write(target, write)
    assert target.read_bytes() == b"new" and seen == [".png"]
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    assert sorted(p.name for p in target.parent.iterdir()) == ["figure.png"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "report.md"
    atomic_write_text(target, "old")

    def half_written(tmp):
        tmp.write_text("half")
        raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError, match="crash mid-write"):
        atomic_write(target, half_written)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]


def test_a_failed_run_adds_nothing_to_the_output_directory(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError), atomic_output_dir(out) as tmp:
        (tmp / "results.json").write_text("{}")
        raise ValueError("study crashed")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []
